"""When to steer: the same question with a gold, a conflicting, an irrelevant or no context.

A retrieval system cannot know whether its passage agrees with the truth, contradicts the
model, is about something else, or is missing. These builders turn the paper's items into all
four, so that a method's effect can be read on each (CUB, the context utilisation benchmark, ACL
2026, crosses CounterFact, NQ and DRUID with gold, conflicting and irrelevant contexts likewise).

One underlying item per **distinct question** (:func:`question_key`): NQ-Swap's 4,746 rows hold
1,667 questions, and the gold and none prompts of one question's rows are the same text, so rows
of one question are not independent items. A builder keeps one row per question, chosen with a
seeded generator (:func:`one_per_question`); every row may still lend its passage to another
question's irrelevant item.

From NQ-Swap rows (:func:`nqswap_context_items`):

- *gold*: `org_context` (the original passage); its answer is `org_answer`;
- *conflicting*: `sub_context` (the entity substituted); the context answer is `sub_answer`, the
  memory answer `org_answer`;
- *irrelevant*: another question's `org_context` with this row's question; the right answer is
  `org_answer`, and the answer that passage states (the other row's `org_answer`) counts as
  "followed the context";
- *distractor*: the other question's `org_context` that BM25 (`bm25s`, the question against every
  other passage of the same half) ranks highest among those that state neither this row's answer nor
  any alias (nor part of one, nor one that holds it: :func:`answers_overlap`), with this row's
  question: the passage a retriever would return and get wrong; the right answer is `org_answer`,
  the passage's own answer counts as "followed the context";
- *none*: the question alone.

From ParaConflict items (:func:`paraconflict_context_items`; built-in domains or the authors' files):

- *none*: the clean prompt;
- *conflicting*: the substitution and the coherent prompt (two items, `variant` says which);
- *gold*: the coherent prompt with the distractor replaced by the true answer, on word
  boundaries; skipped (and counted) where the distractor does not occur verbatim, or where it
  still occurs after the replacement (a true answer that contains it);
- *irrelevant*: another item's coherent passage (its context, without its own question: the text
  before its last "Question:") before this item's clean prompt; the passage states the other
  item's *distractor*, so that is the irrelevant item's context answer; skipped (and counted)
  where no item fits.
- *distractor* (`variant` "other_relation"): a real passage about the same subject and another
  relation (the related domain's item for the same subject, :data:`RELATED_DOMAINS`: its coherent
  passage with its distractor replaced by its true answer, stating that answer). Where the data
  has none, the question has no distractor item, skipped and counted: every question of Athlete
  Sport and Book Author (no domain shares their subjects), and a question whose subject the
  related domain lacks or whose related passage states this item's answer.

The partner of an irrelevant item (the item lending its passage) is drawn with a seeded generator
among those that ask another question, whose passage states its own answer (the one recorded as
the context answer), and whose passage states neither this item's true answer nor any of its
aliases (word-bounded, normalized: :func:`juice.text.contains_answer`), nor records a context
answer that normalizes like one of them: copying an irrelevant passage must never score as the
true answer.

Two objectives score an output (:func:`juice.eval.verdicts.context_verdicts`): **use relevant
context** (gold and conflicting: the context's answer; irrelevant, distractor and none: the
memory answer) and **trust memory** (the memory answer everywhere).
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from juice.data.metrics import CONTEXT_ITEM, metric_named
from juice.data.nqswap import context_prompt, question_prompt, read_records, strip_markup
from juice.data.records import ConflictExample
from juice.text import contains_answer, normalize_answer

CONTEXT_TYPES: tuple[str, ...] = ("gold", "conflicting", "irrelevant", "distractor", "none")
"""The contexts a question can come with, in the order of the tables."""

RELATED_DOMAINS: dict[str, str] = {"world_capital": "official_language", "official_language": "world_capital",
                                   "company_headquarter": "company_founder", "company_founder": "company_headquarter"}
"""ParaConflict domains whose subjects are the other's (a country: its capital, its language; a
company: its headquarters, its founder): a distractor about the same subject and another relation
comes from there. Athlete Sport and Book Author have none."""


DISTRACTOR_DEPTH = 100
"""BM25's ranks read per question for a distractor that states neither its answer nor an alias."""

