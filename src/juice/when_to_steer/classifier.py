"""A first-step signal as a classifier: does it tell a passage that answers the question from one
that does not? (issue 77, "the gate as a classifier"; juice's measurement, not the paper's.)

The positives are the relevant passages: gold and conflicting (a conflicting passage states
another answer, but it is about the question, and it is the passage a user who trusts their
evidence wants read). The negatives are one wrong type at a time: irrelevant (another question's
passage) or distractor (a passage on the question's subject that does not answer it), and, where a
source builds its distractors more than one way, each way alone (`"distractor: bm25"`). Items
without a passage (context type "none") have no signal and take no part.

For each signal (:data:`juice.when_to_steer.signals.GATE_SIGNALS` and the bins' JSD,
:data:`~juice.when_to_steer.signals.SIGNAL`), source and wrong type:

- the **AUROC**: the probability that a random positive scores above a random negative, ties
  counting half (:func:`sklearn.metrics.roc_auc_score`); 0.5 is chance, below 0.5 the signal runs
  the other way. Its 95% interval is the percentile bootstrap over whole questions, resampled
  within each source (a question's gold, conflicting and wrong passages stay together), as
  :mod:`juice.eval.stats` does for accuracies;
- a **reliability curve**: the signal cut at its quantiles into bins, and per bin the share of
  positives among that bin's items (with n), which shows where on the signal a threshold would
  separate them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from juice.data.context_types import CONTEXT_TYPES, RELEVANT_TYPES, ContextItem
from juice.eval.stats import MIN_RESAMPLES, Interval
from juice.extras import require

WRONG = tuple(t for t in CONTEXT_TYPES if t not in RELEVANT_TYPES and t != "none")
"""The context types whose passage does not answer the question (the negatives, one type at a
time): irrelevant, distractor; the positives are :data:`juice.data.context_types.RELEVANT_TYPES`."""

POOLED = "all"
"""The source label of the cells pooled over every source given (resampled within each)."""


@dataclass(frozen=True)
class AurocCell:
    """One signal's AUROC for one source and wrong type.

    Attributes:
        signal: the signal's name.
        source: the items' source (a ParaConflict domain, NQ-Swap's label) or :data:`POOLED`.
        wrong: the negatives' type: "irrelevant", "distractor", or "distractor: <variant>".
        auroc: the AUROC with its interval (`n`: distinct questions with a positive or a negative).
        positives, negatives: items on each side.
    """

    signal: str
    source: str
    wrong: str
    auroc: Interval
    positives: int
    negatives: int

    def to_json(self) -> dict:
        return {"signal": self.signal, "source": self.source, "wrong": self.wrong, "auroc": self.auroc.to_json(),
                "positives": self.positives, "negatives": self.negatives}


@dataclass(frozen=True)
class ReliabilityBin:
    """One quantile bin of a signal: its bounds, its items and the share of positives among them."""

    low: float
    high: float
    n: int
    positive_share: float

    def to_json(self) -> dict:
        return {"low": self.low, "high": self.high, "n": self.n, "positive_share": self.positive_share}


def sides(items: Sequence[ContextItem], wrong: str) -> tuple[np.ndarray, np.ndarray]:
    """`[n]` bool masks: the positives, and the negatives of `wrong` ("distractor: bm25" keeps
    that variant only)."""
    kind, _, variant = wrong.partition(": ")
    positive = np.array([i.context_type in RELEVANT_TYPES for i in items])
    negative = np.array([i.context_type == kind and (not variant or i.variant == variant) for i in items])
    return positive, negative


def _question_ids(items: Sequence[ContextItem]) -> tuple[np.ndarray, np.ndarray]:
    """Per item, its question's index and that question's source's index (`[n]` ints each)."""
    questions: dict[tuple[str, str], int] = {}
    sources: dict[str, int] = {}
    q = np.array([questions.setdefault((i.source, i.uid), len(questions)) for i in items], dtype=np.int64)
    s = np.array([sources.setdefault(i.source, len(sources)) for i in items], dtype=np.int64)
    return q, s


