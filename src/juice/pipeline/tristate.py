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

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from juice.data.context_types import ContextItem
from juice.data.metrics import is_correct
from juice.data.tristate import (SAMPLES, STATES, TriStateFact, TriStateItem, build_states, context_items, gaps_label,
                                 question_prompt, question_verdict, questions_to_ask, vote)
from juice.engine import Stream, generate
from juice.engine.sampling import Sampling
from juice.eval.degeneration import is_degenerate
from juice.eval.runner import ItemResult
from juice.eval.stats import bootstrap_interval, paired_difference_interval
from juice.io import UnitCheckpoint
from juice.models import LoadedModel
from juice.progress import Progress, no_progress
from juice.stage1 import HeadsArtifact
from juice.steering import ORIGINAL
from juice.text import first_line_match
from juice.methods import UNSTEERED, row_of, row_title
from juice.when_to_steer.evaluation import QUESTION_ONLY, evaluate_context_types, question_only_results, result_id
from juice.when_to_steer.auto_tuning import candidate_methods, tune_auto
from juice.when_to_steer.contexts import context_methods

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


STATE_CHUNK = 50
"""Facts per checkpointed unit of the measurement (:func:`measure`)."""


def measure(lm: LoadedModel, states: Mapping[str, Sequence[TriStateItem]], artifacts: Sequence[HeadsArtifact],
            names: Sequence[str], *, chunk: int = STATE_CHUNK, checkpoint: str | Path | None = None,
            max_rows: int | str = 64, progress: Progress = no_progress) -> tuple[list[ContextItem], list[ItemResult]]:
    """Every method of `names` on a model's three states (:func:`juice.data.tristate.build_states`),
    decoded as juice's context-type evaluation decodes them
    (:func:`juice.when_to_steer.evaluation.evaluate_context_types`: the benchmark's prompt, its
    question-only prompt as the contrastive methods' second branch, greedy, 32 new tokens), plus
    "Question-only" (Original's output on the fact's question alone, scored in each state).

    A row stops at the tokenizer's end of sequence, as every juice evaluation does; the
    benchmark's runner also stops at the ids of the model's `generation_config`. The two agree
    for the embedded models (Gemma 3 270M: both `<eos>`, id 1); where a model's generation
    config lists another id (an instruct model's end of turn), juice decodes past it.

    Args:
        states: state -> its items.
        artifacts: heads files, at most one per direction (JuNE, JuICE, PH3 and auto read them).
        names: method names of :data:`juice.methods.REGISTRY`.
        chunk: facts per unit of work; each unit's results are saved to `checkpoint` as it ends,
            keyed on the model, the methods' settings and the unit's facts, so a killed run
            resumes at its next unit.

    Returns:
        (the context-type items, one :class:`~juice.eval.runner.ItemResult` per item and method).

    Raises:
        ValueError: as :func:`juice.when_to_steer.contexts.context_methods`.
    """
    items = context_items(states, none=True).items
    methods, settings = context_methods(lm, artifacts, names)
    units = None if checkpoint is None else UnitCheckpoint(
        checkpoint, {"model": lm.fingerprint(), "methods": sorted(methods), "settings": settings})
    facts = list(dict.fromkeys(i.uid for i in items))
    original = UNSTEERED

    def streams(part: Sequence[ContextItem]) -> int:   # every method on a passage; Original alone on none
        return sum(len(methods) if i.context_type != "none" else int(original in methods) for i in part)

    advance = progress(f"TriState: {len(methods)} methods x {len(items)} items", streams(items))
    results: list[ItemResult] = []
    for start in range(0, len(facts), chunk):
        ids = set(facts[start:start + chunk])
        part = [i for i in items if i.uid in ids]
        unit = UnitCheckpoint.unit_id([result_id(i) for i in part])
        saved = None if units is None else units.get(unit)
        if saved is None:
            with_passage = [i for i in part if i.context_type != "none"]
            alone = [i for i in part if i.context_type == "none"]   # Original only: Question-only's outputs
            got = evaluate_context_types(lm, with_passage, methods, max_rows=max_rows, on_progress=advance)
            if original in methods and alone:
                got += evaluate_context_types(lm, alone, {original: methods[original]}, max_rows=max_rows,
                                              on_progress=advance)
            saved = [dataclasses.asdict(r) for r in got]
            if units is not None:
                units.put(unit, saved)
        else:
            advance(streams(part))
        results += [ItemResult(**r) for r in saved]
    if original in methods:
        results += question_only_results([i for i in items if i.context_type != "none"], results, original=original,
                                         name=QUESTION_ONLY)
    return items, results