RELEVANT_TYPES: tuple[str, ...] = ("gold", "conflicting")
"""The context types whose passage answers the question (use it); the others' (irrelevant,
distractor) do not (ignore it: the memory answer is right)."""

OBJECTIVES: tuple[str, ...] = ("use_relevant", "trust_memory")
"""What an output is scored against: the relevant context's answer (CUB's objective), or memory."""


@dataclass(frozen=True)
class ContextItem:
    """One question under one context type.

    Attributes:
        source: "nqswap", a ParaConflict domain (e.g. "world_capital"), or your dataset's label.
        uid: the underlying item's id (the same for each of its context types).
        context_type: one of :data:`CONTEXT_TYPES`.
        prompt: the full prompt, ending right before the answer.
        question: the prompt without any context (CAD's second branch; equal to `prompt` for none).
        memory_answers: the true (parametric) answer and its aliases.
        context_answers: the answer the passage gives (gold: the true one; conflicting: the
            substituted one; irrelevant and distractor: the other passage's); empty for none and
            for a distractor that states no answer.
        metric: a metric of :data:`juice.data.metrics.METRICS` for these items: "first_words" (the
            paper's exact match in the first 5 words, ParaConflict) or "nqswap" (NQ-Swap).
        variant: for ParaConflict's conflicting items, "substitution" or "coherent"; for a
            distractor, "bm25", "other_relation" or "no_answer"; else "".
        partner: for an irrelevant or distractor item, the uid of the item whose passage it
            carries (a related domain's item: "<domain>/<uid>"); else "".
    """

    source: str
    uid: str
    context_type: str
    prompt: str
    question: str
    memory_answers: tuple[str, ...]
    context_answers: tuple[str, ...] = ()
    metric: str = "first_words"
    variant: str = ""
    partner: str = ""

    def __post_init__(self) -> None:
        if self.context_type not in CONTEXT_TYPES:
            raise ValueError(f"context type must be one of {', '.join(CONTEXT_TYPES)}, not {self.context_type!r}")
        metric_named(self.metric, CONTEXT_ITEM)
        if not self.memory_answers or not all(a.strip() for a in self.memory_answers):
            raise ValueError(f"{self.source}/{self.uid}: empty memory answer")
        if self.context_type == "none" and self.context_answers:
            raise ValueError(f"{self.source}/{self.uid}: a none item has no context answer")
        if self.context_type not in ("none", "distractor") and not self.context_answers:
            article = "an" if self.context_type[0] in "aeiou" else "a"
            raise ValueError(f"{self.source}/{self.uid}: {article} {self.context_type} item needs a context answer")

    def target(self, objective: str) -> tuple[str, ...]:
        """The answers that count as right under `objective` (:data:`OBJECTIVES`).

        Raises:
            ValueError: an unknown objective.
        """
        if objective == "use_relevant":
            return self.context_answers if self.context_type in RELEVANT_TYPES else self.memory_answers
        if objective == "trust_memory":
            return self.memory_answers
        raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, not {objective!r}")


@dataclass
class ContextItems:
    """Items of every context type, and what could not be built.

    Attributes:
        items: the items, grouped by underlying item, in :data:`CONTEXT_TYPES` order.
        skipped: context type -> uids of the underlying items that have no item of that type.
    """

    items: list[ContextItem] = field(default_factory=list)
    skipped: dict[str, list[str]] = field(default_factory=lambda: {t: [] for t in CONTEXT_TYPES})

    def of_type(self, context_type: str) -> list[ContextItem]:
        return [i for i in self.items if i.context_type == context_type]

    def counts(self) -> dict[str, int]:
        """Context type -> items built."""
        return {t: len(self.of_type(t)) for t in CONTEXT_TYPES}


