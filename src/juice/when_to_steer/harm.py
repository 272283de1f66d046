"""Do no harm: what each method does with a passage that does not answer the question, beside how
well it uses one that does (issue 77, item 3; juice's measurement, not the paper's). It reads a
study's outcomes (:class:`juice.when_to_steer.outcomes.Outcomes`) only, no model.

**The do-no-harm table** (:func:`harm_table`): per method,

- *uses relevant passages*: use relevant context on gold and conflicting passages (the passage's
  answer), the mean over those two types;
- for each misleading kind (irrelevant, distractor) and for no passage, split by whether the
  model **knows** the question's answer closed-book (the unmodified model on the question alone
  states the true answer, :meth:`~juice.when_to_steer.outcomes.Outcomes.known`): the share of
  outputs that **state the true answer** (for a known question, the model's own closed-book
  answer; an output may state the passage's answer too), that **copy the passage's answer**
  without the true one, and that state **neither** (another answer, or none: these models do not
  abstain in words, so "neither" holds abstentions and other answers); the three add to 100;
- *keeps known answers*: on known questions, the share stating the true answer under a misleading
  passage (mean over irrelevant and distractor): 100 minus the harm the passages do.

Every share has a 95% percentile interval over whole questions resampled within sources
(:func:`juice.when_to_steer.evaluation.question_bootstrap`). The verdicts, fixed here before any
number is read: a method **does no measurable harm** where the interval of *keeps known answers*
reaches 100 (no harm is inside it); it **uses relevant passages** where its use of them is not
below the unmodified model's (the paired interval of the difference reaches 0 or above). (The
second rule first compared with the question alone, which cannot state a passage's answer, so
every method passed it; it was replaced by the comparison with Original when the first record
showed that, before any page quoted it. The first rule is unchanged.)

**Risk-coverage** (:func:`risk_coverage`): a gate on a passage signal (by default the share of the
question's words in the passage, the signal that separates relevant passages best,
:mod:`juice.when_to_steer.classifier`) sends a request whose passage scores below a threshold to
the question alone, and the rest to the method. Over the thresholds, *coverage* is the share of
requests with a passage that the method answers with it, *risk* the share of those it gets wrong
(use relevant context), *accuracy* the share right over every request with a passage; items
without a passage take no part. `auto`'s curve is its fitted bins under the same gate
(:func:`auto_bins`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from juice.eval.stats import Interval
from juice.methods import UNSTEERED, row_title
from juice.when_to_steer.evaluation import MEAN, QUESTION_ONLY, question_bootstrap
from juice.when_to_steer.outcomes import Outcomes
from juice.when_to_steer.signals import RELEVANCE

MISLEADING = ("irrelevant", "distractor")
"""Passages that do not answer the question."""

RELEVANT = ("gold", "conflicting")
"""Passages that do."""

OUTPUTS = ("copies", "true", "neither")
"""What an output does under a passage that does not answer: copies the passage's answer (and
states no true answer), states the true answer (whether or not it also states the passage's),
states neither."""

ORIGINAL = UNSTEERED
"""The unmodified model's row key: the reference for using relevant passages."""

KEEPS = "keeps known answers"
USES = "uses relevant passages"


def _bootstrap(o: Outcomes, keep: Sequence[bool], methods: Sequence[str], values: Mapping[str, Sequence[bool]],
               pairs=(), resamples: int = 2000, seed: int = 0):
    part = o.select(keep)
    if not len(part):
        return None
    mine = {m: [v for v, k in zip(values[m], keep) if k] for m in values}
    return question_bootstrap(part.results("use", methods, mine), methods, pairs, resamples=resamples, seed=seed)


def harm_table(o: Outcomes, methods: Sequence[str], *, resamples: int = 2000, seed: int = 0) -> dict[str, Any]:
    """The do-no-harm table (module docstring) of `methods` (row keys of `o`) on `o` (one half, or both).

    Returns:
        {"known_questions": n, "questions": n, "rows": {method's title: {USES: interval, KEEPS: interval,
        "<type>, known" / "<type>, not known": {output: interval}}}, "verdicts": {method:
        {"no measurable harm": bool, "uses relevant passages": bool}}} (intervals as fractions,
        :meth:`juice.eval.stats.Interval.to_json`; n = distinct questions): a record's part,
        methods by title (:func:`juice.methods.row_title`).

    Raises:
        KeyError: a method `o` does not hold, or no Question-only.
    """
    known = o.known()
    copies, true = o.verdicts["copies"], o.verdicts["true"]
    only = {m: [c and not t for c, t in zip(copies[m], true[m])] for m in methods}   # an output may state both
    neither = {m: [not c and not t for c, t in zip(copies[m], true[m])] for m in methods}
    kinds = {"copies": only, "true": true, "neither": neither}
    rows: dict[str, dict[str, Any]] = {m: {} for m in methods}
    relevant = [t in RELEVANT for t in o.context_type]
    with_original = [*methods, ORIGINAL] if ORIGINAL not in methods else list(methods)
    # each method's use of relevant passages, and its gap to Original's
    versus = _bootstrap(o, relevant, with_original, {m: o.verdicts["use"][m] for m in with_original},
                        [(m, ORIGINAL) for m in methods if m != ORIGINAL], resamples=resamples, seed=seed)
    keeps = _bootstrap(o, [t in MISLEADING and k for t, k in zip(o.context_type, known)], methods,
                       {m: true[m] for m in methods}, resamples=resamples, seed=seed)
    verdicts = {}
    for m in methods:
        if versus is not None:
            rows[m][USES] = versus.cells[m][MEAN]
        if keeps is not None:
            rows[m][KEEPS] = keeps.cells[m][MEAN]
        if versus is None:
            uses = False
        else:
            gap = versus.differences[f"{m} - {ORIGINAL}"][MEAN] if m != ORIGINAL else None
            uses = gap is None or gap.high >= 0
        verdicts[m] = {"no measurable harm": bool(keeps is not None and keeps.cells[m][MEAN].high >= 1.0 - 1e-12),
                       "uses relevant passages": bool(uses)}
    for t in (*MISLEADING, "none"):
        for is_known in (True, False):
            mask = [tt == t and k == is_known for tt, k in zip(o.context_type, known)]
            label = f"{t}, {'known' if is_known else 'not known'}"
            for output, values in kinds.items():
                boot = _bootstrap(o, mask, methods, {m: values[m] for m in methods}, resamples=resamples, seed=seed)
                if boot is None:
                    continue
                for m in methods:
                    rows[m].setdefault(label, {})[output] = boot.cells[m][t]
    return {"questions": len(set(o.questions())),
            "known_questions": len({q for q, k in zip(o.questions(), known) if k}),
            "rows": {row_title(m): {k: (v.to_json() if isinstance(v, Interval) else
                                        {o_: iv.to_json() for o_, iv in v.items()}) for k, v in r.items()}
                     for m, r in rows.items()},
            "verdicts": {row_title(m): v for m, v in verdicts.items()}}


def harm_markdown(table: Mapping[str, Any]) -> str:
    """The do-no-harm table as Markdown: per method, its use of relevant passages, the share of
    known answers kept under misleading passages, and per misleading type on known questions the
    shares that copy the passage / state the true answer / state neither (%, [95% interval])."""

    def pct(iv: Mapping[str, Any] | None) -> str:
        return "-" if iv is None or math.isnan(iv["mean"]) else \
            f"{100 * iv['mean']:.1f} [{100 * iv['low']:.1f}, {100 * iv['high']:.1f}]"

    head = ["Method", USES, KEEPS, *[f"{t}, known: copies / true / neither" for t in MISLEADING], "verdict"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m, r in table["rows"].items():
        cells = [pct(r.get(USES)), pct(r.get(KEEPS))]
        for t in MISLEADING:
            part = r.get(f"{t}, known", {})
            cells.append(" / ".join(f"{100 * part[o]['mean']:.0f}" if o in part else "-" for o in OUTPUTS))
        v = table["verdicts"][m]
        verdict = ", ".join([("no measurable harm" if v["no measurable harm"] else "harms"),
                             ("uses relevant passages" if v["uses relevant passages"] else "below Original on relevant passages")])
        lines.append(f"| {m} | " + " | ".join(cells) + f" | {verdict} |")
    return "\n".join(lines) + (f"\n\n{table['known_questions']} of {table['questions']} questions known closed-book; "
                               "n per cell: distinct questions.\n")


def risk_coverage(o: Outcomes, verdicts: Sequence[bool], *, gate: str = RELEVANCE, points: int = 11
                  ) -> list[dict[str, float]]:
    """The risk-coverage curve (module docstring) of a method's use-relevant `verdicts` (per item
    of `o`) under a gate on `o.gates[gate]`: one point per threshold, from answering every request
    with a passage (coverage 1) to none (coverage 0), thresholds at `points` quantiles of the
    signal over the requests with a passage.

    Returns:
        per threshold: {"threshold", "coverage", "risk" (nan at coverage 0), "accuracy"} (fractions).
    """
    has = np.array(o.passage, dtype=bool)
    x = np.array(o.gates[gate], dtype=float)[has]
    mine = np.array(verdicts, dtype=bool)[has]
    alone = np.array(o.verdicts["use"][QUESTION_ONLY], dtype=bool)[has]
    if not has.any():
        return []
    cuts = sorted({-math.inf, *np.quantile(x, np.linspace(0, 1, points)).tolist(), math.inf})
    out = []
    for t in cuts:
        covered = x >= t
        routed = np.where(covered, mine, alone)
        out.append({"threshold": float(t), "coverage": float(covered.mean()),
                    "risk": float(1 - mine[covered].mean()) if covered.any() else math.nan,
                    "accuracy": float(routed.mean())})
    return out


def auto_bins(o: Outcomes, policy) -> list[bool]:
    """`auto`'s use-relevant verdicts per item of `o` with `policy`'s bins and no gate (the
    risk-coverage curve puts its own gate in front): Original without a passage."""
    from dataclasses import replace

    from juice.when_to_steer.auto_tuning import policy_picks

    picks = policy_picks(replace(policy, relevance=None), o.signal, o.passage, o.gates)
    return [bool(o.verdicts["use"][o.candidates[c]][k]) for k, c in enumerate(picks)]


def area_under(curve: Sequence[Mapping[str, float]]) -> float:
    """The area under a risk-coverage curve (trapezoids over coverage; the lower, the better)."""
    pts = sorted((p["coverage"], p["risk"]) for p in curve if p["coverage"] > 0 and not math.isnan(p["risk"]))
    if len(pts) < 2:
        return math.nan
    return float(sum((c2 - c1) * (r1 + r2) / 2 for (c1, r1), (c2, r2) in zip(pts, pts[1:])))


def risk_coverage_figure(curves: Mapping[str, Mapping[str, Sequence[Mapping[str, float]]]], path: str | Path,
                         title: str = "") -> Path:
    """One panel per dataset: each method's risk against coverage (fractions); needs matplotlib.

    Args:
        curves: dataset -> method -> its :func:`risk_coverage` points.
    """
    from matplotlib.figure import Figure

    from juice.plots import save_png

    fig = Figure(figsize=(5.2 * len(curves), 4.2))
    axes = fig.subplots(1, len(curves), squeeze=False)[0]
    for ax, (dataset, per) in zip(axes, curves.items()):
        for method, pts in per.items():
            pts = sorted((p for p in pts if p["coverage"] > 0), key=lambda p: p["coverage"])
            ax.plot([p["coverage"] for p in pts], [p["risk"] for p in pts], marker="o", markersize=3, label=method,
                    linewidth=2.2 if method.startswith("auto") else 1.2)
        ax.set_xlabel("coverage: share of requests answered with their passage")
        ax.set_ylabel("risk: share of those wrong (use relevant context)")
        ax.set_title(dataset, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return save_png(fig, path)


__all__ = ["KEEPS", "MISLEADING", "OUTPUTS", "RELEVANT", "USES", "area_under", "auto_bins", "harm_markdown",
           "harm_table", "risk_coverage", "risk_coverage_figure"]
