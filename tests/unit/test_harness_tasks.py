"""`juice tasks` (juice.eval.harness_tasks): the task YAMLs load in lm-evaluation-harness, their
documents are juice's items, and their scoring functions are juice's metrics. (The harness's
figures equal juice's evaluation on the embedded model: tests/slow/test_server_lm_eval.py.)"""

from __future__ import annotations

import importlib.util
import json

import pytest

from juice.data.context_types import CONTEXT_TYPES, ContextItem, nqswap_context_items
from juice.eval.harness_tasks import write_tasks
from juice.eval.verdicts import context_verdicts
from helpers.context_rows import ROWS


def _utils(folder):
    spec = importlib.util.spec_from_file_location("juice_task_utils", folder / "utils.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tasks_are_written_from_the_data_root(tmp_path):
    root = tmp_path / "data"
    (root / "nqswap").mkdir(parents=True)
    (root / "nqswap" / "nqswap.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    names = write_tasks(tmp_path / "tasks", root)
    assert "juice_nqswap" in names and not any("memotrap" in n for n in names)   # no MemoTrap folder: none
    assert {f"juice_contexts_{s}_{t}" for s in ("nqswap", "paraconflict") for t in CONTEXT_TYPES} <= set(names)
    folder = tmp_path / "tasks"
    docs = [json.loads(line) for line in (folder / "juice_contexts_nqswap_irrelevant.jsonl").read_text().splitlines()]
    items = [i for i in nqswap_context_items(ROWS, 0).items if i.context_type == "irrelevant"]
    assert [d["item"]["prompt"] for d in docs] == [i.prompt for i in items]
    utils = _utils(folder)
    for doc, item in zip(docs, items):
        for output in (f" {item.context_answers[0]}", f" {item.memory_answers[0]}", " nothing"):
            want = {k: float(v) for k, v in context_verdicts(item, output).items() if v is not None}
            assert utils.contexts(doc, [output]) == want
    none = json.loads((folder / "juice_contexts_nqswap_none.jsonl").read_text().splitlines()[0])
    assert set(utils.contexts(none, ["x"])) == {"use_relevant", "trust_memory"}   # no passage to follow
    nq = json.loads((folder / "juice_nqswap.jsonl").read_text().splitlines()[0])
    assert utils.contextual(nq, [f"it was {ROWS[0]['sub_answer'][0]}"]) == {"exact_match": 1.0, "follows_memory": 0.0}
    assert utils.contextual(nq, [f"it was {ROWS[0]['org_answer'][0]}"]) == {"exact_match": 0.0, "follows_memory": 1.0}
    with pytest.raises(FileNotFoundError, match="no such data folder"):
        write_tasks(tmp_path / "t2", tmp_path / "nowhere")


def test_the_yamls_load_in_the_harness(tmp_path, shared_data):
    pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    names = write_tasks(tmp_path, shared_data)
    assert {f"juice_memotrap_{s}" for s in ("proverb_ending", "proverb_translation", "hate_speech_ending",
                                            "history_of_science_qa")} <= set(names)
    manager = TaskManager(include_path=str(tmp_path))
    assert set(names) <= set(manager.all_tasks)
    assert {"juice_memotrap", "juice_contexts"} <= set(manager.all_tasks)   # the tags
    config = manager.task_index["juice_memotrap_proverb_ending"].cfg
    assert config["generation_kwargs"]["max_gen_toks"] == 10 and config["output_type"] == "generate_until"


def test_a_context_document_round_trips_to_its_item():
    item = ContextItem("nqswap", "3", "conflicting", "Context: x\\nQuestion: q\\nAnswer:", "Question: q\\nAnswer:",
                       ("Paris",), ("Rome",), metric="nqswap")
    from juice.eval.harness_tasks import context_doc

    doc = json.loads(json.dumps(context_doc(item)))
    assert ContextItem(**{k: tuple(v) if isinstance(v, list) else v for k, v in doc["item"].items()}) == item
    assert doc["target"] == "Rome"


def test_the_tasks_budgets_are_the_metric_tables(tmp_path, monkeypatch):
    """A metric's new-token budget lives in juice.data.metrics.METRICS only: changed there, the
    lm-evaluation-harness tasks decode that many tokens (as juice's own evaluation does)."""
    import dataclasses

    from juice.data import metrics

    root = tmp_path / "data"
    (root / "nqswap").mkdir(parents=True)
    (root / "nqswap" / "nqswap.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    for budget in (20, 7):
        monkeypatch.setitem(metrics.METRICS, "nqswap", dataclasses.replace(metrics.METRICS["nqswap"], new_tokens=budget))
        write_tasks(tmp_path / f"tasks{budget}", root)
        yaml = (tmp_path / f"tasks{budget}" / "juice_nqswap.yaml").read_text(encoding="utf-8")
        assert f"max_gen_toks: {budget}\n" in yaml
        paraconflict = (tmp_path / f"tasks{budget}" / "juice_contexts_paraconflict_gold.yaml").read_text(encoding="utf-8")
        assert f"max_gen_toks: {metrics.new_tokens('first_words')}\n" in paraconflict
    with pytest.raises(ValueError, match="unknown metric 'bleu'"):
        metrics.new_tokens("bleu")


def test_a_new_contextual_dataset_gets_its_task_from_the_table(tmp_path, monkeypatch):
    """One entry in juice.data.contextual.DATASETS (and its metric in METRICS): `juice tasks` writes
    its task, with its metric's budget, and the task scores by its metric's rule."""
    from juice.data import contextual, metrics
    from juice.data.records import ContextualExample

    def load(folder):
        if not (folder / "riddles.txt").is_file():
            return []
        return [ContextualExample("riddles", str(i), f"w{i} is salt. So it is", "So it is", (" salt",), (" sugar",),
                                  "completion", "keyword") for i in range(3)]

    monkeypatch.setitem(metrics.METRICS, "keyword", metrics.Metric(
        "keyword", 4, "a test's metric", lambda out, answers: any(a.strip() in out for a in answers),
        frozenset({metrics.CONTEXTUAL})))
    monkeypatch.setitem(contextual.DATASETS, "riddles", contextual.ContextualDataset(
        "riddles", "Riddles", "keyword", "riddles", load))
    (tmp_path / "data" / "riddles").mkdir(parents=True)
    (tmp_path / "data" / "riddles" / "riddles.txt").write_text("x")
    names = write_tasks(tmp_path / "tasks", tmp_path / "data")
    assert "juice_riddles" in names
    assert "max_gen_toks: 4\n" in (tmp_path / "tasks" / "juice_riddles.yaml").read_text(encoding="utf-8")
    doc = json.loads((tmp_path / "tasks" / "juice_riddles.jsonl").read_text().splitlines()[0])
    utils = _utils(tmp_path / "tasks")
    assert utils.contextual(doc, ["lots of salt"]) == {"exact_match": 1.0, "follows_memory": 0.0}
    assert utils.contextual(doc, ["sugar, surely"]) == {"exact_match": 0.0, "follows_memory": 1.0}
