"""GAPS re-screening of TriState-Bench's facts for the model under test (:mod:`juice.data.tristate`):
each fact's prior labelled right, wrong or uncertain from the model's own answers, so that its
three states (correction, resistance, agreement) are built for it, not taken from another
model's labels.

Per question (its paraphrases in order, while :func:`juice.data.tristate.questions_to_ask`), one
greedy response (the anchor) and :data:`juice.data.tristate.SAMPLES` sampled ones are decoded
in one call (the samples share the prompt's prefill), and the rule reads their votes in order
(:func:`juice.data.tristate.question_verdict`): the responses after its verdict are dropped, so
the record holds what a screening that stopped there would have drawn. Drawing all nine at
once costs the samples an early stop would have saved (on questions that turn out uncertain) and
buys one batched call per paraphrase; each sample's seed depends on the fact, the paraphrase
and its rank only, so the labels do not depend on the batch or on which facts are screened.

Not published by the benchmark, chosen here (docs: the module docstring of
:mod:`juice.data.tristate`): temperature 1.0, top-p 1.0, the benchmark's question-only prompt
(raw text with BOS, no chat template), 32 new tokens, the whole response read.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

from juice.data.tristate import (SAMPLES, TriStateFact, gaps_label, question_prompt, question_verdict,
                                 questions_to_ask, vote)
from juice.engine import Stream, generate
from juice.engine.sampling import Sampling
from juice.io import UnitCheckpoint
from juice.models import LoadedModel
from juice.progress import Progress, no_progress
from juice.steering import ORIGINAL

MAX_NEW_TOKENS = 32
"""New tokens per screening response (the benchmark's evaluation budget; its screening's is not published)."""


def sample_seed(seed: int, fact_id: str, question: int, rank: int) -> int:
    """The seed of a fact's paraphrase `question`'s `rank`-th sample (1..9): a hash of all four,
    so it depends on nothing else (not on the batch, nor on the facts screened beside it)."""
    digest = hashlib.sha256(f"{seed}/{fact_id}/{question}/{rank}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def screen(lm: LoadedModel, facts: Sequence[TriStateFact], *, seed: int = 0, temperature: float = 1.0,
           max_new_tokens: int = MAX_NEW_TOKENS, max_rows: int | str = 64, checkpoint: str | Path | None = None,
           progress: Progress = no_progress) -> dict[str, dict]:
    """GAPS on `facts` for `lm` (module docstring).

    Args:
        lm: the model under test.
        facts: the facts to label (e.g. those with a passage: :func:`juice.data.tristate.load_tristate`).
        seed: the screening's seed (:func:`sample_seed`).
        temperature: the samples' temperature (top-p 1, top-k 0).
        max_new_tokens: tokens per response.
        max_rows: most decoding rows per batch, or "auto".
        checkpoint: a file where each paraphrase round's records are saved as it ends, keyed on
            the model, the facts and the settings: a killed screening resumes at its next round.
        progress: where the rounds report (one unit per response decoded).

    Returns:
        fact id -> `{"responses": [[str]], "votes": [[bool]], "verdicts": [str], "prior": str}`,
        the published screening's shape (:func:`juice.data.tristate.published_screening`; a
        paraphrase not asked has no responses, and no verdict here rather than "skipped").

    Raises:
        PromptTooLongError: a question does not fit the model's context with the new tokens.
    """
    settings = {"seed": seed, "temperature": temperature, "max_new_tokens": max_new_tokens, "samples": SAMPLES}
    units = None if checkpoint is None else UnitCheckpoint(checkpoint, {"model": lm.fingerprint(), **settings})
    records = {f.fact_id: {"responses": [[], [], []], "votes": [[], [], []], "verdicts": []} for f in facts}
    for q in range(3):
        asked = [f for f in facts if questions_to_ask(records[f.fact_id]["verdicts"])]
        if not asked:
            break
        unit = hashlib.sha256(repr((q, [f.fact_id for f in asked])).encode()).hexdigest()[:16]
        saved = None if units is None else units.get(unit)
        if saved is None:
            saved = _round(lm, asked, q, seed, temperature, max_new_tokens, max_rows, progress)
            if units is not None:
                units.put(unit, saved)
        for f in asked:
            responses = saved[f.fact_id]
            votes = [vote(r, f.aliases) for r in responses]
            k = next(k for k in range(1, len(votes) + 1) if question_verdict(votes[:k]) is not None)
            record = records[f.fact_id]
            record["responses"][q], record["votes"][q] = responses[:k], votes[:k]
            record["verdicts"].append(question_verdict(votes[:k]))
    for record in records.values():
        record["prior"] = gaps_label(record["verdicts"])
    return records


def _round(lm: LoadedModel, asked: Sequence[TriStateFact], q: int, seed: int, temperature: float,
           max_new_tokens: int, max_rows: int | str, progress: Progress) -> dict[str, list[str]]:
    """Paraphrase `q` of every fact in `asked`: its greedy response, then its samples, in rank order."""
    prompts = [question_prompt(f.questions[q]) for f in asked]
    streams = []
    for i, f in enumerate(asked):
        streams.append(Stream(i, ORIGINAL))
        streams += [Stream(i, ORIGINAL, Sampling(temperature, 0, 1.0, sample_seed(seed, f.fact_id, q, k)))
                    for k in range(1, SAMPLES + 1)]
    advance = progress(f"GAPS: paraphrase {q + 1} of {len(asked)} facts", len(streams))
    texts = generate(lm, prompts, streams, max_new_tokens, max_rows=max_rows, stop_at_eos=True,
                     on_progress=advance).texts
    per = SAMPLES + 1
    return {f.fact_id: texts[i * per:(i + 1) * per] for i, f in enumerate(asked)}


def screening_counts(records: dict[str, dict], facts: Sequence[TriStateFact]) -> dict:
    """The screening's label counts, in the published `summary.json`'s shape: total, P_right,
    P_wrong, P_uncertain, and the same per answer type."""
    types = {f.fact_id: f.answer_type for f in facts}

    def counts(ids) -> dict:
        priors = [records[i]["prior"] for i in ids]
        return {"total": len(priors), **{p: priors.count(p) for p in ("P_right", "P_wrong", "P_uncertain")}}

    by_type = {}
    for t in sorted(set(types.values())):
        by_type[t] = counts([i for i in records if types.get(i) == t])
    return {**counts(list(records)), "by_type": by_type}


__all__ = ["MAX_NEW_TOKENS", "sample_seed", "screen", "screening_counts"]
