"""The context types of a question (:mod:`juice.data.context_types`): built as described from
NQ-Swap rows and ParaConflict items (one item per distinct question, gold holds the true answer
and not the distractor, an irrelevant passage states its recorded context answer and never the
item's own, a distractor is the passage BM25 ranks highest or one about the same subject and
another relation or one stating no answer, skips are counted), split by question, and scored under
both objectives (:func:`juice.eval.verdicts.context_verdicts`)."""

from __future__ import annotations

import re

import pytest

from juice.data.context_types import (CONTEXT_TYPES, ContextItem, coherent_passage, gold_prompt,
                                      nqswap_context_items, paraconflict_context_items)
from juice.data.nqswap import read_records, strip_markup
from juice.data.paraconflict import DOMAINS, build_domain, load_paraconflict_json
from juice.data.records import ConflictExample
from juice.eval.verdicts import context_verdicts
from juice.text import contains_answer, normalize_answer

from helpers.context_rows import ROWS


def test_nqswap_rows_give_every_context_type():
    built = nqswap_context_items(ROWS, seed=0)
    assert built.counts() == {t: 5 for t in CONTEXT_TYPES} and not any(built.skipped.values())
    by = {(i.uid, i.context_type): i for i in built.items}
    for k, row in enumerate(ROWS):
        uid = str(k)
        gold, conflict, irrelevant, distractor, none = (by[uid, t] for t in CONTEXT_TYPES)
        assert distractor.partner != uid and distractor.variant == "bm25"
        assert strip_markup(row["org_context"]) in gold.prompt and gold.context_answers == tuple(row["org_answer"])
        assert strip_markup(row["sub_context"]) in conflict.prompt
        assert conflict.context_answers == tuple(row["sub_answer"]) and conflict.memory_answers == tuple(row["org_answer"])
        partner = ROWS[int(irrelevant.partner)]
        assert irrelevant.partner != uid and strip_markup(partner["org_context"]) in irrelevant.prompt
        assert row["question"] in irrelevant.prompt and irrelevant.context_answers == tuple(partner["org_answer"])
        assert normalize_answer(partner["org_answer"][0]) != normalize_answer(row["org_answer"][0])
        assert none.prompt == none.question == gold.question and "Context" not in none.prompt
    assert by["1", "irrelevant"].partner != "4"   # the other Austen row shares the answer


def test_partners_are_seeded_and_an_item_without_one_is_counted():
    assert nqswap_context_items(ROWS, seed=3) == nqswap_context_items(ROWS, seed=3)
    same = [dict(r, org_answer=["Austen"]) for r in ROWS]
    built = nqswap_context_items(same)
    assert built.skipped["irrelevant"] == ["0", "1", "2", "3", "4"] and built.counts()["irrelevant"] == 0
    assert built.skipped["distractor"] == ["0", "1", "2", "3", "4"] and built.counts()["distractor"] == 0
    with pytest.raises(ValueError, match="NQ-Swap row 0: missing field 'org_context'"):
        nqswap_context_items([{k: v for k, v in ROWS[0].items() if k != "org_context"}])


def test_paraconflict_gold_holds_the_true_answer_and_not_the_distractor():
    examples = build_domain("world_capital")
    built = paraconflict_context_items(examples)
    golds = built.of_type("gold")
    assert len(golds) + len(built.skipped["gold"]) == len(examples) and golds
    for item in golds:
        ex = next(e for e in examples if e.uid == item.uid)
        assert re.search(rf"(?<!\w){re.escape(ex.answer)}(?!\w)", item.prompt)
        assert not re.search(rf"(?<!\w){re.escape(ex.context_answer)}(?!\w)", item.prompt)
        assert item.prompt.endswith(ex.prompts["coherent"].rpartition("Answer:")[2])
    assert len(built.of_type("conflicting")) == 2 * len(examples)
    assert built.counts()["none"] == len(examples)


def _item(coherent: str, answer: str = "Kabul", distractor: str = "Astana",
          clean: str = "The capital of Afghanistan is") -> ConflictExample:
    return ConflictExample("world_capital", "Afghanistan", (answer,), distractor,
                           {"clean": clean, "substitution": f"{clean} {distractor}. {clean}", "coherent": coherent},
                           uid=f"x#{len(coherent)}")