def _normalized(answers: Iterable[str]) -> set[str]:
    return {a for a in (normalize_answer(x) for x in answers) if a}


def question_key(question: str) -> str:
    """The text that identifies a question across rows: lower case, "?" dropped, white space
    collapsed (NQ-Swap's rows of one question differ at most in those).

    >>> question_key("Question: Who wrote  Hamlet?\\nAnswer:")
    'question: who wrote hamlet answer:'
    """
    return " ".join(question.lower().replace("?", " ").split())


SPLITS: tuple[str, ...] = ("validation", "test")
"""The two halves of a context-type evaluation's questions (:func:`split_of`)."""


def split_of(question: str, seed: int = 0) -> str:
    """"validation" or "test" for a question, the same for every row, source and context type
    that asks it: the first 8 bytes of SHA-256 of `"{seed}:{question_key(question)}"`, read as
    an unsigned big-endian integer, below 2**63 give "validation" (half the questions, in
    expectation), else "test". Stable across processes, machines and Python versions (no
    `hash()`), so validation and test never share a question.

    >>> split_of("Question: Who wrote Hamlet?\\nAnswer:") == split_of("question:  who wrote hamlet \\nanswer:")
    True
    >>> " ".join(split_of("Who painted the Mona Lisa", seed) for seed in range(3))
    'test test validation'
    """
    digest = hashlib.sha256(f"{seed}:{question_key(question)}".encode("utf-8")).digest()
    return "validation" if int.from_bytes(digest[:8], "big") < 2 ** 63 else "test"


def one_per_question(keys: Sequence[str], seed: int) -> list[int]:
    """Indices of one row per distinct key, in the order keys first appear; among a key's rows
    the kept one is drawn with `random.Random(seed)` (one draw per key, in that order).

    >>> one_per_question(["a", "b", "a", "c"], seed=0) in ([0, 1, 3], [2, 1, 3])
    True
    """
    groups: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    rng = random.Random(seed)
    return [rng.choice(rows) for rows in groups.values()]


@dataclass(frozen=True)
class _Lender:
    """A passage that can serve as another question's irrelevant context."""

    uid: str
    key: str
    passage: str
    states: tuple[str, ...]   # the answer the passage gives


def _partners(takers: Sequence[tuple[str, tuple[str, ...]]], lenders: Sequence[_Lender | None],
              seed: int) -> list[_Lender | None]:
    """Per taker (question key, true answers), a lender (module docstring's rule), drawn with a
    seeded generator: up to 64 random draws, then a scan of every candidate; None if none fits."""
    rng = random.Random(seed)
    usable = [lend for lend in lenders if lend is not None and contains_answer(lend.passage, lend.states)]
    out: list[_Lender | None] = []
    for key, answers in takers:
        def fits(lend: _Lender) -> bool:
            return (lend.key != key and not answers_overlap(lend.states, answers)
                    and not contains_answer(lend.passage, answers))

        found = next((lend for lend in (rng.choice(usable) for _ in range(64 if usable else 0)) if fits(lend)), None)
        if found is None:
            choices = [lend for lend in usable if fits(lend)]
            found = rng.choice(choices) if choices else None
        out.append(found)
    return out


