"""TriState-Bench as juice data (Jiang et al., "From Context-Aware to Conflict-Aware: Generalizing
Contrastive Decoding for Knowledge Conflict in LLMs", arXiv 2606.10298; public repository
`keith-Jiang/conflict-aware-decoding`, MIT, its `data/TriState/`): the facts, their passages,
the benchmark's prompts and metric, and its GAPS screening rule, so that the three conflict
states are built for the model under test from its own prior.

The published folder (`../shared/data/tristate/`, whose README says where it comes from) holds
one pool of 3,791 facts (person, location, scientific term: `<model>/facts/*.jsonl`, with the
screened model's responses) and, per screened model, 400 inputs per state (`C_*.jsonl`, two
lines an input: the passage and the question, the question alone). A fact's passage stating its
answer ("right"), its passage stating another answer ("wrong") and that wrong answer are the same
in every model's files; :func:`load_tristate` joins them to the pool, so a fact's passages are
known where any screened model's inputs hold them: 1,683 of the 3,791 facts have a right passage
and 696 a wrong one (each of those a right one too), so a model's agreement and resistance hold at
most 696 facts and its correction at most 1,683.

The three states of a model (:func:`build_states`), from its prior label (:func:`gaps_label`):

- **correction**: the model's prior is wrong (P_wrong), the passage states the right answer
  (the contextual direction);
- **resistance**: the prior is right (P_right), the passage states the wrong answer (the
  parametric direction); the gold answer stays the true one;
- **agreement**: the prior is right and the passage states the right answer (do no harm).

Agreement and resistance hold the same facts, as in the published files. Facts labelled
P_uncertain are in no state.

GAPS ("greedy-anchored prior screening"). The repository holds no screening code; the rule here
reproduces every vote, every question's verdict and every fact's label of the published
gemma-2-9b-instruct screening (103,348 votes, 3,791 facts; tested on the shared data): a response
votes right where a normalized alias occurs in it (:func:`vote`); each question is asked once
greedily (the anchor) and sampled up to 9 times more, stopping early (:func:`question_verdict`);
the three paraphrases are asked in order, stopping at the first that disagrees with the first
(:func:`gaps_label`). Its sampling temperature, prompt and token budget are not published: juice
chooses temperature 1.0 (the model's own distribution), the question-only prompt of the benchmark
(:func:`question_prompt`) and 32 new tokens, the evaluation's budget (juice.pipeline.tristate).

The benchmark's metric: the output's first line, normalized as SQuAD does, equal to a normalized
alias (:func:`juice.text.first_line_match`, the metric "tristate" of
:data:`juice.data.metrics.METRICS`); :func:`juice.text.first_line_contains` is its substring form.
A model's states become context-type items (:func:`context_items`): agreement and correction
are gold passages, resistance a conflicting one, and the benchmark's score in every state is
the "trust memory" objective's (the true answer), so juice's context-type evaluation and the
when-to-steer study run every method on them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from juice.data.context_types import ContextItem, ContextItems
from juice.io import read_jsonl
from juice.text import squad_normalize

STATES: dict[str, str] = {"correction": "C_right_P_wrong", "resistance": "C_wrong_P_right",
                          "agreement": "C_right_P_right"}
"""A state's name -> its file's stem in the published folder."""

PRIORS = ("P_right", "P_wrong", "P_uncertain")
"""GAPS's labels of a model's prior on a fact."""

ANSWER_TYPES = ("person", "location", "scientific_term")

CONTEXT_INSTRUCTION = " \nUsing only the references listed above, answer the following question: \n"
QUESTION_INSTRUCTION = "Answer the following question: \n"

SAMPLES = 9
"""Sampled responses after the greedy one, at most, per question (10 responses in all)."""


@dataclass(frozen=True)
class TriStateFact:
    """One fact of the pool.

    Attributes:
        fact_id: `person_141`, `location_1`, ...
        answer_type: one of :data:`ANSWER_TYPES`.
        answer: the canonical answer; one of `aliases`.
        aliases: every accepted answer (the benchmark's `gold_answers`).
        questions: three paraphrases, each ending in "?"; the first is the benchmark's question.
        right_passage: a passage stating `answer`; None where no screened model's files hold it.
        wrong_passage: a passage stating `wrong_answer`; None where no file holds it.
        wrong_answer: the counterfactual answer of `wrong_passage`.
    """

    fact_id: str
    answer_type: str
    answer: str
    aliases: tuple[str, ...]
    questions: tuple[str, ...]
    right_passage: str | None = None
    wrong_passage: str | None = None
    wrong_answer: str | None = None


@dataclass(frozen=True)
class TriStateItem:
    """One input of a state: a fact with the passage of that state.

    Attributes:
        state: "correction" | "resistance" | "agreement".
        fact: the fact.
        passage: the passage shown (the wrong one for resistance).
    """

    state: str
    fact: TriStateFact

    @property
    def passage(self) -> str:
        passage = self.fact.wrong_passage if self.state == "resistance" else self.fact.right_passage
        assert passage is not None, self.fact.fact_id   # build_states keeps only facts with it
        return passage

    @property
    def question(self) -> str:
        return self.fact.questions[0]

    def context_prompt(self) -> str:
        return context_prompt(self.passage, self.question)

    def question_prompt(self) -> str:
        return question_prompt(self.question)


def context_prompt(passage: str, question: str) -> str:
    """The benchmark's prompt with its passage (its files' `assigned_process` 0; raw text, no chat
    template; the question keeps its own "?" and gets another, as in the files)."""
    return f"{passage}{CONTEXT_INSTRUCTION}Question: {question} ?\nAnswer:"


def question_prompt(question: str) -> str:
    """The benchmark's prompt without a passage (its files' `assigned_process` 1)."""
    return f"{QUESTION_INSTRUCTION}Question: {question} ?\nAnswer:"


def vote(response: str, aliases: Iterable[str]) -> bool:
    """GAPS's vote: a normalized alias occurs anywhere in the normalized response (a substring,
    not a word match; the whole response, not its first line)."""
    text = squad_normalize(response)
    return any(squad_normalize(a) in text for a in aliases)


def question_verdict(votes: Sequence[bool]) -> str | None:
    """One question's GAPS verdict from its votes so far (the greedy response's first, then the
    samples'), or None while more samples are needed.

    Greedy right: "uncertain" at the 4th wrong vote, else "matched" after 10 responses (at least
    7 right). Greedy wrong: "uncertain" at the 2nd right vote, else "missed" after 10 (at most 1
    right).

    >>> question_verdict([True] * 10), question_verdict([False] * 10)
    ('matched', 'missed')
    >>> question_verdict([True, False, False, False, False]), question_verdict([False, True, True])
    ('uncertain', 'uncertain')
    >>> question_verdict([True, False]) is None
    True
    """
    if not votes:
        return None
    anchor = votes[0]
    if anchor and votes.count(False) >= 4 or not anchor and votes.count(True) >= 2:
        return "uncertain"
    if len(votes) >= SAMPLES + 1:
        return "matched" if anchor else "missed"
    return None


def gaps_label(verdicts: Sequence[str]) -> str:
    """A fact's prior from its questions' verdicts, asked in order: "P_right" where all three
    matched, "P_wrong" where all three missed, else "P_uncertain". The questions after the first
    uncertain verdict, or after the first that differs from the first question's, are not asked
    (:func:`questions_to_ask`).

    >>> gaps_label(["matched"] * 3), gaps_label(["missed"] * 3), gaps_label(["matched", "missed"])
    ('P_right', 'P_wrong', 'P_uncertain')
    """
    if len(verdicts) == 3 and all(v == "matched" for v in verdicts):
        return "P_right"
    if len(verdicts) == 3 and all(v == "missed" for v in verdicts):
        return "P_wrong"
    return "P_uncertain"


def questions_to_ask(verdicts: Sequence[str]) -> bool:
    """Whether GAPS asks the next paraphrase after `verdicts`: fewer than three asked, none
    uncertain, all equal to the first."""
    return len(verdicts) < 3 and "uncertain" not in verdicts and all(v == verdicts[0] for v in verdicts)


def _literal(value):
    """The facts files write `questions` and `responses` as Python literals inside strings."""
    return ast.literal_eval(value) if isinstance(value, str) else value


def _passage(line: Mapping) -> str:
    """A process-0 line's passage: its prompt before the benchmark's instruction.

    Raises:
        ValueError: a prompt that is not the benchmark's template.
    """
    text = line["context_string"]
    passage, sep, _ = text.partition(CONTEXT_INSTRUCTION)
    if not sep:
        raise ValueError(f"input {line.get('input_index')} ({line.get('fact_id')}): not the benchmark's prompt")
    return passage


def state_files(folder: Path) -> dict[str, dict[str, Path]]:
    """Screened model -> state -> its file, for every model folder under `folder` (the files
    sit in the model's folder or in its `data/`)."""
    found: dict[str, dict[str, Path]] = {}
    for model in sorted(p for p in folder.iterdir() if p.is_dir()):
        for state, stem in STATES.items():
            for path in (model / f"{stem}.jsonl", model / "data" / f"{stem}.jsonl"):
                if path.is_file():
                    found.setdefault(model.name, {})[state] = path
    return found


def is_tristate_folder(folder: str | Path) -> bool:
    """`folder` is TriState-Bench's `data/TriState/` (a model folder in it holds `facts/*.jsonl`)."""
    folder = Path(folder)
    return folder.is_dir() and any(folder.glob("*/facts/*.jsonl"))


def load_tristate(folder: str | Path) -> list[TriStateFact]:
    """The pool of facts, each with the passages some screened model's files hold.

    Args:
        folder: the published `data/TriState/` folder (one folder per screened model; the pool
            in the one that has `facts/*.jsonl`).

    Returns:
        Every fact of the pool, in the files' order (person, location, scientific term).

    Raises:
        FileNotFoundError: `folder` is not there, or no model folder holds `facts/*.jsonl`.
        ValueError: a line that is not JSON, a prompt that is not the benchmark's, or two
            files giving one fact different passages (the message names the fact).
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such folder (TriState-Bench's data/TriState/)")
    pools = sorted(folder.glob("*/facts/*.jsonl"))
    if not pools:
        raise FileNotFoundError(f"{folder}: no <model>/facts/*.jsonl (the pool of facts) under it")
    pool_model = pools[0].parent.parent
    right: dict[str, str] = {}
    wrong: dict[str, tuple[str, str]] = {}
    for model, files in state_files(folder).items():
        for state, path in files.items():
            for line in read_jsonl(path):
                if line.get("assigned_process") != 0:
                    continue
                fid = line["fact_id"]
                if state == "resistance":
                    got = (_passage(line), line["wrong_answer"])
                    if wrong.setdefault(fid, got) != got:
                        raise ValueError(f"{fid}: two wrong passages ({model}, {path.name})")
                else:
                    got_right = _passage(line)
                    if right.setdefault(fid, got_right) != got_right:
                        raise ValueError(f"{fid}: two right passages ({model}, {path.name})")
    facts = []
    for answer_type in ANSWER_TYPES:
        path = pool_model / "facts" / f"{answer_type}.jsonl"
        if not path.is_file():
            continue
        for row in read_jsonl(path):
            fid = row["fact_id"]
            wrong_passage, wrong_answer = wrong.get(fid, (None, None))
            facts.append(TriStateFact(fid, row["answer_type"], row["answer"], tuple(row["aliases"]),
                                      tuple(_literal(row["questions"])), right.get(fid), wrong_passage,
                                      wrong_answer))
    return facts


def published_screening(folder: str | Path) -> dict[str, dict]:
    """The published screening of the pool's model (`<model>/facts/*.jsonl`): fact id ->
    `{"responses": [[str]], "votes": [[bool]], "verdicts": [str], "prior": str}` as the files hold
    them (a skipped question has no responses and the verdict "skipped")."""
    screening = {}
    for path in sorted(Path(folder).glob("*/facts/*.jsonl")):
        for row in read_jsonl(path):
            screening[row["fact_id"]] = {"responses": _literal(row["responses"]), "votes": row["vote_details"],
                                         "verdicts": row["per_q_verdict"], "prior": row["prior_state"]}
    return screening


def context_items(states: Mapping[str, Sequence[TriStateItem]], none: bool = True) -> ContextItems:
    """A model's states (:func:`build_states`) as context-type items (:mod:`juice.data.context_types`),
    so that juice's evaluations run on them: agreement and correction a "gold" item (the passage
    states the true answer), resistance a "conflicting" one (its answer the wrong one); the state
    in `variant`, the fact's answer type in `source` (`tristate/person`, ...), metric "tristate";
    the prompt and the question alone are the benchmark's (:func:`context_prompt`,
    :func:`question_prompt`). With `none`, each fact also gets a "none" item (its question alone),
    which `auto` and the question-only baseline read.

    Returns:
        the items, state by state (in `states`' order), each fact's none item after its first.
    """
    out = ContextItems()
    seen: set[str] = set()
    for state, items in states.items():
        for item in items:
            fact = item.fact
            answers = (fact.wrong_answer,) if state == "resistance" else fact.aliases
            out.items.append(ContextItem(f"tristate/{fact.answer_type}", fact.fact_id,
                                         "conflicting" if state == "resistance" else "gold", item.context_prompt(),
                                         item.question_prompt(), fact.aliases, answers, "tristate", state))
            if none and fact.fact_id not in seen:
                out.items.append(ContextItem(f"tristate/{fact.answer_type}", fact.fact_id, "none",
                                             item.question_prompt(), item.question_prompt(), fact.aliases, (),
                                             "tristate"))
            seen.add(fact.fact_id)
    return out


def build_states(facts: Sequence[TriStateFact], priors: Mapping[str, str]) -> dict[str, list[TriStateItem]]:
    """A model's three states from its prior per fact (:func:`gaps_label`): correction, the P_wrong
    facts with a right passage; agreement and resistance, the same P_right facts, those with both
    passages (module docstring). Facts without a label, P_uncertain, or without the passage a state
    needs are in none. Items keep the pool's order.

    Returns:
        {"correction": [...], "resistance": [...], "agreement": [...]}.
    """
    correction = [TriStateItem("correction", f) for f in facts
                  if priors.get(f.fact_id) == "P_wrong" and f.right_passage is not None]
    known = [f for f in facts if priors.get(f.fact_id) == "P_right"
             and f.right_passage is not None and f.wrong_passage is not None]
    return {"correction": correction, "resistance": [TriStateItem("resistance", f) for f in known],
            "agreement": [TriStateItem("agreement", f) for f in known]}


__all__ = ["ANSWER_TYPES", "PRIORS", "SAMPLES", "STATES", "TriStateFact", "TriStateItem", "build_states",
           "context_items", "context_prompt", "gaps_label", "is_tristate_folder", "load_tristate", "published_screening", "question_prompt",
           "question_verdict", "questions_to_ask", "state_files", "vote"]