def test_gold_is_skipped_where_the_distractor_is_absent_or_survives():
    ok = _item("Astana is the capital; Astanaville is not. Question: What is it? Answer: The capital of Afghanistan is")
    assert gold_prompt(ok).startswith("Kabul is the capital; Astanaville is not.")   # word boundaries
    assert gold_prompt(_item("It is a city. Question: Which? Answer: The capital of Afghanistan is")) is None
    assert gold_prompt(_item("Astana. Question: Which? Answer: It is", answer="New Astana")) is None
    built = paraconflict_context_items([_item("A city. Question: Which? Answer: It is", clean="The capital of Peru is"),
                                        ok])
    assert built.skipped["gold"] == ["x#38"] and built.counts()["gold"] == 1


def test_paraconflict_irrelevant_is_another_items_passage_before_this_clean_prompt():
    examples = build_domain("book_author")
    built = paraconflict_context_items(examples, seed=1)
    irrelevant = built.of_type("irrelevant")
    assert len(irrelevant) + len(built.skipped["irrelevant"]) == len(examples) and irrelevant
    by_uid = {e.uid: e for e in examples}
    for item in irrelevant:
        ex, other = by_uid[item.uid], by_uid[item.partner]
        passage = coherent_passage(other)
        assert item.prompt == f"{passage} {ex.prompts['clean']}" and "Question:" not in passage
        assert item.context_answers == (other.context_answer,) and item.memory_answers == ex.answers


def _states(passage: str, answers) -> bool:
    return contains_answer(passage, answers)


@pytest.mark.parametrize("domain", DOMAINS)
def test_an_irrelevant_passage_states_its_context_answer_and_never_this_items_answer(domain):
    """Issue 44: the partner's coherent passage states the partner's *distractor*, so that is
    what following it gives; and a passage that states this item's true answer (or an alias) is
    never lent to it, so copying an irrelevant passage never scores as right."""
    examples = build_domain(domain)
    built = paraconflict_context_items(examples, seed=0)
    assert built.of_type("irrelevant") and not built.skipped["irrelevant"]
    for item in built.of_type("irrelevant"):
        passage = item.prompt[: -len(item.question)]
        assert _states(passage, item.context_answers), (item.uid, item.context_answers)
        assert not _states(passage, item.memory_answers), (item.uid, item.memory_answers)
        assert not {normalize_answer(a) for a in item.context_answers} & {normalize_answer(a) for a in item.memory_answers}


def test_a_passage_that_states_the_true_answer_is_not_lent():
    """Two candidate lenders; the one whose passage names this item's answer (an alias, in
    another case) is never drawn, whatever the seed."""
    taker = _item("Astana rules. Question: Which? Answer: The capital of Afghanistan is", answer="Kabul")
    taker = ConflictExample(taker.domain, taker.subject, ("Kabul", "Kabol"), taker.context_answer, taker.prompts,
                            uid="taker")
    bad = _item("Lima hosts KABOL's twin city. Question: Which? Answer: The capital of Peru is", answer="Lima",
                distractor="Lima", clean="The capital of Peru is")
    good = _item("Quito is grand. Question: Which? Answer: The capital of Chile is", answer="Santiago",
                 distractor="Quito", clean="The capital of Chile is")
    for seed in range(20):
        built = paraconflict_context_items([taker, bad, good], seed=seed)
        lent = {i.uid: i.partner for i in built.of_type("irrelevant")}
        assert lent["taker"] == good.uid, seed


