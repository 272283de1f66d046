"""When to steer, end to end (:mod:`juice.when_to_steer`, `juice evaluate --contexts`): items from
every source, methods from both heads files, the report and the command."""

from __future__ import annotations

import json

import pytest

from juice.data.context_types import CONTEXT_TYPES
from juice.interventions import Head, HeadSelection
from juice.stage1.heads_file import HeadsArtifact, save_heads
from juice.when_to_steer import context_items, context_methods, evaluate_contexts
from helpers.context_rows import ROWS

SEL = HeadSelection((Head(1, 2),), (Head(0, 1),))


def _nqswap(tmp_path):
    path = tmp_path / "nqswap.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    return path


def test_items_come_from_every_source(tmp_path, shared_data):
    items, where = context_items(_nqswap(tmp_path), limit=3)
    assert items.counts() == {t: 3 for t in CONTEXT_TYPES} and where["source"].startswith("NQ-Swap")
    folder = shared_data / "paraconflict"
    items, where = context_items(folder, domain="world_capital", limit=4, contexts=["gold", "none"])
    assert where["counts"] == items.counts() == {"gold": 4, "conflicting": 0, "irrelevant": 0, "distractor": 0,
                                                 "none": 4}
    items, _ = context_items(folder / "world_capital" / "unfiltered_test.json", limit=2)
    assert items.counts()["conflicting"] == 4
    items, where = context_items(None, domain="book_author", limit=2)
    assert items.counts()["irrelevant"] == 2 and "built-in book_author" in where["source"]
    with pytest.raises(ValueError, match="--contexts takes gold, conflicting, irrelevant, distractor, none, not golden"):
        context_items(None, contexts=["golden"])
    with pytest.raises(FileNotFoundError, match="no such file or folder"):
        context_items(tmp_path / "nowhere")


def test_methods_of_both_heads_files(tiny_llama):
    memory = HeadsArtifact(tiny_llama.fingerprint(), "parametric", 1, [1.0], [-1.0], SEL,
                           tuned={"juice": {"beta_plus": 1.0, "beta_minus": -1.0}})
    context = HeadsArtifact(tiny_llama.fingerprint(), "contextual", 1, [1.0], [-1.0], SEL)
    with pytest.warns(UserWarning, match="untuned betas"):
        methods, settings = context_methods(tiny_llama, [memory, context], ["original", "prompt", "juice"])
    assert list(methods) == ["original", "prompt-mem", "prompt-ctx", "juice-mem", "juice-ctx"]   # row keys
    assert settings["juice-mem"]["source"] == "tuned" and settings["juice-ctx"]["source"] == "default"
    with pytest.raises(ValueError, match="juice needs a heads file"):
        context_methods(tiny_llama, [], ["juice"])
    with pytest.raises(ValueError, match="PH3 needs its k"):
        context_methods(tiny_llama, [memory], ["ph3"])
    with pytest.raises(ValueError, match="unknown method 'auto2'"):
        context_methods(tiny_llama, [], ["auto2"])


def test_the_report_has_every_table(tiny_llama, tmp_path):
    items, where = context_items(_nqswap(tmp_path), limit=2)
    context = HeadsArtifact(tiny_llama.fingerprint(), "contextual", 1, [1.0], [-1.0], SEL,
                            tuned={"june": {"beta_plus": 1.0, "beta_minus": 0.0}})
    report = evaluate_contexts(tiny_llama, [context], items, ["original", "june"], data=where, resamples=1000)
    assert report.methods == ["original", "june-ctx"] and len(report.results) == 2 * 2 * len(CONTEXT_TYPES)
    data = report.to_json()   # by title
    assert data["methods"] == ["Original", "JuNE-ctx"] and {r["method"] for r in data["results"]} == set(data["methods"])
    assert set(data["tables"]) == {"use_relevant", "trust_memory", "follows_context", "use_relevant_not_degenerate",
                            "degenerate"}
    assert set(data["means"]["use_relevant"]["JuNE-ctx"]) == {*CONTEXT_TYPES, "mean"}
    md = report.markdown()
    assert "## use relevant context" in md and "## trust memory" in md and "JuNE-ctx - Original" in md