def state_table(items: Sequence[ContextItem], results: Sequence[ItemResult], *, resamples: int = 2000,
                seed: int = 0) -> dict[str, dict[str, dict]]:
    """Each state's score per method: the benchmark's exact match (the first line equal to an
    alias after SQuAD's normalization, :func:`juice.text.first_line_match`, against the true
    answer in every state), juice's first-words rule beside it (an alias in the first 5 words,
    :func:`juice.data.metrics.is_correct`), the share of degenerate outputs
    (:func:`juice.eval.degeneration.is_degenerate`), each with its 95% bootstrap interval over
    the state's facts (one item a fact).

    Returns:
        state -> method (its row key) -> {"em", "first_words", "degenerate"}: interval JSON (fractions),
        plus "facts": [fact id] and "em_by_fact": [0 | 1] in that order (for paired comparisons).
    """
    state_of = {result_id(i): i.variant for i in items if i.context_type != "none"}
    answers = {result_id(i): i.memory_answers for i in items}
    table: dict[str, dict[str, dict]] = {}
    for r in results:
        state = state_of.get(r.item)
        if state is None:
            continue
        row = table.setdefault(state, {}).setdefault(r.method, {"facts": [], "em": [], "fw": [], "deg": []})
        row["facts"].append(r.subject)
        row["em"].append(first_line_match(r.output, answers[r.item]))
        row["fw"].append(is_correct(r.output, answers[r.item]))
        row["deg"].append(is_degenerate(r.output))
    out: dict[str, dict[str, dict]] = {}
    for state in (s for s in STATES if s in table):
        out[state] = {}
        for method, row in table[state].items():
            order = sorted(range(len(row["facts"])), key=lambda k: row["facts"][k])
            def interval(key: str) -> dict:
                return bootstrap_interval([row[key][k] for k in order], resamples=resamples, seed=seed).to_json()
            out[state][method] = {"em": interval("em"), "first_words": interval("fw"), "degenerate": interval("deg"),
                                  "facts": [row["facts"][k] for k in order],
                                  "em_by_fact": [int(row["em"][k]) for k in order]}
    return out


def verdict(table: Mapping[str, Mapping[str, Mapping]], *, against: Sequence[str] = ("grd",), resamples: int = 2000,
            seed: int = 0) -> dict:
    """What the measurement says (issue 90): per state the best method by exact match (of tied
    methods, the first in the table's order) and the methods whose paired 95% interval of the
    difference with it reaches 0 ("within", ties included, in the order of their titles); the
    methods within on every state; and each method's paired difference with `against` (GRD)
    per state. Methods as `table` names them (row keys: :func:`state_table`).

    Raises:
        ValueError: a state whose methods were scored on different facts.
    """
    out: dict[str, Any] = {"best": {}, "within": {}, "versus": {}}
    for state, rows in table.items():
        facts = {m: tuple(r["facts"]) for m, r in rows.items()}
        if len(set(facts.values())) > 1:
            raise ValueError(f"{state}: methods were scored on different facts")
        order = list(rows)   # the table's order: a tie goes to the method listed first
        best = min(rows, key=lambda m: (-(rows[m]["em"]["mean"] or 0.0), order.index(m)))
        out["best"][state] = best
        out["within"][state] = sorted((m for m in rows if m == best or paired_difference_interval(
            rows[m]["em_by_fact"], rows[best]["em_by_fact"], resamples=resamples, seed=seed).high >= 0), key=row_title)
        for ref in against:
            if ref not in rows:
                continue
            for m in rows:
                if m != ref:
                    out["versus"].setdefault(f"{m} - {ref}", {})[state] = paired_difference_interval(
                        rows[m]["em_by_fact"], rows[ref]["em_by_fact"], resamples=resamples, seed=seed).to_json()
    common = set.intersection(*(set(w) for w in out["within"].values())) if out["within"] else set()
    out["within_every_state"] = sorted(common, key=row_title)
    return out