def test_nqswap_keeps_one_item_per_distinct_question():
    """Issue 44: NQ-Swap repeats questions (4,746 rows, 1,667 questions); one item per question,
    a seeded choice among its rows, and the other rows still lend passages."""
    rows = [dict(ROWS[0], sub_context=f"<P> Book 0 was written by Author{k} . </P>", sub_answer=[f"Author{k}"])
            for k in range(4)] + ROWS[1:]
    built = nqswap_context_items(rows, seed=0)
    nones = built.of_type("none")
    assert len(nones) == len({r["question"] for r in rows}) == 5
    assert len({i.question for i in nones}) == len(nones)
    kept = {i.uid for i in nones}
    assert len(kept & {"0", "1", "2", "3"}) == 1
    picks = {next(i.uid for i in nqswap_context_items(rows, seed=s).of_type("none")) for s in range(20)}
    assert len(picks) > 1 and picks <= {"0", "1", "2", "3"}   # seeded choice among the question's rows
    assert nqswap_context_items(rows, seed=5) == nqswap_context_items(rows, seed=5)


def test_the_split_is_by_question_and_validation_and_test_never_share_one(shared_data):
    from juice.data.context_types import split_of
    from juice.when_to_steer import context_items

    halves = {s: context_items(shared_data / "nqswap", split=s)[0] for s in ("validation", "test")}
    questions = {s: {i.question for i in built.items} for s, built in halves.items()}
    assert questions["validation"] and questions["test"] and not questions["validation"] & questions["test"]
    every = context_items(shared_data / "nqswap")[0]
    assert questions["validation"] | questions["test"] == {i.question for i in every.items}
    assert 0.4 < len(questions["validation"]) / len(questions["validation"] | questions["test"]) < 0.6
    assert all(split_of(q) == "validation" for q in questions["validation"])
    records = read_records(shared_data / "nqswap")
    for split, built in halves.items():   # irrelevant passages come from the same half's questions
        from juice.data.nqswap import question_prompt

        assert all(split_of(question_prompt(records[int(i.partner)]["question"])) == split
                   for i in built.of_type("irrelevant"))
    with pytest.raises(ValueError, match="--split takes validation or test"):
        context_items(shared_data / "nqswap", split="train")


def test_the_authors_files_split_their_coherent_passages(shared_data):
    examples = load_paraconflict_json(shared_data / "paraconflict" / "world_capital" / "unfiltered_test.json",
                                      "world_capital")
    built = paraconflict_context_items(examples)
    assert built.counts()["irrelevant"] == len(examples) and not built.skipped["irrelevant"]
    by_uid = {e.uid: e for e in examples}
    for item in built.of_type("irrelevant"):
        passage = coherent_passage(by_uid[item.partner])
        assert item.prompt == f"{passage} {by_uid[item.uid].prompts['clean']}" and "Question:" not in passage
        assert passage and by_uid[item.partner].context_answer in passage   # the partner's own distractor
    assert built.counts()["gold"] + len(built.skipped["gold"]) == len(examples)


def test_nqswap_records_from_the_shared_file(shared_data):
    records = read_records(shared_data / "nqswap")
    built = nqswap_context_items(records[:50])
    distinct = len({r["question"].strip().lower() for r in records[:50]})
    assert distinct < 50 and built.counts() == {t: distinct for t in CONTEXT_TYPES}
    every = nqswap_context_items(records)
    assert every.counts()["none"] == 1667 == len({i.question for i in every.of_type("none")})
    for item in every.of_type("irrelevant"):
        passage = item.prompt[len("Context: "): -len(item.question) - 1]
        assert contains_answer(passage, item.context_answers) and not contains_answer(passage, item.memory_answers)


