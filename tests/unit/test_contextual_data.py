"""MemoTrap and NQ-Swap loaders, contextual splits, and the contextual metrics."""

from __future__ import annotations

import json
import re

import pytest

from juice.data.contextual import CONTEXTUAL_DATASETS, contextual_splits, load_contextual
from juice.data.memotrap import SUBTASKS, MemoTrapFormatError, load_memotrap, question_part
from juice.data.nqswap import load_nqswap, strip_markup
from juice.data.metrics import memotrap_match, nqswap_match

ROWS = {"proverb_ending": 860, "proverb_translation": 843, "hate_speech_ending": 100, "history_of_science_qa": 736}


def _csv_rows(path):
    import csv

    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("subtask", list(SUBTASKS))
def test_memotrap_loader_parses_every_row(shared_data, subtask):
    path = shared_data / "memotrap" / SUBTASKS[subtask]
    raw = _csv_rows(path)
    examples = load_memotrap(shared_data / "memotrap", subtask)
    assert len(examples) == len(raw) == ROWS[subtask]
    for ex, row in zip(examples, raw):
        assert ex.prompt == row["prompt"]
        assert ex.prompt.endswith(ex.question) and len(ex.question) < len(ex.prompt)
        assert {ex.context_answer, ex.parametric_answer} <= set(eval(row["classes"]))  # noqa: S307 - test oracle
        assert ex.context_answer != ex.parametric_answer


def test_memotrap_multiline_prompts_survive(shared_data):
    ex = load_memotrap(shared_data / "memotrap", "history_of_science_qa")[0]
    assert "\nA. " in ex.prompt and ex.question.startswith("A. ") and ex.question.endswith("Answer:")
    assert ex.kind == "qa" and ex.context_answer == " B"


def test_nqswap_loader_parses_every_row(shared_data):
    path = shared_data / "nqswap" / "nqswap.jsonl"
    raw = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    examples = load_nqswap(path)
    assert len(examples) == len(raw) == 4746
    for ex, row in zip(examples, raw):
        assert not re.search(r"</?[A-Za-z][^<>]*>", ex.prompt), ex.prompt[:200]
        assert ex.prompt.startswith("Context: ") and ex.prompt.endswith(ex.question)
        assert ex.question == f"Question: {row['question'].strip().rstrip('?')}?\nAnswer:"
        assert "Context" not in ex.question and strip_markup(row["sub_context"]) not in ex.question
        assert ex.context_answers == tuple(row["sub_answer"])
        assert ex.parametric_answers == tuple(row["org_answer"])


def test_markup_is_stripped():
    assert strip_markup("<P> a <Td> b </Td> c </P>") == "a b c"


def test_bad_rows_are_refused_clearly(tmp_path):
    bad = tmp_path / "1-proverb-ending.csv"
    bad.write_text('prompt,classes,answer_index\n"no instruction here","[\' a\']",0\n', encoding="utf-8")
    with pytest.raises(MemoTrapFormatError):
        load_memotrap(tmp_path, "proverb_ending")
    with pytest.raises(MemoTrapFormatError):
        question_part("proverb_translation", "one line only")
    with pytest.raises(FileNotFoundError):
        load_memotrap(tmp_path / "missing", "proverb_ending")
    with pytest.raises(ValueError, match="unknown MemoTrap subtask"):
        load_memotrap(tmp_path, "limericks")


def test_contextual_splits_are_disjoint_seeded_and_sized(shared_data):
    examples = load_contextual("proverb_ending", shared_data)
    s = contextual_splits(examples, head_set_size=4, validation_size=10, ph3_dev_size=200, limit=50, seed=0)
    ids = [ex.uid for part in (s.head_set, s.validation, s.ph3_dev, s.test) for ex in part]
    assert len(ids) == len(set(ids)) == 4 + 10 + 200 + 50
    again = contextual_splits(examples, head_set_size=4, validation_size=10, ph3_dev_size=200, limit=50, seed=0)
    assert again == s
    assert set(CONTEXTUAL_DATASETS) == {"nqswap", *SUBTASKS}


def test_memotrap_match_compares_words_without_punctuation():
    assert memotrap_match(" heavy. Absence makes the heart", " heavy.")
    assert memotrap_match(" Heavy!", " heavy.")
    assert not memotrap_match(" heavier.", " heavy.")
    assert memotrap_match(" B\n\nWhat was", " B")
    assert not memotrap_match(" A", " B")
    assert memotrap_match(" white or colored passenger shall", " white or colored passenger")
    assert not memotrap_match(" white passenger", " white or colored passenger")


def test_nqswap_match_is_a_normalized_substring():
    assert nqswap_match(" 775 episodes.\nQuestion:", ["775"])
    assert nqswap_match(" Yuliya Snigir, the bassist", ["Yuliya Snigir"])
    assert not nqswap_match(" Timothy B. Schmit", ["Yuliya Snigir"])
    assert not nqswap_match(" anything", ["The"])  # normalizes to nothing: never matches


def test_a_datasets_context_items_and_study_sizes_are_its_entry(tmp_path, monkeypatch):
    """Issue 76: what the context-type tasks and the when-to-steer study need of a dataset is its
    entry (`context_items`, `study_sizes`): a new entry's questions become the harness's context
    tasks and a source of the study, with no name spelled elsewhere."""
    from juice.data import contextual
    from juice.data.context_types import CONTEXT_TYPES, paraconflict_context_items
    from juice.data.paraconflict import build_domain
    from juice.eval.harness_tasks import write_tasks
    from juice.pipeline.run import ReproduceConfig, study_sizes

    def items(folder, seed, test_uids=None, fits=None):
        return list(paraconflict_context_items(build_domain("world_capital")[:6], seed).items)

    monkeypatch.setitem(contextual.DATASETS, "riddles", contextual.ContextualDataset(
        "riddles", "Riddles", "first_words", "riddles", lambda folder: [], context_items=items,
        study_sizes={"default": (2, 2), "published": (20, 20)}))
    (tmp_path / "data" / "riddles").mkdir(parents=True)
    names = write_tasks(tmp_path / "tasks", tmp_path / "data")
    assert {f"juice_contexts_riddles_{t}" for t in CONTEXT_TYPES} <= set(names)
    assert not any(n.startswith("juice_contexts_nqswap") for n in names)   # no NQ-Swap folder here
    assert study_sizes()["riddles"] == {"default": (2, 2), "published": (20, 20)}
    assert ReproduceConfig(contexts=("riddles",)).contexts == ("riddles",)
    monkeypatch.delitem(contextual.DATASETS, "riddles")
    with pytest.raises(ValueError, match="unknown dataset 'riddles'"):
        ReproduceConfig(contexts=("riddles",))