def weighted_auroc(values: np.ndarray, positive: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The AUROC of `values` for the `positive` items against the others under each row of
    `weights`: the weighted share of (positive, negative) pairs the positive wins, ties counting
    half (the Mann-Whitney form of the area under the ROC curve; equal to scikit-learn's
    `roc_auc_score(positive, values, sample_weight=w)`, which integrates the same curve, up to
    float rounding: tests/unit/test_classifier.py). One pass over the sorted values for all rows.

    Args:
        values: `[n]` the signal per item.
        positive: `[n]` bool.
        weights: `[rows, n]` each row's item weights (each row with some positive and some
            negative weight).

    Returns:
        `[rows]` the AUROC per row.
    """
    _, group = np.unique(values, return_inverse=True)      # tied values share a group, in ascending order
    groups = group.max() + 1 if len(group) else 0
    pos_w = np.zeros((len(weights), groups))
    neg_w = np.zeros((len(weights), groups))
    np.add.at(pos_w.T, group[positive], weights[:, positive].T)
    np.add.at(neg_w.T, group[~positive], weights[:, ~positive].T)
    below = np.cumsum(neg_w, axis=1) - neg_w              # negative weight strictly below each group
    wins = (pos_w * (below + 0.5 * neg_w)).sum(axis=1)
    return wins / (pos_w.sum(axis=1) * neg_w.sum(axis=1))


def auroc_interval(values: Sequence[float], positive: Sequence[bool], negative: Sequence[bool],
                   questions: Sequence[int], strata: Sequence[int] | None = None, *, resamples: int = 2000,
                   confidence: float = 0.95, seed: int = 0) -> Interval:
    """The AUROC of `values` for `positive` against `negative` items, with the percentile bootstrap
    interval over whole questions (resampled within each stratum).

    Args:
        values: `[n]` the signal per item (higher: more likely a positive).
        positive, negative: `[n]` bool masks (an item on neither side takes no part).
        questions: `[n]` each item's question (items of one question are drawn together).
        strata: `[n]` each item's stratum (source); None: one.

    Returns:
        The AUROC (mean), its bounds, and n = the distinct questions with an item on either side;
        all NaN (n = 0) without a positive or a negative.

    Raises:
        ValueError: arrays of different lengths, fewer than 1,000 resamples, a confidence outside (0, 1).
    """
    require("study", "a signal's AUROC")
    from sklearn.metrics import roc_auc_score

    x = np.asarray(values, dtype=np.float64)
    pos, neg = np.asarray(positive, dtype=bool), np.asarray(negative, dtype=bool)
    q = np.asarray(questions, dtype=np.int64)
    st = np.zeros_like(q) if strata is None else np.asarray(strata, dtype=np.int64)
    if not (len(x) == len(pos) == len(neg) == len(q) == len(st)):
        raise ValueError("one value, side, question and stratum per item")
    if resamples < MIN_RESAMPLES or not 0 < confidence < 1:
        raise ValueError(f"the bootstrap needs at least {MIN_RESAMPLES:,} resamples and a confidence in (0, 1)")
    keep = pos | neg
    x, pos, q, st = x[keep], pos[keep], q[keep], st[keep]
    if not pos.any() or pos.all():
        return Interval(math.nan, math.nan, math.nan, len(np.unique(q)))
    labels = pos.astype(int)
    point = float(roc_auc_score(labels, x))
    ids, q = np.unique(q, return_inverse=True)            # questions 0..m-1
    q_stratum = np.zeros(len(ids), dtype=np.int64)
    q_stratum[q] = st
    by_stratum = [np.flatnonzero(q_stratum == s) for s in np.unique(q_stratum)]
    rng = np.random.default_rng(seed)
    counts = np.zeros((resamples, len(ids)))
    for r in range(resamples):
        for mine in by_stratum:                            # draw each stratum's questions from itself
            np.add.at(counts[r], rng.choice(mine, size=len(mine)), 1.0)
    weights = counts[:, q]                                 # [resamples, items]
    kept = (weights[:, pos].sum(axis=1) > 0) & (weights[:, ~pos].sum(axis=1) > 0)
    draws = weighted_auroc(x, pos, weights[kept])
    tail = (1 - confidence) / 2
    low, high = np.quantile(draws, [tail, 1 - tail])
    return Interval(point, float(low), float(high), len(ids))


def reliability(values: Sequence[float], positive: Sequence[bool], *, bins: int = 5) -> list[ReliabilityBin]:
    """The signal cut at its quantiles into at most `bins` bins (equal values stay in one bin), and
    per bin the share of positives among its items.

    Args:
        values: `[n]` the signal per item (positives and the negatives of one wrong type).
        positive: `[n]` whether each item is a positive.

    Raises:
        ValueError: arrays of different lengths, or fewer than one bin.
    """
    x, pos = np.asarray(values, dtype=np.float64), np.asarray(positive, dtype=bool)
    if len(x) != len(pos) or bins < 1:
        raise ValueError("one side per value, and at least one bin")
    if not len(x):
        return []
    edges = np.unique(np.quantile(x, np.linspace(0, 1, bins + 1)))
    which = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, max(len(edges) - 2, 0))
    out = []
    for b in range(max(len(edges) - 1, 1)):
        mine = which == b
        if mine.any():
            out.append(ReliabilityBin(float(x[mine].min()), float(x[mine].max()), int(mine.sum()),
                                      float(pos[mine].mean())))
    return out


def wrong_types(items: Sequence[ContextItem]) -> list[str]:
    """The negatives' types these items hold: each of :data:`WRONG` present, and each distractor
    variant alone where there is more than one."""
    out = [w for w in WRONG if any(i.context_type == w for i in items)]
    variants = sorted({i.variant for i in items if i.context_type == "distractor" and i.variant})
    return out + ([f"distractor: {v}" for v in variants] if len(variants) > 1 else [])


def auroc_table(items: Sequence[ContextItem], values: Mapping[str, Sequence[float]], *, resamples: int = 2000,
                seed: int = 0) -> list[AurocCell]:
    """Every signal's AUROC per source and wrong type (:func:`wrong_types`), and pooled over the
    sources (:data:`POOLED`, resampled within each) where there is more than one.

    Args:
        items: the context items (every type; "none" items take no part).
        values: signal name -> `[len(items)]` its value per item.

    Raises:
        ValueError: a signal without one value per item.
    """
    items = list(items)
    q, s = _question_ids(items)
    sources = list(dict.fromkeys(i.source for i in items))
    groups = [(src, np.array([i.source == src for i in items])) for src in sources]
    if len(sources) > 1:
        groups.append((POOLED, np.ones(len(items), dtype=bool)))
    cells = []
    for signal, v in values.items():
        v = np.asarray(v, dtype=np.float64)
        if len(v) != len(items):
            raise ValueError(f"{signal}: {len(v)} values for {len(items)} items")
        for source, mine in groups:
            picked = [i for i, m in zip(items, mine) if m]
            for wrong in wrong_types(picked):
                pos, neg = sides(picked, wrong)
                if not pos.any() or not neg.any():
                    continue
                iv = auroc_interval(v[mine], pos, neg, q[mine], s[mine], resamples=resamples, seed=seed)
                cells.append(AurocCell(signal, source, wrong, iv, int(pos.sum()), int(neg.sum())))
    return cells


def reliability_curves(items: Sequence[ContextItem], values: Mapping[str, Sequence[float]], *, bins: int = 5
                       ) -> dict[str, dict[str, list[ReliabilityBin]]]:
    """Every signal's :func:`reliability` over all `items` (pooled over their sources), per wrong
    type (:func:`wrong_types`): signal -> wrong type -> bins.

    Raises:
        ValueError: a signal without one value per item.
    """
    items = list(items)
    out: dict[str, dict[str, list[ReliabilityBin]]] = {}
    for signal, v in values.items():
        v = np.asarray(v, dtype=np.float64)
        if len(v) != len(items):
            raise ValueError(f"{signal}: {len(v)} values for {len(items)} items")
        for wrong in wrong_types(items):
            pos, neg = sides(items, wrong)
            keep = pos | neg
            out.setdefault(signal, {})[wrong] = reliability(v[keep], pos[keep], bins=bins)
    return out


def reliability_figure(curves: Mapping[str, Mapping[str, Mapping[str, Sequence[Mapping[str, float]]]]],
                       path: str | Path, title: str = "") -> Path:
    """The calibration curves of the signals as a PNG (needs matplotlib): one row per dataset, one
    panel per wrong type; in each, every signal's share of answering passages (gold, conflicting)
    per quantile bin, drawn at the bin's middle quantile (0: the signal's lowest values, 1: its
    highest), and the share over all bins as a dashed line. A signal that tells the passages apart
    climbs from 0 to 1; one at chance stays on the dashed line.

    Args:
        curves: dataset -> signal -> wrong type -> its bins (:meth:`ReliabilityBin.to_json`, as
            :func:`reliability_curves` gives them).
    """
    from matplotlib.figure import Figure

    from juice.plots import save_png

    wrongs = list(dict.fromkeys(w for per in curves.values() for by in per.values() for w in by))
    fig = Figure(figsize=(4.6 * len(wrongs), 3.8 * len(curves)))
    axes = fig.subplots(len(curves), len(wrongs), squeeze=False)
    for row, (dataset, per) in zip(axes, curves.items()):
        for ax, wrong in zip(row, wrongs):
            base = None
            for signal, by in per.items():
                bins = by.get(wrong) or []
                total = sum(b["n"] for b in bins)
                if not total:
                    continue
                seen, xs = 0, []
                for b in bins:
                    xs.append((seen + b["n"] / 2) / total)
                    seen += b["n"]
                ax.plot(xs, [b["positive_share"] for b in bins], marker="o", markersize=3, label=signal)
                base = sum(b["n"] * b["positive_share"] for b in bins) / total
            if base is not None:
                ax.axhline(base, color="grey", linestyle="--", linewidth=1)
            ax.set_xlim(0, 1)
            ax.set_ylim(-0.02, 1.02)
            ax.set_xlabel("the signal's quantile (bin middle)")
            ax.set_ylabel("share of answering passages")
            ax.set_title(f"{dataset}: against {wrong}", fontsize=9)
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:   # a panel without bins has nothing to name
                ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return save_png(fig, path)


__all__ = ["POOLED", "WRONG", "AurocCell", "ReliabilityBin", "auroc_interval", "auroc_table",
           "reliability", "reliability_curves", "reliability_figure", "sides", "wrong_types"]