def test_verdicts_follow_the_two_objectives():
    common = dict(source="s", uid="0", question="Q:", memory_answers=("Paris",), metric="nqswap")
    gold = ContextItem(context_type="gold", prompt="p", context_answers=("Paris",), **common)
    conflict = ContextItem(context_type="conflicting", prompt="p", context_answers=("Lyon",), **common)
    irrelevant = ContextItem(context_type="irrelevant", prompt="p", context_answers=("Berlin",), **common)
    none = ContextItem(context_type="none", prompt="Q:", **common)
    v = context_verdicts
    assert v(gold, " Paris.") == {"use_relevant": True, "trust_memory": True, "follows_context": True}
    assert v(conflict, " Lyon.") == {"use_relevant": True, "trust_memory": False, "follows_context": True}
    assert v(conflict, " Paris.") == {"use_relevant": False, "trust_memory": True, "follows_context": False}
    assert v(irrelevant, " Berlin.") == {"use_relevant": False, "trust_memory": False, "follows_context": True}
    assert v(irrelevant, " Paris.") == {"use_relevant": True, "trust_memory": True, "follows_context": False}
    assert v(none, " Paris") == {"use_relevant": True, "trust_memory": True, "follows_context": None}
    distractor = ContextItem(context_type="distractor", prompt="p", context_answers=("French",), **common)
    silent = ContextItem(context_type="distractor", prompt="p", **common)   # a passage stating no answer
    assert v(distractor, " French.") == {"use_relevant": False, "trust_memory": False, "follows_context": True}
    assert v(distractor, " Paris.") == {"use_relevant": True, "trust_memory": True, "follows_context": False}
    assert v(silent, " Paris.") == {"use_relevant": True, "trust_memory": True, "follows_context": False}
    with pytest.raises(ValueError, match="s/0: an irrelevant item needs a context answer"):
        ContextItem(context_type="irrelevant", prompt="p", **common)
    with pytest.raises(ValueError, match="a none item has no context answer"):
        ContextItem(context_type="none", prompt="Q:", context_answers=("x",), **common)
    with pytest.raises(ValueError, match="objective must be one of"):
        gold.target("sometimes")


def test_your_own_rows_get_the_context_types():
    from juice.data.context_types import user_context_items

    rows = [{"question": "who wrote book 0", "context": "Book 0 was written by Tolstoy.", "answer": "Tolstoy"},
            {"question": "who wrote book 1", "context": "Book 1 was written by Orwell.", "answer": ["Austen"],
             "context_answer": "Orwell"},
            {"question": "who wrote book 2", "context": "Book 2 was written by Homer.", "answer": "Homer",
             "context_answer": "homer"}]
    built = user_context_items(rows, seed=0, source="mine")
    kinds = {(i.uid, i.context_type) for i in built.items}
    assert ("0", "gold") in kinds and ("1", "conflicting") in kinds and ("2", "gold") in kinds
    assert built.skipped["gold"] == ["1"] and built.skipped["conflicting"] == ["0", "2"]
    conflict = next(i for i in built.items if i.uid == "1" and i.context_type == "conflicting")
    assert conflict.memory_answers == ("Austen",) and conflict.context_answers == ("Orwell",)
    from juice.data.nqswap import context_prompt

    assert conflict.prompt == context_prompt("Book 1 was written by Orwell.", "who wrote book 1")
    for item in built.of_type("irrelevant"):   # another row's passage, with another answer
        assert item.partner != item.uid and "Book " + item.partner in item.prompt
    assert all(i.prompt == i.question for i in built.of_type("none"))
    with pytest.raises(ValueError, match="row 2: context must be non-empty text"):
        user_context_items([rows[0], {"question": "q", "answer": "a"}])
    with pytest.raises(ValueError, match="row 1: answer must be non-empty"):
        user_context_items([{"question": "q", "context": "c", "answer": ""}])


DISTRACTOR_ROWS = [
    {"question": "who wrote the iliad", "org_context": "<P> The Iliad is an epic by Homer about Troy . </P>",
     "org_answer": ["Homer"], "sub_context": "<P> The Iliad is an epic by Virgil . </P>", "sub_answer": ["Virgil"]},
    {"question": "who wrote the odyssey", "org_context": "<P> The Odyssey , like the Iliad , is an epic by Homer . </P>",
     "org_answer": ["Homer"], "sub_context": "<P> The Odyssey is by Ovid . </P>", "sub_answer": ["Ovid"]},
    {"question": "who wrote the aeneid epic about troy", "org_context": "<P> The Aeneid , an epic of Troy , is "
     "by Virgil . </P>", "org_answer": ["Virgil"], "sub_context": "<P> The Aeneid is by Homer . </P>",
     "sub_answer": ["Homer"]},
    {"question": "what is the capital of peru", "org_context": "<P> Lima is the capital of Peru . </P>",
     "org_answer": ["Lima"], "sub_context": "<P> Cusco is the capital of Peru . </P>", "sub_answer": ["Cusco"]},
]


