"""The context-type evaluation (issue 35): every method on the same questions with a gold, a
conflicting, an irrelevant and no context (:mod:`juice.data.context_types`), scored under two
objectives, with n, 95% bootstrap intervals and paired differences against Original.

Decoding is the paper's per source: ParaConflict items 10 new tokens, exact match in the first 5
words (a row stops once those are final, as :func:`juice.eval.runner.evaluate`); NQ-Swap items 20
new tokens, normalized substring match. Every method's rows of one metric share the engine's
batches (:func:`juice.eval.runner.decode_requests`): a prompt is prefilled once for all its
steerings, CAD's and AdaCAD's question branch is the item's context-free question (for a none
item, the prompt itself, where both are the unmodified model).

An :class:`~juice.eval.runner.ItemResult` per (item, method): `domain` the source, `conflict_type`
the context type, `item` the underlying item's id (with "/substitution" or "/coherent" for
ParaConflict's two conflicting prompts), `correct` the **use relevant context** verdict (gold and
conflicting: the context's answer; irrelevant and none: the memory answer), `follows_parametric`
the **trust memory** verdict (the memory answer), `follows_context` whether the output gives the
passage's answer (False for none), `p_parametric` / `p_context` the first-step probabilities of
the memory answer's and the passage answer's first token (the memory answer's for none).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from juice.baselines.prompt import instructed_context_item
from juice.data.context_types import CONTEXT_TYPES, ContextItem
from juice.eval.degeneration import correct_not_degenerate
from juice.data.metrics import CONTEXT_ITEM, metrics_for
from juice.data.metrics import METRICS
from juice.eval.verdicts import context_verdicts
from juice.eval.stats import Interval, _check
from juice.engine.backend import Engine
from juice.eval.runner import DecodeRequest, ItemResult, decode_requests, exact_match_decided
from juice.recipe import Method, as_method
from juice.eval.tables import IntervalTable, interval_table
from juice.methods import FOCUS, UNSTEERED, row_title
from juice.models import LoadedModel
from juice.steering import Steering
from juice.tokens import answer_first_token
from juice.progress import OnProgress


TABLES: dict[str, Callable[[ItemResult], bool]] = {
    "use_relevant": lambda r: r.correct,
    "trust_memory": lambda r: bool(r.follows_parametric),
    "follows_context": lambda r: r.follows_context,
    "use_relevant_not_degenerate": correct_not_degenerate,
    "degenerate": lambda r: r.degenerate,
}
"""The tables of :func:`context_type_tables`: what a cell counts (the last two: juice's
degeneration measure beside the objective, :mod:`juice.eval.degeneration`)."""

LOWER_IS_BETTER = ("degenerate",)
"""Tables where a lower value is better (no bold for the highest)."""


def _prompt(item: ContextItem, method: Method, model_type: str) -> str:
    if not method.instructed:
        return item.prompt
    return instructed_context_item(item, method.instruction or "contextual", model_type)


def result_id(item: ContextItem) -> str:
    """The item's id in results: its uid, with its variant for ParaConflict's conflicting prompts."""
    return f"{item.uid}/{item.variant}" if item.variant else item.uid


def evaluate_context_types(
    lm: LoadedModel,
    items: Sequence[ContextItem],
    methods: Mapping[str, "Method | Steering"],
    *,
    max_rows: int | str = 64,
    on_progress: OnProgress | None = None,
    engine: Engine | None = None,
) -> list[ItemResult]:
    """Decode and score every item x method (module docstring).

    Args:
        items: context-type items (:func:`juice.data.context_types.nqswap_context_items`,
            :func:`~juice.data.context_types.paraconflict_context_items`).
        methods: name -> :class:`~juice.recipe.Method` (or a steering); an instructed
            method uses its `instruction` (default "contextual").
        on_progress: called with the number of (prompt, method) streams finished.
        engine: what decodes (:mod:`juice.engine.backend`); None: juice's own engine.

    Returns:
        one :class:`~juice.eval.runner.ItemResult` per item and method, in item order.

    Raises:
        EmptyAnswerError: an answer tokenizes to nothing.
    """
    methods = {name: as_method(m) for name, m in methods.items()}
    model_type = lm.config.model_type
    results: dict[tuple[int, str], ItemResult] = {}
    for metric in metrics_for(CONTEXT_ITEM):   # the context types' metrics
        new_tokens = METRICS[metric].new_tokens
        meta, requests = [], []
        for i, item in enumerate(items):
            if item.metric != metric:
                continue
            passage = item.context_answers[0] if item.context_answers else item.memory_answers[0]
            for name, method in methods.items():
                prompt = _prompt(item, method, model_type)
                probe = [answer_first_token(lm.tokenizer, prompt, item.memory_answers[0]),
                         answer_first_token(lm.tokenizer, prompt, passage)]
                meta.append((i, item, name))
                instructed = (instructed_context_item(item, "parametric", model_type)
                              if method.choice is not None and method.choice.needs_instruction else None)
                requests.append(DecodeRequest(prompt, method, probe, item.question, instructed))
        if not requests:
            continue
        decoded = decode_requests(lm, requests, new_tokens, max_rows=max_rows, on_progress=on_progress,
                                  stop_text=(exact_match_decided(lm.tokenizer) if METRICS[metric].first_words_only
                                             else None),
                                  engine=engine)
        for (i, item, name), (text, probs) in zip(meta, decoded):
            verdicts = context_verdicts(item, text)
            results[(i, name)] = ItemResult(
                domain=item.source, subject=item.uid, conflict_type=item.context_type, method=name, output=text,
                correct=bool(verdicts["use_relevant"]), follows_context=bool(verdicts["follows_context"]),
                p_parametric=float(probs[0]), p_context=float(probs[1]),
                follows_parametric=bool(verdicts["trust_memory"]), item=result_id(item))
    return [results[(i, name)] for i in range(len(items)) for name in methods if (i, name) in results]


QUESTION_ONLY = "Question-only"
"""The method that ignores the passage: the unmodified model on the question alone."""


def question_only_results(items: Sequence[ContextItem], results: Sequence[ItemResult], *, original: str = UNSTEERED,
                          name: str = QUESTION_ONLY) -> list[ItemResult]:
    """"Question-only" on every item, without decoding again: the unmodified model's output on
    the item's question alone is `original`'s output on the same question's *none* item (its
    prompt is the question, token for token; greedy decoding is deterministic, up to the ~1e-8
    float differences of another batch layout), scored against this item's targets. Its
    first-step probabilities are the none item's (the memory answer's first token for both).
    Items whose question has no none item among `items` get none.
    """
    none = {(r.domain, r.subject): r for r in results if r.method == original and r.conflict_type == "none"}
    out = []
    for item in items:
        base = none.get((item.source, item.uid))
        if base is None:
            continue
        verdicts = context_verdicts(item, base.output)
        out.append(ItemResult(
            domain=item.source, subject=item.uid, conflict_type=item.context_type, method=name, output=base.output,
            correct=bool(verdicts["use_relevant"]), follows_context=bool(verdicts["follows_context"]),
            p_parametric=base.p_parametric, p_context=base.p_context,
            follows_parametric=bool(verdicts["trust_memory"]), item=result_id(item)))
    return out


def context_type_tables(results: Sequence[ItemResult], methods: Sequence[str], *, focus: str = FOCUS,
                        baseline: str = UNSTEERED, resamples: int = 2000, seed: int = 0) -> dict[str, IntervalTable]:
    """The tables of a context-type evaluation: "use_relevant", "trust_memory" and
    "follows_context" (without none items), "use_relevant_not_degenerate" and "degenerate", each
    method -> source -> context type ->
    interval, an "Average" column over sources, and paired differences (`focus` against every
    method, every method against `baseline`) over the same items
    (:func:`juice.eval.tables.interval_table`)."""
    out = {}
    for name, value in TABLES.items():
        keep = (lambda r: r.conflict_type != "none") if name == "follows_context" else None
        out[name] = interval_table(results, methods, keep=keep, value=value, focus=focus, baseline=baseline,
                                   resamples=resamples, seed=seed)
    return out


def context_type_means(table: IntervalTable) -> dict[str, dict[str, float]]:
    """method -> context type -> the Average column's accuracy in percent, and "mean": the mean
    over the context types present (the objective's summary number)."""
    out = {}
    for method, columns in table.cells.items():
        row = {t: 100.0 * columns["Average"][t].mean for t in CONTEXT_TYPES if t in columns.get("Average", {})}
        row["mean"] = sum(row.values()) / len(row) if row else float("nan")
        out[method] = row
    return out


MEAN = "mean"
"""The summary column of :class:`QuestionBootstrap`: the mean over context types."""

POWER_Z = 1.959964 + 0.841621
"""z(0.975) + z(0.80): a paired difference of this many standard errors is detected by a
two-sided 5% test with 80% power (the minimum detectable difference, :attr:`QuestionBootstrap.detectable`)."""


@dataclass(frozen=True)
class QuestionBootstrap:
    """Per method, accuracy per context type and its mean over the context types, with 95%
    intervals that resample whole questions (:func:`question_bootstrap`), and paired differences.

    Attributes:
        cells: method -> context type or :data:`MEAN` -> interval (fractions; n = distinct questions).
        differences: "A - B" -> context type or :data:`MEAN` -> interval of the difference.
        detectable: "A - B" -> the minimum detectable paired difference of the mean (fraction):
            :data:`POWER_Z` times the bootstrap standard error of the difference.
        resamples, confidence, seed: the bootstrap's settings.
    """

    cells: dict[str, dict[str, Interval]]
    differences: dict[str, dict[str, Interval]]
    detectable: dict[str, float]
    resamples: int
    confidence: float
    seed: int

    def titled(self, title: Callable[[str], str] = row_title) -> "QuestionBootstrap":
        """The same summary with its methods and differences named by `title` (default: row keys
        to their titles, :func:`juice.methods.row_title`), for what renders or records it."""
        return QuestionBootstrap({title(m): c for m, c in self.cells.items()},
                                 {title(d): c for d, c in self.differences.items()},
                                 {title(d): v for d, v in self.detectable.items()},
                                 self.resamples, self.confidence, self.seed)

    def to_json(self) -> dict:
        return {"cells": {m: {k: iv.to_json() for k, iv in c.items()} for m, c in self.cells.items()},
                "differences": {m: {k: iv.to_json() for k, iv in c.items()} for m, c in self.differences.items()},
                "minimum_detectable_difference": self.detectable,
                "bootstrap": {"resamples": self.resamples, "confidence": self.confidence, "seed": self.seed,
                              "method": "percentile, whole questions resampled within each source"}}

    @classmethod
    def from_json(cls, data: dict) -> "QuestionBootstrap":
        """The summary :meth:`to_json` wrote (a study's `study.json`, a committed record)."""
        def table(part: dict) -> dict[str, dict[str, Interval]]:
            return {m: {k: Interval.from_json(iv) for k, iv in c.items()} for m, c in part.items()}

        b = data["bootstrap"]
        return cls(table(data["cells"]), table(data["differences"]),
                   {k: float(v) for k, v in data["minimum_detectable_difference"].items()},
                   int(b["resamples"]), float(b["confidence"]), int(b["seed"]))


def _type_means(weights: Mapping[str, np.ndarray], sums: Mapping[str, np.ndarray], counts: Mapping[str, np.ndarray]
                ) -> np.ndarray:
    """`[B, T]` per context type, the mean over sources of the accuracy of the weighted questions
    (a source with no item of a type in a resample is left out of that type's mean)."""
    per_source = []
    for src, w in weights.items():
        num, den = w @ sums[src], w @ counts[src]
        per_source.append(np.where(den > 0, num / np.where(den > 0, den, 1), np.nan))
    with np.errstate(invalid="ignore"):
        stacked = np.stack(per_source)
        present = ~np.isnan(stacked)
        return np.where(present.any(0), np.nansum(stacked, 0) / np.maximum(present.sum(0), 1), np.nan)


def question_draws(sizes: Mapping[str, int], resamples: int, seed: int) -> dict[str, np.ndarray]:
    """Source -> `[resamples, n_source]` question weights: each row counts how often each of the
    source's questions is drawn when `n_source` are drawn with replacement. Draws come from
    `numpy.random.default_rng(seed)`, `integers(0, n, size=(resamples, n))` per source in sorted order."""
    rng = np.random.default_rng(seed)
    out = {}
    for src in sorted(sizes):
        n = sizes[src]
        draws = rng.integers(0, n, size=(resamples, n))
        w = np.zeros((resamples, n))
        np.add.at(w, (np.arange(resamples)[:, None], draws), 1.0)
        out[src] = w
    return out


def question_bootstrap(results: Sequence[ItemResult], methods: Sequence[str], pairs: Sequence[tuple[str, str]] = (),
                       *, value: Callable[[ItemResult], bool] = lambda r: r.correct,
                       keep: Callable[[ItemResult], bool] | None = None, resamples: int = 2000,
                       confidence: float = 0.95, seed: int = 0) -> QuestionBootstrap:
    """Accuracy per context type and the mean over context types, with percentile intervals from
    a bootstrap over **questions**: a question (source, underlying item) is drawn whole, with all
    its prompts of every context type (ParaConflict's two conflicting prompts included), within
    its source; every method and pair uses the same draws (paired). The statistic is
    :func:`context_type_means`' on the resampled questions: per context type the mean over
    sources of the accuracy over that source's items, then the mean over the context types.

    Args:
        results: the context-type evaluation's results (`domain` = source, `subject` = the
            underlying item's uid, `conflict_type` = the context type).
        methods: the methods to report; pairs: (A, B) whose paired difference A - B is reported.
        value: what an item counts (default: the use-relevant-context verdict).
        keep: only the results for which it is true.

    Returns:
        the :class:`QuestionBootstrap` (fractions; n = distinct questions with an item of the
        cell's context type, or with any item for the mean).

    Raises:
        ValueError: bad resamples or confidence; a pair naming a method without results.
    """
    _check(resamples, confidence)
    rows = [r for r in results if r.method in set(methods) | {m for p in pairs for m in p} and (keep is None or keep(r))]
    types = [t for t in CONTEXT_TYPES if any(r.conflict_type == t for r in rows)]
    questions: dict[str, dict[str, int]] = {}
    for r in rows:
        questions.setdefault(r.domain, {}).setdefault(r.subject, len(questions[r.domain]))
    sums: dict[str, dict[str, np.ndarray]] = {}
    counts: dict[str, dict[str, np.ndarray]] = {}
    for r in rows:
        q, t = questions[r.domain][r.subject], types.index(r.conflict_type)
        for table, add in ((sums, float(bool(value(r)))), (counts, 1.0)):
            cell = table.setdefault(r.method, {}).setdefault(
                r.domain, np.zeros((len(questions[r.domain]), len(types))))
            cell[q, t] += add
    for m in {m for p in pairs for m in p}:
        if m not in sums:
            raise ValueError(f"no results for {m!r} to compare")
    ones = {src: np.ones((1, len(qs))) for src, qs in questions.items()}
    weights = question_draws({src: len(qs) for src, qs in questions.items()}, resamples, seed)
    tail = (1 - confidence) / 2
    point: dict[str, np.ndarray] = {}
    boot: dict[str, np.ndarray] = {}

    def full(table: dict[str, np.ndarray]) -> dict[str, np.ndarray]:   # every source, zeros where absent
        return {src: table.get(src, np.zeros((len(qs), len(types)))) for src, qs in questions.items()}

    for m in sums:
        point[m] = _type_means(ones, full(sums[m]), full(counts[m]))[0]
        boot[m] = _type_means(weights, full(sums[m]), full(counts[m]))
    n_type = {t: sum(int((c[:, k] > 0).sum()) for c in counts[next(iter(counts))].values())
              for k, t in enumerate(types)} if counts else {}
    n_all = sum(len(qs) for qs in questions.values())

    def interval(mean: float, samples: np.ndarray, n: int) -> Interval:
        samples = samples[~np.isnan(samples)]
        if math.isnan(mean) or not len(samples):
            return Interval(math.nan, math.nan, math.nan, n)
        low, high = np.quantile(samples, [tail, 1 - tail])
        return Interval(float(mean), float(low), float(high), n)

    def summary(pt: np.ndarray, bs: np.ndarray) -> dict[str, Interval]:
        out = {t: interval(float(pt[k]), bs[:, k], n_type[t]) for k, t in enumerate(types)}
        with np.errstate(invalid="ignore"):
            out[MEAN] = interval(float(np.mean(pt)), np.mean(bs, axis=1), n_all)
        return out

    cells = {m: summary(point[m], boot[m]) for m in methods if m in point}
    differences, detectable = {}, {}
    for a, b in pairs:
        name = f"{a} - {b}"
        differences[name] = summary(point[a] - point[b], boot[a] - boot[b])
        spread = np.mean(boot[a] - boot[b], axis=1)
        spread = spread[~np.isnan(spread)]
        detectable[name] = float(POWER_Z * np.std(spread, ddof=1)) if len(spread) > 1 else math.nan
    return QuestionBootstrap(cells, differences, detectable, resamples, confidence, seed)


__all__ = ["LOWER_IS_BETTER", "MEAN", "POWER_Z", "QUESTION_ONLY", "question_only_results", "QuestionBootstrap", "question_bootstrap", "question_draws", "TABLES", "context_type_means", "context_type_tables", "evaluate_context_types",
           "result_id"]
