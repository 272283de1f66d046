"""The when-to-steer study's pre-registered analysis: `auto` minus the best static method as an
estimate with its interval, in every design, from the decoded outcomes alone (issue 77, item 4;
juice's measurement, not the paper's).

What it compares is fixed here, before any outcome is read (:data:`PLAN`; its SHA-256 goes into
the record beside the numbers). Amended once, after the first analysis of ParaConflict's
published-size outcomes: the Prompt baseline toward memory joined `auto`'s candidates (SHA-256
`799b3312679c8357...` -> `33339366fe962b8a...`); the plan without it is the record's sensitivity
analysis (docs/when-to-steer.md, "The study at the published size"):

- the **policies**: every static method the study decoded (the best static method is chosen
  among them, on the training items of each design, by the objective below) and the `auto`
  fitting procedures of :data:`PLAN` (`auto`: every gate signal tried, as `juice tune` fits it;
  with no gate; with each gate signal alone), each choosing among the plan's candidates that
  the study decoded (:data:`juice.when_to_steer.auto.CANDIDATES`: the Prompt baseline toward
  memory among them, as issue 77 asked; outcomes written before it was a candidate decoded it
  as a static method, and :func:`with_candidates` lists it). Each fit searches its grid
  (:func:`juice.when_to_steer.auto_tuning.fit_policy`) on the training items only, so every
  estimate below includes that search;
- the **objective**: use relevant context, the mean over context types of the accuracy averaged
  over sources (:func:`juice.when_to_steer.auto_tuning.objective_weights`);
- the **estimate**: per design and procedure, the held-out mean of `auto` minus that of the best
  static method chosen on the same training items, paired by item, with a 95% percentile
  interval over whole questions resampled within sources
  (:func:`juice.when_to_steer.evaluation.question_bootstrap`, 2,000 resamples, seed 0) and its
  standard error. It is reported as measured whatever its sign; the **primary** estimate is
  `auto` (every gate) against the best static method;
- the **designs**: fit on the validation half, scored on the test half; 5-fold cross-validation
  grouped by question over both halves; leaving one source out over both halves (ParaConflict's
  domains; none for a single source); across datasets (fit on every item of one, scored on every
  item of the other; both ways).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from juice.methods import row_title
from juice.when_to_steer.auto import CANDIDATE, CANDIDATES
from juice.when_to_steer.auto_tuning import best_static_name, cross_validate, fit_policy, policy_picks
from juice.when_to_steer.evaluation import MEAN, POWER_Z, question_bootstrap
from juice.when_to_steer.outcomes import Outcomes
from juice.when_to_steer.signals import GATE_SIGNALS

PRIMARY = "auto"
"""The primary procedure: the policy fitted with every gate signal tried (`juice tune`'s fit)."""


@dataclass(frozen=True)
class Plan:
    """What the analysis compares, fixed before it runs (module docstring).

    Attributes:
        procedures: `auto` fitting procedure -> the gate signals its fit may use (() : no gate).
        candidates: `auto`'s candidates, those of them the study decoded.
        designs: the designs, in report order.
        folds: the cross-validation's folds; resamples, seed: the bootstrap's.
        objective: the objective's name; max_policies: at most this many policies compared
            (static methods and procedures).
    """

    procedures: dict[str, tuple[str, ...]] = field(default_factory=lambda: {
        PRIMARY: tuple(GATE_SIGNALS), "auto, no gate": (),
        **{f"auto, gate on {name} only": (name,) for name in GATE_SIGNALS}})
    candidates: tuple[str, ...] = CANDIDATES
    designs: tuple[str, ...] = ("validation -> test", "5-fold by question", "leave one source out",
                                "across datasets")
    folds: int = 5
    resamples: int = 2000
    seed: int = 0
    objective: str = "use relevant context: mean over context types of the accuracy averaged over sources"
    max_policies: int = 50

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["procedures"] = {k: list(v) for k, v in self.procedures.items()}
        out["designs"] = list(self.designs)
        out["candidates"] = list(self.candidates)
        out["primary"] = PRIMARY
        return out

    def digest(self) -> str:
        """SHA-256 (hex) of the plan as sorted JSON: the record says which plan its numbers follow."""
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()


PLAN = Plan()
"""The study's pre-registered plan."""


def with_candidates(o: Outcomes, plan: "Plan" = PLAN) -> Outcomes:
    """`o` with auto's candidates restricted to the plan's, and with each planned candidate that
    `o` decoded as a static method but does not list as a candidate (outcomes written before it
    was one): one whose row does not depend on the heads file's direction ("prompt-mem";
    :meth:`juice.when_to_steer.auto.Candidate.key`)."""
    listed = {c: m for c, m in o.candidates.items() if c in plan.candidates}
    for name in plan.candidates:
        c = CANDIDATE[name]
        key = c.key("")
        if name not in listed and c.instruction is not None and key in o.verdicts["use"]:
            listed[name] = key
    return replace(o, candidates={c: listed[c] for c in CANDIDATES if c in listed})


def _candidate_verdicts(o: Outcomes, kind: str = "use") -> dict[str, list[bool]]:
    return {c: o.verdicts[kind][m] for c, m in o.candidates.items()}


def best_static(o: Outcomes) -> str:
    """The static method (its row key) with the highest objective on `o` (ties: the earlier in `o.static`)."""
    return best_static_name({m: o.verdicts["use"][m] for m in o.static}, o.context_type, o.source)


def fit(train: Outcomes, gates: Sequence[str]):
    """The policy fitted on `train` with the gate signals `gates` (() : no gate), as `juice tune`
    fits it (:func:`juice.when_to_steer.auto_tuning.fit_policy`): an
    :class:`~juice.when_to_steer.auto_tuning.AutoFit`.

    Raises:
        ValueError: see :func:`juice.when_to_steer.auto_tuning.fit_policy`.
    """
    return fit_policy(_candidate_verdicts(train), train.signal, train.context_type, train.source, train.betas,
                      train.passage, _candidate_verdicts(train, "degenerate"),
                      relevance={g: train.gates[g] for g in gates} or None)


def routed(o: Outcomes, policy) -> dict[str, list[bool]]:
    """Every verdict kind (:data:`juice.when_to_steer.outcomes.VERDICTS`) of `policy` on `o`'s
    items: per item, its picked candidate's (auto decodes exactly the candidate it picks)."""
    picks = policy_picks(policy, o.signal, o.passage, o.gates)
    return {kind: [bool(per[o.candidates[c]][k]) for k, c in enumerate(picks)] for kind, per in o.verdicts.items()}


def fit_and_route(train: Outcomes, held: Outcomes, gates: Sequence[str]) -> tuple[list[bool], str, list[bool]]:
    """The procedure fitted on `train` (gate signals `gates`), routed on `held`: (per held item,
    auto's verdict; the best static method chosen on `train`; per held item, its verdict).

    Raises:
        ValueError: see :func:`juice.when_to_steer.auto_tuning.fit_policy`.
    """
    policy = fit(train, gates).policy
    name = best_static(train)
    return routed(held, policy)["use"], name, list(held.verdicts["use"][name])


def paired_estimate(held: Outcomes, auto: Sequence[bool], best: Sequence[bool], *, resamples: int, seed: int
                    ) -> dict[str, Any]:
    """auto's and the best static method's held-out means (percent), their paired difference with
    its 95% interval over questions and standard error, and n (distinct questions)."""
    rows = held.results("use", ["auto", "best_static"], {"auto": auto, "best_static": best})
    boot = question_bootstrap(rows, ["auto", "best_static"], [("auto", "best_static")], resamples=resamples,
                              seed=seed)
    diff = boot.differences["auto - best_static"][MEAN]
    return {"auto": round(100 * boot.cells["auto"][MEAN].mean, 2),
            "best_static_mean": round(100 * boot.cells["best_static"][MEAN].mean, 2),
            "difference": round(100 * diff.mean, 2), "low": round(100 * diff.low, 2),
            "high": round(100 * diff.high, 2),
            "standard_error": round(100 * boot.detectable["auto - best_static"] / POWER_Z, 2),
            "questions": len(set(held.questions()))}


def analyze(datasets: Mapping[str, Outcomes], plan: Plan = PLAN) -> dict[str, Any]:
    """Every estimate of `plan` (module docstring) on each dataset's outcomes (both halves), and
    across each ordered pair of datasets.

    Returns:
        {"plan": plan, "plan_sha256": ..., "estimates": [one dict per (dataset, design,
        procedure): "dataset" (for across datasets: "A -> B"), "design", "procedure",
        "best_static" (the title, or per fold the titles), and :func:`paired_estimate`'s fields]}.

    Raises:
        ValueError: more policies than `plan.max_policies`.
    """
    estimates = []
    datasets = {name: with_candidates(o, plan) for name, o in datasets.items()}

    def add(dataset: str, design: str, procedure: str, held: Outcomes, auto, best, chosen) -> None:
        chosen = row_title(chosen) if isinstance(chosen, str) else [row_title(m) for m in chosen]
        estimates.append({"dataset": dataset, "design": design, "procedure": procedure, "best_static": chosen,
                          **paired_estimate(held, auto, best, resamples=plan.resamples, seed=plan.seed)})

    for dataset, o in datasets.items():
        if len(o.static) + len(plan.procedures) > plan.max_policies:
            raise ValueError(f"{dataset}: {len(o.static) + len(plan.procedures)} policies, more than the plan's "
                             f"{plan.max_policies}")
        train, held = o.where(half="validation"), o.where(half="test")
        schemes = {"5-fold by question": (o.questions(), plan.folds)}
        if len(set(o.source)) > 1:
            schemes["leave one source out"] = (o.source, 0)
        for procedure, gates in plan.procedures.items():
            if "validation -> test" in plan.designs and len(train) and len(held):
                auto, chosen, best = fit_and_route(train, held, gates)
                add(dataset, "validation -> test", procedure, held, auto, best, chosen)
            for design, (groups, folds) in schemes.items():
                if design not in plan.designs:
                    continue
                cv = cross_validate(_candidate_verdicts(o), {m: o.verdicts["use"][m] for m in o.static}, o.signal,
                                    o.context_type, o.source, groups, o.betas, passage=o.passage,
                                    degenerate=_candidate_verdicts(o, "degenerate"),
                                    relevance={g: o.gates[g] for g in gates} or None, folds=folds, seed=plan.seed)
                add(dataset, design, procedure, o, cv["auto"], cv["best_static"], cv["chosen"])
    if "across datasets" in plan.designs:
        for a, oa in datasets.items():
            for b, ob in datasets.items():
                if a == b:
                    continue
                for procedure, gates in plan.procedures.items():
                    auto, chosen, best = fit_and_route(oa, ob, gates)
                    add(f"{a} -> {b}", "across datasets", procedure, ob, auto, best, chosen)
    return {"plan": plan.to_json(), "plan_sha256": plan.digest(), "estimates": estimates}


SHORT_SIGNALS = {"question_words_in_passage": "lexical share", "confidence_gain": "confidence gain",
                 "context_peakedness": "peakedness"}
"""The gate signals' names in the tables."""


def estimate_markdown(analysis: Mapping[str, Any], names: Mapping[str, str] | None = None) -> str:
    """The estimates as one Markdown table per design (rows: dataset, by its name in `names` where
    it has one, and procedure, "gate: <signal> only" for `auto, gate on <signal> only`), the
    primary procedure in bold."""
    names = dict(names or {})
    lines = []
    for design in analysis["plan"]["designs"]:
        rows = [e for e in analysis["estimates"] if e["design"] == design]
        if not rows:
            continue
        lines += [f"**{design}**", "", "| dataset | procedure | auto | best static | auto - best static | n |",
                  "|---|---|---|---|---|---|"]
        for e in rows:
            chosen = e["best_static"] if isinstance(e["best_static"], str) else ", ".join(sorted(set(e["best_static"])))
            short = e["procedure"]
            for signal, label in SHORT_SIGNALS.items():
                short = short.replace(f"auto, gate on {signal} only", f"gate: {label} only")
            name = f"**{short}**" if e["procedure"] == analysis["plan"]["primary"] else short
            dataset = " -> ".join(names.get(d, d) for d in e["dataset"].split(" -> "))
            lines.append(f"| {dataset} | {name} | {e['auto']:.1f} | {chosen} {e['best_static_mean']:.1f} | "
                         f"{e['difference']:+.1f} [{e['low']:+.1f}, {e['high']:+.1f}] | {e['questions']} |")
        lines.append("")
    return "\n".join(lines)


__all__ = ["PLAN", "PRIMARY", "Plan", "analyze", "best_static", "estimate_markdown", "fit", "fit_and_route", "with_candidates",
           "paired_estimate", "routed"]
