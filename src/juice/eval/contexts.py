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

from collections.abc import Callable, Mapping, Sequence

from juice.baselines.prompt import instructed_context_item
from juice.data.context_types import CONTEXT_TYPES, ContextItem
from juice.eval.degeneration import correct_not_degenerate
from juice.eval.metrics import context_verdicts
from juice.eval.runner import DecodeRequest, ItemResult, Method, as_method, decode_requests, exact_match_decided
from juice.eval.tables import IntervalTable, interval_table
from juice.models import LoadedModel
from juice.steering import Steering
from juice.tokens import answer_first_token

NEW_TOKENS = {"first_words": 10, "nqswap": 20}
"""New tokens per metric: the paper's for Table 1 (10) and NQ-Swap (20)."""

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
    on_progress: Callable[[int], None] | None = None,
) -> list[ItemResult]:
    """Decode and score every item x method (module docstring).

    Args:
        items: context-type items (:func:`juice.data.context_types.nqswap_context_items`,
            :func:`~juice.data.context_types.paraconflict_context_items`).
        methods: name -> :class:`~juice.eval.runner.Method` (or a steering); an instructed
            method uses its `instruction` (default "contextual").
        on_progress: called with the number of (prompt, method) streams finished.

    Returns:
        one :class:`~juice.eval.runner.ItemResult` per item and method, in item order.

    Raises:
        EmptyAnswerError: an answer tokenizes to nothing.
    """
    methods = {name: as_method(m) for name, m in methods.items()}
    model_type = lm.model.config.model_type
    results: dict[tuple[int, str], ItemResult] = {}
    for metric, new_tokens in NEW_TOKENS.items():
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
                requests.append(DecodeRequest(prompt, method, probe, item.question))
        if not requests:
            continue
        decoded = decode_requests(lm, requests, new_tokens, max_rows=max_rows, on_progress=on_progress,
                                  stop_text=exact_match_decided(lm.tokenizer) if metric == "first_words" else None)
        for (i, item, name), (text, probs) in zip(meta, decoded):
            verdicts = context_verdicts(item, text)
            results[(i, name)] = ItemResult(
                domain=item.source, subject=item.uid, conflict_type=item.context_type, method=name, output=text,
                correct=bool(verdicts["use_relevant"]), follows_context=bool(verdicts["follows_context"]),
                p_parametric=float(probs[0]), p_context=float(probs[1]),
                follows_parametric=bool(verdicts["trust_memory"]), item=result_id(item))
    return [results[(i, name)] for i in range(len(items)) for name in methods if (i, name) in results]


def context_type_tables(results: Sequence[ItemResult], methods: Sequence[str], *, focus: str = "JuICE",
                        baseline: str = "Original", resamples: int = 2000, seed: int = 0) -> dict[str, IntervalTable]:
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


__all__ = ["LOWER_IS_BETTER", "NEW_TOKENS", "TABLES", "context_type_means", "context_type_tables", "evaluate_context_types",
           "result_id"]