def titled_verdict(v: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`verdict`'s result with every method by its title (:func:`juice.methods.row_title`):
    the record's form."""
    return {"best": {s: row_title(m) for s, m in v["best"].items()},
            "within": {s: [row_title(m) for m in ms] for s, ms in v["within"].items()},
            "versus": {row_title(d): cells for d, cells in v["versus"].items()},
            "within_every_state": [row_title(m) for m in v["within_every_state"]]}


VALIDATION_SHARE = 1 / 3
"""The share of facts `auto` is tuned on (:func:`fact_split`); the rest are scored."""

DEFAULT_METHODS = ("original", "prompt", "cad", "adacad", "ckplug", "cocoa", "coiecd", "grd", "june", "juice")
"""What :func:`run_benchmark` decodes by default (and `auto`, tuned on the validation facts)."""


def fact_split(fact_id: str, share: float = VALIDATION_SHARE, seed: int = 0) -> str:
    """"validation" (a `share` of the facts) or "test", by a hash of the seed and the fact's id
    (so it does not depend on the model, its labels or the other facts)."""
    digest = hashlib.sha256(f"{seed}/{fact_id}".encode()).digest()
    return "validation" if int.from_bytes(digest[:8], "little") / 2 ** 64 < share else "test"


def run_benchmark(lm: LoadedModel, facts: Sequence[TriStateFact], artifacts: Sequence[HeadsArtifact], out: str | Path,
                  *, names: Sequence[str] = DEFAULT_METHODS, auto: bool = True, priors: Mapping[str, str] | None = None,
                  share: float = VALIDATION_SHARE, seed: int = 0, limit: int | None = None, chunk: int = STATE_CHUNK,
                  max_rows: int | str = 64, resamples: int = 2000, progress: Progress = no_progress) -> dict[str, Any]:
    """TriState-Bench on one model, end to end (issue 90): its GAPS screening (:func:`screen`, the
    facts with a passage), its three states (:func:`juice.data.tristate.build_states`), the facts
    split by :func:`fact_split`, `auto` tuned on the validation facts' items
    (:func:`juice.when_to_steer.auto_tuning.tune_auto`, into the parametric heads file, in
    memory), and every method scored on the test facts (:func:`measure`, :func:`state_table`,
    :func:`verdict`). Every stage is saved under `out` as it ends (the screening per round and
    chunk of facts, auto's policy, the measurement per chunk): a killed run resumes.

    Args:
        facts: the pool (:func:`juice.data.tristate.load_tristate`).
        artifacts: heads files, one per direction at most; auto is tuned into the parametric one
            (its `tuned` replaced: pass a copy to keep yours).
        names: methods of :data:`juice.methods.REGISTRY` (auto: set `auto`).
        priors: fact id -> GAPS label, to skip the screening (a screening record's labels).
        limit: the first N test (and validation) facts of each state only.

    Returns:
        {"counts" (the screening's, :func:`screening_counts`; None with `priors`), "states"
        (per state: facts in all, validation, test), "auto" (the tuned policy), "table"
        (:func:`state_table`), "verdict" (:func:`verdict`), "facts" (per state, the test facts in
        the table's order)}.

    Raises:
        ValueError: no parametric heads file while `auto` is set; what :func:`measure` raises.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    counts = None
    if priors is None:
        screened = [f for f in facts if f.right_passage is not None]
        records: dict[str, dict] = {}
        for start in range(0, len(screened), 200):
            records.update(screen(lm, screened[start:start + 200], seed=seed, max_rows=max_rows, progress=progress,
                                  checkpoint=out / "screening" / f"chunk-{start // 200:03d}.json"))
        priors = {fid: r["prior"] for fid, r in records.items()}
        counts = screening_counts(records, screened)
    states = build_states(facts, priors)
    halves = {s: {h: [i for i in items if fact_split(i.fact.fact_id, share, seed) == h][:limit]
                  for h in ("validation", "test")} for s, items in states.items()}
    names = list(names)
    policy = None
    if auto:
        target = next((a for a in artifacts if str(a.direction) == "parametric"), None)
        if target is None:
            raise ValueError("auto is tuned into the parametric heads file: give one (or leave auto out)")
        scope = {"model": lm.fingerprint(), "heads": target.to_json(), "share": share, "seed": seed, "limit": limit,
                 "facts": {s: [i.fact.fact_id for i in h["validation"]] for s, h in halves.items()}}
        fits = UnitCheckpoint(out / "auto.json", scope)   # another model, heads file or split: tuned again
        if fits.get("auto") is None:
            tuning = context_items({s: h["validation"] for s, h in halves.items()}, none=True).items
            tune_auto(lm, target, tuning, max_rows=max_rows,
                      where={"source": "tristate", "split": "validation", "share": share, "seed": seed},
                      on_progress=progress(f"auto: tuning on {len(tuning)} validation items",
                                           len(candidate_methods(lm, target)) * len(tuning)))
            fits.put("auto", dict(target.tuned.auto))
        target.tuned = target.tuned.with_record("auto", fits.get("auto"))
        policy = dict(target.tuned.auto)
        names.append("auto")
    items, results = measure(lm, {s: h["test"] for s, h in halves.items()}, artifacts, names, chunk=chunk,
                             checkpoint=out / "measurement.json", max_rows=max_rows, progress=progress)
    table = state_table(items, results, resamples=resamples, seed=seed)
    return {"counts": counts,
            "states": {s: {"all": len(v), "validation": len(halves[s]["validation"]), "test": len(halves[s]["test"])}
                       for s, v in states.items()},
            "auto": policy, "table": {s: {row_title(m): row for m, row in rows.items()} for s, rows in table.items()},
            "verdict": titled_verdict(verdict(table, resamples=resamples, seed=seed)),
            "facts": {s: next(iter(rows.values()))["facts"] for s, rows in table.items()}}


def benchmark_markdown(result: Mapping[str, Any]) -> str:
    """The result's table: per method, each state's exact match (%, 95% interval) and the share of
    degenerate outputs; a row per method in the table's order; n facts in each header."""
    table = result["table"]
    states = list(table)
    methods = list(dict.fromkeys(m for rows in table.values() for m in rows))

    def cell(row: Mapping | None, key: str) -> str:
        if row is None or row[key]["n"] == 0:
            return "–"
        c = row[key]
        return f"{100 * c['mean']:.1f} [{100 * c['low']:.1f}, {100 * c['high']:.1f}]"

    header = " | ".join(f"{s} EM (n={next(iter(table[s].values()))['em']['n']})" for s in states)
    lines = [f"| method | {header} | degenerate, % ({', '.join(states)}) |", "|---|" + "---|" * (len(states) + 1)]
    for m in methods:
        deg = ", ".join("–" if m not in table[s] else f"{100 * table[s][m]['degenerate']['mean']:.0f}" for s in states)
        lines.append(f"| {m} | " + " | ".join(cell(table[s].get(m), "em") for s in states) + f" | {deg} |")
    return "\n".join(lines)


SENTENCES = ("juice", "june", "auto")
"""The methods whose paired differences with GRD :func:`verdict_markdown` states."""


def verdict_markdown(result: Mapping[str, Any], against: str = "GRD") -> str:
    """The verdict in sentences: each state's best method by exact match and those within its
    interval, the methods within on every state, and JuICE's, JuNE's and auto's rows against
    `against` (paired differences in points with their 95% intervals). `result`: a record
    (:func:`run_benchmark`'s; methods by title)."""
    v = result["verdict"]
    lines = [f"- {state}: best {best}; within its interval: {', '.join(v['within'][state])}"
             for state, best in v["best"].items()]
    every = ", ".join(v["within_every_state"]) or "none"
    lines.append(f"- within the best's interval on every state: {every}")
    for name, per_state in v["versus"].items():
        method, _, ref = name.partition(" - ")
        if getattr(row_of(method), "method", None) not in SENTENCES or ref != against:
            continue
        cells = "; ".join(f"{state} {100 * c['mean']:+.1f} [{100 * c['low']:+.1f}, {100 * c['high']:+.1f}]"
                          for state, c in per_state.items())
        lines.append(f"- {name}: {cells}")
    return "\n".join(lines)


__all__ = ["DEFAULT_METHODS", "MAX_NEW_TOKENS", "STATE_CHUNK", "VALIDATION_SHARE", "benchmark_markdown", "fact_split",
           "verdict_markdown", "titled_verdict",
           "measure", "run_benchmark", "sample_seed", "screen", "screening_counts", "state_table",
           "verdict"]