def _bm25_partners(takers: Sequence[tuple[str, str, tuple[str, ...]]],
                   lenders: Sequence[_Lender | None]) -> list[_Lender | None]:
    """Per taker (question key, question text, true answers), the lender whose passage BM25 ranks
    highest for the question (`bm25s`'s Okapi BM25, English stop words dropped) among those that
    fit the module docstring's rule (another question; states neither the answer nor an alias),
    within the first :data:`DISTRACTOR_DEPTH` ranks; None if none fits there."""
    from juice.extras import require

    require("contexts", "the distractor context type (BM25)")
    import bm25s

    usable = [lend for lend in lenders if lend is not None and contains_answer(lend.passage, lend.states)]
    if not usable or not takers:
        return [None] * len(takers)
    index = bm25s.BM25()
    index.index(bm25s.tokenize([lend.passage for lend in usable], stopwords="en", show_progress=False),
                show_progress=False)
    ranked, _ = index.retrieve(bm25s.tokenize([q for _, q, _ in takers], stopwords="en", show_progress=False),
                               k=min(DISTRACTOR_DEPTH, len(usable)), show_progress=False)
    out: list[_Lender | None] = []
    for (key, _, answers), row in zip(takers, ranked):
        out.append(next((usable[int(j)] for j in row if usable[int(j)].key != key
                         and not answers_overlap(usable[int(j)].states, answers)
                         and not contains_answer(usable[int(j)].passage, answers)), None))
    return out


def answers_overlap(states: Sequence[str], answers: Sequence[str]) -> bool:
    """Whether a passage's answer and a question's true answers share an answer on word
    boundaries, either way round: one holds the other ("Ford" and "Henry Ford"), not only equal
    after normalization; a distractor stating part of the true answer is no distractor (issue 77)."""
    return (any(contains_answer(stated, answers) for stated in states)
            or any(contains_answer(answer, states) for answer in answers))


def _in_split(question: str, split: str | None, seed: int) -> bool:
    if split is not None and split not in SPLITS:
        raise ValueError(f"--split takes {' or '.join(SPLITS)}, not {split!r}")
    return split is None or split_of(question, seed) == split


def nqswap_folder_items(folder: str | Path, seed: int = 0, test_uids: Sequence[str] | None = None,
                        fits: Callable[[str], bool] | None = None) -> list[ContextItem]:
    """NQ-Swap's questions under every context type, from its folder (its
    :class:`juice.data.contextual.ContextualDataset` entry's `context_items`).

    Args:
        folder: NQ-Swap's folder (or file) under the data root (:func:`juice.data.nqswap.read_records`).
        seed: as :func:`nqswap_context_items`.
        test_uids: None: every row's questions (the harness tasks). Otherwise the test split's row
            numbers: one item per distinct question among them, its partners drawn among the rows
            whose original and substituted prompts `fits` allows (a test question's other rows are
            left out, so the row kept for it is one of its test rows); uids and partners are row
            numbers of the file.
        fits: `prompt -> bool` (e.g. at most 256 tokens); None keeps every row.

    Raises:
        FileNotFoundError, ValueError: as :func:`juice.data.nqswap.read_records`.
    """
    rows = read_records(folder)
    if test_uids is None:
        return list(nqswap_context_items(rows, seed).items)
    wanted = set(test_uids)
    ok = [fits is None or all(fits(context_prompt(r[c], r["question"])) for c in ("org_context", "sub_context"))
          or str(i) in wanted for i, r in enumerate(rows)]
    questions = {question_key(rows[int(u)]["question"]) for u in test_uids}
    index = [i for i, keep in enumerate(ok) if keep
             and (str(i) in wanted or question_key(rows[i]["question"]) not in questions)]
    built = nqswap_context_items([rows[i] for i in index], seed)
    out = []
    for item in built.items:   # uids back to row numbers, partners too
        uid = str(index[int(item.uid)])
        partner = str(index[int(item.partner)]) if item.partner else ""
        if question_key(rows[int(uid)]["question"]) in questions:
            out.append(replace(item, uid=uid, partner=partner))
    return out


