"""Tuning `auto` on validation items (`juice tune --methods auto`): the policy's fit, its
cross-validation against the best static method, and the verdicts and request features both read
(issue 35, part 2; juice's own method, not the paper's). The policy itself, what the engine runs
per request, is :mod:`juice.when_to_steer.auto`.

Tuning (:func:`tune_auto`) reads validation items only: each candidate is decoded on the
validation items of every context type (:mod:`juice.data.context_types`), the signal is computed
for each, and the thresholds (from the signal's quantiles) and the candidate per bin are chosen to
maximize the **use relevant context** objective (gold and conflicting: the context's answer;
irrelevant and none: the memory answer), averaged over the context types, ties going to fewer bins
and to the less steered candidate. A candidate whose share of degenerate validation outputs
(:mod:`juice.eval.degeneration`) exceeds Original's by more than
:data:`juice.tuned.DEGENERATION_MARGIN` points is never chosen (`juice tune`'s rule). The result
is written to the heads file (`tuned["auto"]`) like the betas.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from juice.when_to_steer.auto import (CANDIDATE_TABLE, CANDIDATES, MAX_THRESHOLDS, NO_PASSAGE, THRESHOLD_GRID, UNSTEERED,
                                      AutoPolicy, candidate_betas, candidate_recipe)
from juice.when_to_steer.signals import GATE_SIGNALS, RELEVANCE, SIGNAL, first_step_features, has_passage, relevance
from juice.data.context_types import CONTEXT_TYPES, ContextItem, ContextItems
from juice.models import LoadedModel
from juice.recipe import Method
from juice.tuned import DEGENERATION_MARGIN
from juice.when_to_steer.evaluation import evaluate_context_types, question_only_results, result_id


@dataclass
class AutoFit:
    """A policy chosen on validation items, and what it scored there.

    Attributes:
        policy: the chosen :class:`juice.when_to_steer.auto.AutoPolicy`.
        mean: its validation mean over context types (use relevant context, %).
        static: each candidate alone: its validation mean (%).
        per_type: the policy's validation accuracy per context type (%).
        tried: policies compared.
    """

    policy: AutoPolicy
    mean: float
    static: dict[str, float]
    per_type: dict[str, float]
    tried: int
    degeneration: dict[str, float] = field(default_factory=dict)
    refused: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"mean": round(self.mean, 4), "static": {k: round(v, 4) for k, v in self.static.items()},
                "per_type": {k: round(v, 4) for k, v in self.per_type.items()}, "tried": self.tried,
                "degeneration": {k: round(v, 4) for k, v in self.degeneration.items()},
                "refused_for_degeneration": list(self.refused)}


GATE_GRID = 12
"""At most this many relevance thresholds tried: quantiles of the validation relevance."""


def objective_weights(types: Sequence[str], sources: Sequence[str]) -> tuple[np.ndarray, list[str]]:
    """Per item, its weight in the mean over context types of the mean over sources (percent),
    and the context types present: `weights @ verdicts` is the use-relevant objective every fit
    and table reports (:func:`juice.when_to_steer.evaluation.context_type_means`)."""
    present = [t for t in CONTEXT_TYPES if t in set(types)]
    count: dict[tuple[str, str], int] = {}
    for t, src in zip(types, sources):
        count[t, src] = count.get((t, src), 0) + 1
    per_type_sources = {t: sum(1 for (tt, _) in count if tt == t) for t in present}
    weights = [100.0 / (len(present) * per_type_sources[t] * count[t, src]) for t, src in zip(types, sources)]
    return np.array(weights), present


GateValues = Mapping[str, Sequence[float]] | Sequence[float]
"""Per item, the gate signals: gate signal name (:data:`juice.when_to_steer.signals.GATE_SIGNALS`) -> per item, its value; a
plain sequence is the lexical one (:func:`juice.when_to_steer.signals.passage_relevance`)."""


def _gate_values(relevance) -> dict[str, list[float]]:
    if relevance is None:
        return {}
    if isinstance(relevance, Mapping):
        return {name: [float(v) for v in values] for name, values in relevance.items()}
    return {RELEVANCE: [float(v) for v in relevance]}


def policy_picks(policy: AutoPolicy, signal: Sequence[float], passage: Sequence[bool],
                 relevance: GateValues | None = None) -> list[str]:
    """Per item, the candidate `policy` decodes it with: Original without a passage, the gate's
    pick below its threshold on its signal (`relevance[policy.gate]`), else the bin's (as
    :class:`juice.engine.Choice` decides)."""
    gate = _gate_values(relevance).get(policy.gate)
    out = []
    for k, (x, has) in enumerate(zip(signal, passage)):
        if not has:
            out.append(NO_PASSAGE)
        elif policy.relevance is not None and gate is not None and gate[k] < policy.relevance:
            out.append(policy.irrelevant)
        else:
            out.append(policy.picks[sum(x >= e for e in policy.thresholds)])
    return out


def fit_policy(verdicts: Mapping[str, Sequence[bool]], signal: Sequence[float], types: Sequence[str],
               sources: Sequence[str], betas: Mapping[str, tuple[float, float]],
               passage: Sequence[bool] | None = None, degenerate: Mapping[str, Sequence[bool]] | None = None,
               margin: float = DEGENERATION_MARGIN, relevance: GateValues | None = None) -> AutoFit:
    """Choose a relevance gate, thresholds and a candidate per bin (module docstring) from
    validation outcomes: every gate (none, or, for each gate signal given, a threshold among
    :data:`GATE_GRID` quantiles of its validation values with each candidate below it) and every
    set of at most :data:`juice.when_to_steer.auto.MAX_THRESHOLDS` thresholds among :data:`juice.when_to_steer.auto.THRESHOLD_GRID` quantiles of the
    signal, with the best candidate per bin; the highest mean wins, ties going to no gate, fewer
    bins, less steered candidates and the earlier gate signal in :data:`juice.when_to_steer.signals.GATE_SIGNALS`.

    Args:
        verdicts: candidate name -> per item, its use-relevant verdict ("original" required).
        signal: per item, the first-step JSD (bits).
        types, sources: per item, its context type and source.
        betas: the steered candidates' betas.
        passage: per item, whether it has a passage (:func:`juice.when_to_steer.signals.has_passage`); default: every item
            but the "none" ones. An item without one is decoded with Original whatever the
            bins (:attr:`juice.engine.Choice.without_passage`): it scores Original's verdict
            and never moves a threshold.
        degenerate: candidate name -> per item, whether its output is degenerate; a candidate
            whose share exceeds Original's by more than `margin` points is never picked.
        relevance: the gate signals to try (:data:`GateValues`: name -> per item; a plain
            sequence is :func:`juice.when_to_steer.signals.passage_relevance`); None: no gate is tried.

    Returns:
        the :class:`AutoFit`: the objective is the mean over context types of the accuracy
        averaged over sources, as :func:`juice.when_to_steer.evaluation.context_type_means` reports it.

    Raises:
        ValueError: no items, lists of different lengths, or no "original" verdicts.
    """
    n = len(signal)
    passage = [t != "none" for t in types] if passage is None else [bool(p) for p in passage]
    if (not n or any(len(v) != n for v in verdicts.values()) or len(types) != n or len(sources) != n
            or len(passage) != n or any(len(v) != n for v in _gate_values(relevance).values())):
        raise ValueError("auto: one verdict, signal, type, source, passage flag and relevance per validation item")
    if NO_PASSAGE not in verdicts:
        raise ValueError("auto: the fit needs Original's verdicts (the choice without a passage)")
    names = [c for c in CANDIDATES if c in verdicts]
    share = {c: 100.0 * sum(map(bool, d)) / len(d) for c, d in (degenerate or {}).items() if len(d)}
    refused = tuple(c for c in names if c in share and NO_PASSAGE in share and share[c] > share[NO_PASSAGE] + margin)
    names = [c for c in names if c not in refused]
    weight, present = objective_weights(types, sources)
    has = np.array(passage)
    x = np.array([float(v) for v in signal])
    score = np.stack([weight * np.array([bool(v) for v in verdicts[c]]) * has for c in names])   # [cands, n]
    fixed = float((weight * np.array([bool(v) for v in verdicts[NO_PASSAGE]]))[~has].sum())
    values = {name: np.array(v) for name, v in _gate_values(relevance).items()}
    unknown = [name for name in values if name not in GATE_SIGNALS]
    if unknown:
        raise ValueError(f"auto: unknown gate signal {unknown[0]!r}; choose from {', '.join(GATE_SIGNALS)}")

    splits = _splits(x, _midpoints(x[has], THRESHOLD_GRID))
    gates: list[tuple[str | None, float | None, int | None]] = [(None, None, None)]
    if has.any():
        gates += [(name, g, j) for name in GATE_SIGNALS if name in values
                  for g in _midpoints(values[name][has], GATE_GRID) for j in range(len(names))]
    steer_rank = np.array([CANDIDATES.index(c) for c in names])
    best: tuple | None = None
    tried = 0
    for gate_name, gate, gate_pick in gates:
        below = np.zeros(n, dtype=bool) if gate is None else has & (values[gate_name] < gate)
        gated = 0.0 if gate is None else float(score[gate_pick][below].sum())
        live = score * ~below   # [cands, n]: items that reach the bins
        rank = 0 if gate_name is None else GATE_SIGNALS.index(gate_name)
        for k, edges, onehot in splits:   # every split with k thresholds at once
            per_bin = np.matmul(live, onehot).transpose(1, 0, 2)   # [cands, splits, bins]
            picks = np.round(per_bin, 9).argmax(0)   # [splits, bins]: the best candidate per bin, ties to the less steered
            totals = fixed + gated + np.take_along_axis(per_bin, picks[None], 0)[0].sum(axis=1)
            steered = steer_rank[picks].sum(axis=1)
            tried += len(edges)
            # the split with the highest (total, -steered), the earliest on a tie, as a loop over splits keeps it
            first = int(np.lexsort((np.arange(len(edges)), steered, -np.round(totals, 9)))[0])
            key = (round(float(totals[first]), 9), gate is None, -k, -int(steered[first]), -rank)
            if best is None or key > best[0]:
                best = (key, gate_name, gate, gate_pick, edges[first], tuple(names[j] for j in picks[first]))
    _, gate_name, gate, gate_pick, edges, picks = best
    if len(set(picks)) == 1:   # one candidate everywhere: no thresholds needed
        edges, picks = (), picks[:1]
    irrelevant = "question" if gate is None else names[gate_pick]
    used = set(picks) | ({irrelevant} if gate is not None else set())
    policy = AutoPolicy(tuple(float(e) for e in edges), tuple(picks),
                        {c: tuple(betas[c]) for c in used if c not in UNSTEERED},
                        None if gate is None else float(gate), irrelevant, gate_name or RELEVANCE)
    chosen_names = policy_picks(policy, signal, passage, relevance)
    chosen = [verdicts[c][i] for i, c in enumerate(chosen_names)]
    static = {c: sum(_type_means(verdicts[c], types, sources, present).values()) / len(present)
              for c in [*names, *refused]}
    per_type = _type_means(chosen, types, sources, present)
    return AutoFit(policy, sum(per_type.values()) / len(present), static, per_type, tried, share, refused)


def _splits(x: np.ndarray, cuts: Sequence[float]) -> list[tuple[int, list[tuple[float, ...]], np.ndarray]]:
    """The signal's splits into bins that :func:`fit_policy` tries, by number of thresholds k
    (0 to :data:`juice.when_to_steer.auto.MAX_THRESHOLDS`): (k, every k-subset of `cuts` in
    order, `[splits, n, k + 1]` each one's one-hot bins of `x`). The same for every gate."""
    out = []
    for k in range(MAX_THRESHOLDS + 1):
        edges = list(itertools.combinations(cuts, k))
        if not edges:
            continue
        onehot = np.zeros((len(edges), len(x), k + 1))
        for s, e in enumerate(edges):
            onehot[s, np.arange(len(x)), np.searchsorted(np.array(e), x, side="right") if k else 0] = 1.0
        out.append((k, edges, onehot))
    return out


def _midpoints(values, size: int) -> list[float]:
    """The midpoints between consecutive distinct `values` (a numpy array), thinned to at most
    `size` evenly spaced ones: the candidate thresholds of :func:`fit_policy`."""
    order = sorted(set(values.tolist()))
    cuts = [(a + b) / 2 for a, b in zip(order, order[1:])]
    if len(cuts) > size:
        cuts = sorted({cuts[round(i * (len(cuts) - 1) / (size - 1))] for i in range(size)})
    return cuts


def _type_means(values: Sequence[bool], types: Sequence[str], sources: Sequence[str], present: Sequence[str]
                ) -> dict[str, float]:
    """Context type -> accuracy (%) of `values` averaged over sources, for the types `present`."""
    right: dict[tuple[str, str], int] = {}
    items: dict[tuple[str, str], int] = {}
    for v, t, src in zip(values, types, sources):   # one pass: counts per (type, source)
        items[t, src] = items.get((t, src), 0) + 1
        right[t, src] = right.get((t, src), 0) + bool(v)
    out = {}
    for t in present:
        srcs = sorted(src for tt, src in items if tt == t)
        out[t] = sum(100.0 * right[t, src] / items[t, src] for src in srcs) / len(srcs)
    return out


def best_static_name(static: Mapping[str, Sequence[bool]], types: Sequence[str], sources: Sequence[str]) -> str:
    """The static method (name -> per item, its use-relevant verdicts) with the highest objective
    (:func:`objective_weights`) on these items; ties go to the earlier in `static`."""
    weights, _ = objective_weights(types, sources)
    order = list(static)
    return max(order, key=lambda m: (round(float(sum(w * bool(v) for w, v in zip(weights, static[m]))), 9),
                                     -order.index(m)))


def cross_validate(verdicts: Mapping[str, Sequence[bool]], static: Mapping[str, Sequence[bool]],
                   signal: Sequence[float], types: Sequence[str], sources: Sequence[str], groups: Sequence[Any],
                   betas: Mapping[str, tuple[float, float]], *, passage: Sequence[bool] | None = None,
                   degenerate: Mapping[str, Sequence[bool]] | None = None, relevance: GateValues | None = None,
                   folds: int = 5, seed: int = 0, margin: float = DEGENERATION_MARGIN) -> dict[str, Any]:
    """Cross-validate the fit (:func:`fit_policy`) against the best static method, grouped: the
    items of one group (a question, or a whole source for leave-one-domain-out) are never split
    between training and held-out folds. In each fold the policy and the best static method
    (highest training mean among `static`) are chosen on the training items and applied to the
    held-out ones; every item is held out once.

    Args:
        verdicts: auto's candidates' verdicts (as :func:`fit_policy`).
        static: every static method's verdicts (name -> per item), the candidates among them or not.
        groups: per item, its group; folds: the number of folds (at most the number of groups;
            `folds=0`: one fold per group, e.g. per source).

    Returns:
        {"auto": per item, the held-out policy's verdict; "best_static": the held-out best
        static method's; "chosen": per fold, the best static method's name; "folds": k}.

    Raises:
        ValueError: see :func:`fit_policy`; fewer than two groups.
    """
    import random

    distinct = list(dict.fromkeys(groups))
    if len(distinct) < 2:
        raise ValueError("auto: cross-validation needs at least two groups")
    k = len(distinct) if folds <= 0 else min(folds, len(distinct))
    order = distinct[:]
    random.Random(seed).shuffle(order)
    fold_of = {g: i % k for i, g in enumerate(order)}
    passage = [t != "none" for t in types] if passage is None else list(passage)
    gates = _gate_values(relevance)
    auto = [False] * len(signal)
    best = [False] * len(signal)
    chosen = []
    for f in range(k):
        train = [i for i, g in enumerate(groups) if fold_of[g] != f]
        held = [i for i, g in enumerate(groups) if fold_of[g] == f]
        pick = lambda seq: [seq[i] for i in train]   # noqa: E731
        fit = fit_policy({c: pick(v) for c, v in verdicts.items()}, pick(signal), pick(types), pick(sources), betas,
                         pick(passage), None if degenerate is None else {c: pick(v) for c, v in degenerate.items()},
                         margin, {gate: pick(v) for gate, v in gates.items()} if gates else None)
        best_name = best_static_name({m: pick(v) for m, v in static.items()}, pick(types), pick(sources))
        chosen.append(best_name)
        picks = policy_picks(fit.policy, [signal[i] for i in held], [passage[i] for i in held],
                             {gate: [v[i] for i in held] for gate, v in gates.items()})
        for i, c in zip(held, picks):
            auto[i] = bool(verdicts[c][i])
            best[i] = bool(static[best_name][i])
    return {"auto": auto, "best_static": best, "chosen": chosen, "folds": k}


def tune_auto(lm: LoadedModel, artifact, items: ContextItems | Sequence[ContextItem], *,
              where: Mapping[str, Any] | None = None, max_rows: int | str = 64,
              on_progress=None) -> AutoFit:
    """Tune `auto` on validation context items and write it into `artifact.tuned["auto"]`
    (module docstring). Reads `items` only (never test items: give validation data).

    Args:
        artifact: the heads file (:class:`juice.stage1.HeadsArtifact`); its tuned JuICE (and
            JuNE) betas are the candidates' (defaults where untuned).
        items: validation items (:func:`juice.when_to_steer.context_items` of a validation source).
        where: the data's provenance, saved beside the policy.

    Returns:
        the :class:`AutoFit`.

    Raises:
        ValueError: no items.
    """
    items = items.items if isinstance(items, ContextItems) else list(items)
    if not items:
        raise ValueError("auto: no validation items to tune on")
    methods = candidate_methods(lm, artifact)
    results = evaluate_context_types(lm, items, methods, max_rows=max_rows, on_progress=on_progress)
    titles = {c: c for c in methods}
    alone = question_only_results(items, results, original=NO_PASSAGE, name="question")
    if len(alone) == len(items):   # every question has its none item: the question-alone candidate
        results, titles = [*results, *alone], {**titles, "question": "question"}
    fit = fit_from_results(lm, items, results, titles, candidate_betas(artifact.tuned))
    record_fit(artifact, fit, where)
    return fit


def record_fit(artifact, fit: AutoFit, where: Mapping[str, Any] | None = None) -> None:
    """Write `fit`'s policy into the heads file's `tuned["auto"]` (:mod:`juice.tuned`), with what
    it scored on validation and the data's provenance (`where`)."""
    artifact.tuned = artifact.tuned.with_record("auto", {**fit.policy.to_json(), "validation": fit.to_json(),
                                                         "data": dict(where or {})})


def candidate_methods(lm: LoadedModel, artifact) -> dict[str, Method]:
    """Candidate name -> its evaluation method (:class:`juice.recipe.Method`), at the heads
    file's betas (:func:`juice.when_to_steer.auto.candidate_betas`)."""
    betas = candidate_betas(artifact.tuned)
    out = {}
    for c in CANDIDATE_TABLE:
        if c.method is None or (c.steered and c.name not in betas):
            continue   # the question alone is Original's output on the none item; an untuned JuNE is none
        out[c.name] = candidate_recipe(c, lm, artifact.selection, betas)   # as the registry builds it
    return out


@dataclass(frozen=True)
class ValidationOutcomes:
    """What the fit (:func:`fit_policy`) and the cross-validation (:func:`cross_validate`) read,
    per validation item, in item order.

    Attributes:
        verdicts: candidate name -> its use-relevant verdicts (:func:`verdict_table`).
        degenerate: candidate name -> whether its outputs are degenerate.
        signal: the first-step JSD (bits); gates: gate signal name -> values; passage: whether
            the item has a passage (:func:`request_features`).
        types, sources: the items' context types and sources.
    """

    verdicts: dict[str, list[bool]]
    degenerate: dict[str, list[bool]]
    signal: list[float]
    gates: dict[str, list[float]]
    passage: list[bool]
    types: list[str]
    sources: list[str]


def validation_outcomes(lm: LoadedModel | None, items: Sequence[ContextItem], results: Sequence,
                        titles: Mapping[str, str], features: tuple | None = None) -> ValidationOutcomes:
    """The :class:`ValidationOutcomes` of `items` from results already decoded (`titles`: candidate
    name -> its method's name in `results`, as :func:`verdict_table`) and one first-step forward
    per item (:func:`request_features`), or `features`, that function's result computed before
    (e.g. read from a study's cache; then `lm` may be None).

    Raises:
        ValueError: a candidate without a result for some item.
    """
    verdicts, degenerate = verdict_table(items, results, titles)
    signal, gates, passage = request_features(lm, items) if features is None else features
    return ValidationOutcomes(verdicts, degenerate, signal, gates, passage, [i.context_type for i in items],
                              [i.source for i in items])


def fit_outcomes(outcomes: ValidationOutcomes, betas: Mapping[str, tuple[float, float]],
                 margin: float = DEGENERATION_MARGIN, gate: bool = True) -> AutoFit:
    """:func:`fit_policy` on `outcomes`, with the relevance gate unless `gate` is False."""
    o = outcomes
    return fit_policy(o.verdicts, o.signal, o.types, o.sources, betas, o.passage, o.degenerate, margin,
                      o.gates if gate else None)


def fit_from_results(lm: LoadedModel, items: Sequence[ContextItem], results: Sequence, titles: Mapping[str, str],
                     betas: Mapping[str, tuple[float, float]], margin: float = DEGENERATION_MARGIN,
                     gate: bool = True) -> AutoFit:
    """Fit the policy (:func:`fit_policy`, with the relevance gate unless `gate` is False) from
    validation results already decoded (:func:`validation_outcomes`, then :func:`fit_outcomes`).

    Args:
        items: the validation items, in order.
        results: :class:`juice.eval.runner.ItemResult` of every candidate on every item (a
            context-type evaluation's; other methods are ignored).
        titles: candidate name (:data:`juice.when_to_steer.auto.CANDIDATES`) -> its method's name in `results`; a
            candidate absent from `titles` is not considered ("original" is required).
        betas: the steered candidates' betas.

    Raises:
        ValueError: a candidate without a result for some item, or no "original".
    """
    return fit_outcomes(validation_outcomes(lm, items, results, titles), betas, margin, gate)


def request_features(lm: LoadedModel, items: Sequence[ContextItem]
                     ) -> tuple[list[float], dict[str, list[float]], list[bool]]:
    """Per item, what the policy reads: the first-step JSD (:func:`juice.when_to_steer.signals.first_step_signal`), the gate
    signals (:data:`juice.when_to_steer.signals.GATE_SIGNALS` -> per item: the passage's lexical relevance, :func:`juice.when_to_steer.signals.relevance`,
    and the model-based ones, :func:`juice.when_to_steer.signals.first_step_features`) and whether it has a passage
    (:func:`juice.when_to_steer.signals.has_passage`)."""
    prompts, questions = [i.prompt for i in items], [i.question for i in items]
    features = first_step_features(lm, prompts, questions)
    gates = {RELEVANCE: relevance(lm, prompts, questions), **{n: features[n].tolist() for n in GATE_SIGNALS[1:]}}
    return features[SIGNAL].tolist(), gates, has_passage(lm, prompts, questions)


def verdict_table(items: Sequence[ContextItem], results: Sequence, titles: Mapping[str, str]
                  ) -> tuple[dict[str, list[bool]], dict[str, list[bool]]]:
    """(name -> per item, its use-relevant verdict; name -> per item, whether its output is
    degenerate) for each `titles` name (-> its method's name in `results`).

    Raises:
        ValueError: a method without a result for some item.
    """
    by_key = {(r.domain, r.item, r.conflict_type, r.method): r for r in results}
    verdicts: dict[str, list[bool]] = {}
    degenerate: dict[str, list[bool]] = {}
    for candidate, title in titles.items():
        rows = [by_key.get((i.source, result_id(i), i.context_type, title)) for i in items]
        if any(r is None for r in rows):
            raise ValueError(f"auto: {title!r} has no result for every validation item")
        verdicts[candidate] = [r.correct for r in rows]
        degenerate[candidate] = [r.degenerate for r in rows]
    return verdicts, degenerate


__all__ = ["AutoFit", "GATE_GRID", "best_static_name", "objective_weights", "GateValues", "ValidationOutcomes", "candidate_methods", "cross_validate",
           "fit_from_results", "fit_outcomes", "fit_policy", "policy_picks", "record_fit", "request_features",
           "tune_auto", "validation_outcomes", "verdict_table"]