def test_an_nqswap_distractor_is_the_passage_bm25_ranks_highest_that_does_not_answer():
    """The Iliad's question ranks the Odyssey's passage first (it names the Iliad), but that
    passage states Homer, the Iliad's own answer: the distractor is the next, the Aeneid's (an epic
    of Troy, stating Virgil); the Aeneid's question gets the Iliad's passage (Troy, an epic)."""
    built = nqswap_context_items(DISTRACTOR_ROWS, seed=0)
    distractors = {i.uid: i for i in built.of_type("distractor")}
    assert distractors["0"].partner == "2" and distractors["0"].context_answers == ("Virgil",)
    assert distractors["2"].partner == "0" and distractors["2"].context_answers == ("Homer",)
    for item in distractors.values():
        passage = item.prompt[len("Context: "): -len(item.question) - 1]
        assert contains_answer(passage, item.context_answers) and not contains_answer(passage, item.memory_answers)


@pytest.mark.parametrize("domain", DOMAINS)
def test_a_paraconflict_distractor_is_a_real_passage_about_the_same_subject_or_none(domain):
    """No template stands in where the data has no passage about the subject (it restated the
    question, so its words were the question's, as gold's are): that question has no distractor."""
    from juice.data.context_types import RELATED_DOMAINS, gold_passage

    examples = build_domain(domain)
    related = build_domain(RELATED_DOMAINS[domain]) if domain in RELATED_DOMAINS else []
    built = paraconflict_context_items(examples, seed=0, related=related)
    other = built.of_type("distractor")
    assert all(i.variant == "other_relation" for i in other)   # no other kind
    assert len(other) + len(built.skipped["distractor"]) == len(examples)
    if domain not in RELATED_DOMAINS:
        assert not other   # Athlete Sport and Book Author: no domain with the same subjects
        return
    assert len(other) > len(examples) / 3
    lenders = {f"{e.domain}/{e.uid}": e for e in related}
    for item in other:
        lender, ex = lenders[item.partner], next(e for e in examples if e.uid == item.uid)
        assert lender.subject == ex.subject and item.prompt == f"{gold_passage(lender)} {ex.prompts['clean']}"
        passage = gold_passage(lender)
        assert contains_answer(passage, lender.answers) and not contains_answer(passage, [lender.context_answer])
        assert item.context_answers == lender.answers and not contains_answer(passage, ex.answers)


def test_a_passage_stating_part_of_the_answer_is_neither_a_distractor_nor_irrelevant():
    """Issue 77: the rule compared answer sets for equality, so a passage whose answer is "Ford"
    served as the distractor of a question answered "Henry Ford" (7 of NQ-Swap's distractors). Now
    any overlap on word boundaries, either way round, refuses the passage."""
    from juice.data.context_types import answers_overlap

    assert answers_overlap(("Ford",), ("Henry Ford",)) and answers_overlap(("Henry Ford",), ("Ford",))
    assert answers_overlap(("Watson", "Crick"), ("Francis Crick",))
    assert not answers_overlap(("Fordham",), ("Henry Ford",)) and not answers_overlap(("1918",), ("1917",))
    question = "who founded the ford motor company"
    rows = [{"question": question, "org_context": "Henry Ford founded the Ford Motor Company in 1903 .",
             "org_answer": "Henry Ford", "sub_context": "Tom Smith founded the Ford Motor Company in 1903 .",
             "sub_answer": "Tom Smith"},
            {"question": "who owned the motor company sold in 1950",   # BM25's top passage: states "Ford"
             "org_context": "The motor company was founded by Ford , who owned the motor company until 1950 .",
             "org_answer": "Ford", "sub_context": "The motor company was founded by Reed , who owned it until 1950 .",
             "sub_answer": "Reed"},
            {"question": "what is the capital of peru", "org_context": "Lima is the capital of Peru .",
             "org_answer": "Lima", "sub_context": "Quito is the capital of Peru .", "sub_answer": "Quito"}]
    built = nqswap_context_items(rows, seed=0)
    ford = {i.context_type: i for i in built.items if i.uid == "0"}
    assert ford["distractor"].partner == "2" and ford["distractor"].context_answers == ("Lima",)
    assert ford["irrelevant"].partner == "2"