def nqswap_context_items(records: Sequence[Mapping], seed: int = 0, split: str | None = None) -> ContextItems:
    """The context types of NQ-Swap rows (module docstring): one item per distinct question.

    Args:
        records: NQ-Swap rows (`question`, `org_context`, `org_answer`, `sub_context`,
            `sub_answer`), e.g. :func:`juice.data.nqswap.read_records`; an item's uid is the
            index of the row kept for its question (:func:`one_per_question`).
        seed: draws the row kept per question and the irrelevant passages, and splits.
        split: "validation" or "test": only the rows of that half's questions
            (:func:`split_of` of the question prompt), and only they lend passages, so nothing
            of the other half's questions enters; None: every row.

    Raises:
        ValueError: a row misses a field or holds one that is not text (the message names
            the row); an unknown split.
    """
    rows = []
    for i, r in enumerate(records):
        try:
            org = [r["org_answer"]] if isinstance(r["org_answer"], str) else list(r["org_answer"])
            sub = [r["sub_answer"]] if isinstance(r["sub_answer"], str) else list(r["sub_answer"])
            fields = (r["question"], r["org_context"], r["sub_context"], *org, *sub)
        except (KeyError, TypeError) as err:
            raise ValueError(f"NQ-Swap row {i}: missing field {err}") from None
        if not all(isinstance(t, str) and t.strip() for t in fields) or not org or not sub:
            raise ValueError(f"NQ-Swap row {i}: question, contexts and answers must be non-empty text")
        if _in_split(question_prompt(r["question"]), split, seed):
            rows.append((str(i), r["question"], r["org_context"], r["sub_context"], tuple(org), tuple(sub)))
    keys = [question_key(r[1]) for r in rows]
    kept = one_per_question(keys, seed)
    lenders = [_Lender(uid, key, strip_markup(org_context), org)
               for (uid, _, org_context, _, org, _), key in zip(rows, keys)]
    partners = _partners([(keys[k], rows[k][4]) for k in kept], lenders, seed)
    distractors = _bm25_partners([(keys[k], rows[k][1], rows[k][4]) for k in kept], lenders)
    out = ContextItems()
    for k, partner, distractor in zip(kept, partners, distractors):
        uid, question, org_context, sub_context, org, sub = rows[k]
        common = dict(source="nqswap", uid=uid, question=question_prompt(question), memory_answers=org,
                      metric="nqswap")
        out.items.append(ContextItem(context_type="gold", prompt=context_prompt(org_context, question),
                                     context_answers=org, **common))
        out.items.append(ContextItem(context_type="conflicting", prompt=context_prompt(sub_context, question),
                                     context_answers=sub, **common))
        _irrelevant_distractor_and_none(out, question, partner, distractor, common)
    return out


def _irrelevant_distractor_and_none(out: "ContextItems", question: str, partner: _Lender | None,
                                    distractor: _Lender | None, common: dict) -> None:
    """Append a question-and-passage item's irrelevant item (the partner's passage before this
    question), its distractor (BM25's passage; each skipped and counted without one) and its none
    item, in NQ-Swap's prompt format."""
    for kind, lender, variant in (("irrelevant", partner, ""), ("distractor", distractor, "bm25")):
        if lender is None:
            out.skipped[kind].append(common["uid"])
        else:
            out.items.append(ContextItem(context_type=kind, prompt=context_prompt(lender.passage, question),
                                         context_answers=lender.states, partner=lender.uid, variant=variant,
                                         **common))
    out.items.append(ContextItem(context_type="none", prompt=question_prompt(question), **common))


def _answers(value, where: str, field: str) -> tuple[str, ...]:
    out = [value] if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else []
    if not out or not all(isinstance(a, str) and a.strip() for a in out):
        raise ValueError(f"{where}: {field} must be non-empty text (or a list of it)")
    return tuple(out)