def test_juice_evaluate_contexts_from_the_command_line(tmp_path, capsys):
    import juice.apps.cli as cli
    from conftest import build_tiny

    lm = build_tiny("llama")
    folder = tmp_path / "model"
    lm.model.save_pretrained(folder)
    lm.tokenizer.save_pretrained(folder)
    heads = []
    for direction in ("parametric", "contextual"):
        heads += ["--heads", str(tmp_path / f"{direction}.json")]
        save_heads(HeadsArtifact(lm.fingerprint(), direction, 1, [1.0], [-1.0], SEL,
                                 tuned={"juice": {"beta_plus": 1.0, "beta_minus": -1.0}}), tmp_path / f"{direction}.json")
    out = tmp_path / "out"
    assert cli.main(["evaluate", "--contexts", "gold,conflicting,irrelevant,none", "--data", str(_nqswap(tmp_path)),
                     *heads, "--methods", "original,cad,juice", "--limit", "2", "--model", str(folder),
                     "--device", "cpu", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "use relevant context" in printed and "trust memory" in printed and "contexts.json" in printed
    saved = json.loads((out / "contexts.json").read_text())
    assert saved["methods"] == ["Original", "CAD", "JuICE-mem", "JuICE-ctx"]
    assert saved["data"]["counts"] == {**{t: 2 for t in CONTEXT_TYPES}, "distractor": 0}   # not asked for
    assert (out / "contexts.md").is_file()
    assert cli.main(["evaluate", "--contexts", "gold,golden", "--model", str(folder)]) != 0
    assert "--contexts takes" in capsys.readouterr().err
    # one half of the questions; the best static method chosen on the other half's run
    rows = _nqswap(tmp_path)
    common = ["evaluate", "--contexts", "gold,conflicting,irrelevant,none", "--data", str(rows), *heads[2:],
              "--methods", "original,cad,juice", "--limit", "2", "--model", str(folder), "--device", "cpu"]
    assert cli.main([*common, "--split", "validation", "--out", str(tmp_path / "val")]) == 0
    val = json.loads((tmp_path / "val" / "contexts.json").read_text())
    assert val["data"]["split"] == "validation"
    assert cli.main([*common, "--split", "test", "--out", str(tmp_path / "test"),
                     "--validation", str(tmp_path / "val" / "contexts.json")]) == 0
    test = json.loads((tmp_path / "test" / "contexts.json").read_text())
    means = val["means"]["use_relevant"]
    assert test["best_static"] == max(val["methods"], key=lambda m: (means[m]["mean"], -val["methods"].index(m)))
    assert not {r["subject"] for r in test["results"]} & {r["subject"] for r in val["results"]}
    assert f"JuICE-ctx - {test['best_static']}" in test["summary"]["use_relevant"]["differences"] or \
        test["best_static"] == "JuICE-ctx"
    capsys.readouterr()
    assert cli.main([*common, "--split", "validation", "--out", str(tmp_path / "again"),
                     "--validation", str(tmp_path / "val" / "contexts.json")]) == 2
    assert "validation split too" in capsys.readouterr().err


def test_keep_drops_long_items_before_the_limit(tmp_path, tiny_llama):
    from juice.when_to_steer import prompt_fits

    path = _nqswap(tmp_path)
    items, where = context_items(path, limit=2, keep=lambda i: i.uid != "0")
    assert sorted({i.uid for i in items.items}) == ["1", "2"] and where["dropped"] == 1
    assert items.counts() == {t: 2 for t in CONTEXT_TYPES}   # still two per type: the limit counts kept items
    longest = max(len(tiny_llama.tokenizer(i.prompt)["input_ids"]) for i in context_items(path)[0].items)
    _, where = context_items(path, keep=prompt_fits(tiny_llama.tokenizer, longest + 1))
    assert where["dropped"] == 0
    _, where = context_items(path, keep=prompt_fits(tiny_llama.tokenizer, 3))
    assert where["dropped"] == len(ROWS)
    with pytest.raises(ValueError, match="at least 1"):
        prompt_fits(tiny_llama.tokenizer, 0)


def test_your_own_jsonl_and_csv_rows_are_a_source(tmp_path):
    rows = [{"question": f"who wrote book {i}", "context": f"Book {i} was written by {a}.", "answer": a}
            for i, a in enumerate(["Tolstoy", "Austen", "Homer"])]
    jsonl = tmp_path / "mine.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    items, where = context_items(jsonl)
    assert where["source"] == f"rows {jsonl}" and items.counts() == {"gold": 3, "conflicting": 0, "irrelevant": 3,
                                                                     "distractor": 3, "none": 3}
    csv_file = tmp_path / "mine.csv"
    csv_file.write_text("question,context,answer,context_answer\nwho wrote book 0,Book 0 was written by Orwell.,"
                        "Tolstoy|Leo Tolstoy,Orwell\n", encoding="utf-8")
    items, _ = context_items(csv_file)
    conflict = items.of_type("conflicting")[0]
    assert conflict.memory_answers == ("Tolstoy", "Leo Tolstoy") and conflict.context_answers == ("Orwell",)
    assert context_items(_nqswap(tmp_path))[1]["source"].startswith("NQ-Swap")   # NQ-Swap rows stay NQ-Swap