def user_context_items(rows: Sequence[Mapping], seed: int = 0, source: str = "rows",
                       split: str | None = None) -> ContextItems:
    """The context types of your own rows: each has `question`, `context` (its passage),
    `answer` (the true answer, or a list of accepted forms) and optionally `context_answer`
    (what the passage says, where it contradicts `answer`). The row's passage is *gold* when it
    has no `context_answer` (or one equal to `answer`), else *conflicting*; *irrelevant* is
    another question's passage (drawn, seeded, by the module docstring's rule; it states that
    row's `context_answer`, else its `answer`) with this question; *distractor* the other
    question's passage BM25 ranks highest for it (NQ-Swap's rule); *none* the question alone.
    One item per distinct question (:func:`one_per_question`). Prompts are NQ-Swap's format
    (`Context: ...\nQuestion: ...\nAnswer:`), scored by NQ-Swap's normalized substring match;
    row i's uid is "i". `split` keeps one half's questions, as :func:`nqswap_context_items`.

    Raises:
        ValueError: a row without a question, context or answer (the message names the row);
            an unknown split.
    """
    parsed = []
    for i, r in enumerate(rows):
        where = f"row {i + 1}"
        if not isinstance(r, Mapping):
            raise ValueError(f"{where}: not an object")
        for key in ("question", "context"):
            if not isinstance(r.get(key), str) or not r[key].strip():
                raise ValueError(f"{where}: {key} must be non-empty text")
        true = _answers(r.get("answer"), where, "answer")
        said = true if r.get("context_answer") in (None, "", []) else _answers(r["context_answer"], where,
                                                                              "context_answer")
        kind = "gold" if _normalized(said) & _normalized(true) else "conflicting"
        if _in_split(question_prompt(r["question"]), split, seed):
            parsed.append((str(i), r["question"], r["context"], true, said, kind))
    keys = [question_key(p[1]) for p in parsed]
    kept = one_per_question(keys, seed)
    lenders = [_Lender(uid, key, strip_markup(context), said)
               for (uid, _, context, _, said, _), key in zip(parsed, keys)]
    partners = _partners([(keys[k], parsed[k][3]) for k in kept], lenders, seed)
    distractors = _bm25_partners([(keys[k], parsed[k][1], parsed[k][3]) for k in kept], lenders)
    out = ContextItems()
    for k, partner, distractor in zip(kept, partners, distractors):
        uid, question, context, true, said, kind = parsed[k]
        common = dict(source=source, uid=uid, question=question_prompt(question), memory_answers=true,
                      metric="nqswap")
        out.items.append(ContextItem(context_type=kind, prompt=context_prompt(context, question),
                                     context_answers=said, **common))
        out.skipped["conflicting" if kind == "gold" else "gold"].append(uid)
        _irrelevant_distractor_and_none(out, question, partner, distractor, common)
    return out


def coherent_passage(example: ConflictExample) -> str | None:
    """The coherent prompt's passage without its question: the text before its last
    "Question:", else before the clean prompt where the coherent prompt ends with it; None if
    neither (then the item has no irrelevant passage to lend)."""
    coherent = example.prompts["coherent"]
    at = coherent.rfind("Question:")
    if at > 0:
        return coherent[:at].strip() or None
    clean = example.prompts["clean"]
    if coherent.endswith(clean) and len(coherent) > len(clean):
        return coherent[: -len(clean)].strip() or None
    return None


def _with_true_answer(text: str | None, example: ConflictExample) -> str | None:
    """`text` with every word-bounded occurrence of the item's distractor replaced by its true
    answer; None where there is no text, the distractor does not occur, or it still occurs
    afterwards (a true answer that contains it)."""
    if text is None:
        return None
    pattern = re.compile(rf"(?<!\w){re.escape(example.context_answer)}(?!\w)")
    if not pattern.search(text):
        return None
    gold = pattern.sub(lambda _: example.answer, text)
    return None if pattern.search(gold) else gold


def gold_passage(example: ConflictExample) -> str | None:
    """The coherent passage (:func:`coherent_passage`) with the distractor replaced by the true
    answer on word boundaries: a true passage about the item's subject and relation; None where
    there is no passage or the distractor does not occur in it (or survives the replacement)."""
    return _with_true_answer(coherent_passage(example), example)


def gold_prompt(example: ConflictExample) -> str | None:
    """The coherent prompt with every word-bounded occurrence of the distractor replaced by the
    true answer; None where the distractor does not occur, or still occurs afterwards."""
    return _with_true_answer(example.prompts["coherent"], example)


def paraconflict_context_items(examples: Sequence[ConflictExample], seed: int = 0,
                               split: str | None = None, related: Sequence[ConflictExample] = ()) -> ContextItems:
    """The context types of ParaConflict items (module docstring), one domain or several (an
    irrelevant passage comes from the same domain, a distractor about another relation from the
    related domain, :data:`RELATED_DOMAINS`); one item per distinct clean prompt.

    Args:
        examples: the items (:func:`juice.data.paraconflict.build_domain`,
            :func:`juice.data.paraconflict.load_paraconflict_json`).
        seed: draws the item kept per question and the irrelevant passages, and splits.
        split: one half's questions (:func:`split_of` of the clean prompt), as
            :func:`nqswap_context_items`; a related domain's passage comes from the same half.
        related: more items that only lend their passages as distractors (the related domains
            of `examples`' domains, where those are not among `examples`).

    Raises:
        ValueError: an unknown split.
    """
    out = ContextItems()
    by_domain: dict[str, list[ConflictExample]] = {}
    for ex in examples:
        if _in_split(ex.prompts["clean"], split, seed):
            by_domain.setdefault(ex.domain, []).append(ex)
    about: dict[tuple[str, str], ConflictExample] = {}   # (domain, subject) -> an item lending its gold passage
    for ex in [*examples, *related]:
        if _in_split(ex.prompts["clean"], split, seed):
            about.setdefault((ex.domain, ex.subject), ex)
    for domain, every in by_domain.items():
        keys = [question_key(ex.prompts["clean"]) for ex in every]
        lenders = [None if (p := coherent_passage(ex)) is None else _Lender(ex.uid, key, p, (ex.context_answer,))
                   for ex, key in zip(every, keys)]
        kept = one_per_question(keys, seed)
        partners = _partners([(keys[k], every[k].answers) for k in kept], lenders, seed)
        for k, partner in zip(kept, partners):
            ex = every[k]
            common = dict(source=domain, uid=ex.uid, question=ex.prompts["clean"], memory_answers=ex.answers)
            gold = gold_prompt(ex)
            if gold is None:
                out.skipped["gold"].append(ex.uid)
            else:
                out.items.append(ContextItem(context_type="gold", prompt=gold, context_answers=ex.answers, **common))
            for variant in ("substitution", "coherent"):
                out.items.append(ContextItem(context_type="conflicting", prompt=ex.prompts[variant],
                                             context_answers=(ex.context_answer,), variant=variant, **common))
            if partner is None:
                out.skipped["irrelevant"].append(ex.uid)
            else:
                out.items.append(ContextItem(context_type="irrelevant", prompt=f"{partner.passage} {ex.prompts['clean']}",
                                             context_answers=partner.states, partner=partner.uid, **common))
            other = about.get((RELATED_DOMAINS.get(domain, ""), ex.subject))
            passage = None if other is None else gold_passage(other)
            if passage is None or contains_answer(passage, ex.answers):
                out.skipped["distractor"].append(ex.uid)   # no real passage about the subject
            else:
                out.items.append(ContextItem(context_type="distractor", prompt=f"{passage} {ex.prompts['clean']}",
                                             context_answers=other.answers, variant="other_relation",
                                             partner=f"{other.domain}/{other.uid}", **common))
            out.items.append(ContextItem(context_type="none", prompt=ex.prompts["clean"], **common))
    return out


__all__ = ["CONTEXT_TYPES", "DISTRACTOR_DEPTH", "OBJECTIVES", "RELATED_DOMAINS", "ContextItem",
           "ContextItems", "SPLITS", "answers_overlap", "coherent_passage", "gold_passage", "gold_prompt",
           "nqswap_context_items", "nqswap_folder_items", "one_per_question", "paraconflict_context_items",
           "question_key", "split_of", "user_context_items"]
