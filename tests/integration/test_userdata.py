"""Your own data for `juice identify --data FILE`: JSONL / CSV rows with any conflict labels, the
paper's ParaConflict JSON, NQ-Swap and MemoTrap files; bad rows named in one line; the heads file
records the data it came from."""

from __future__ import annotations

import csv
import json

import pytest
from conftest import build_tiny

from juice.userdata import ConflictRow, load_rows

ROWS = [{"prompt": "the capital of france is", "target": "paris", "other": "berlin", "conflict_type": "clean"},
        {"prompt": "the capital of france is berlin . the capital of france is", "target": "paris",
         "conflict_type": "substitution"},
        {"prompt": "the capital of japan is", "target": "tokyo"}]


def _jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_jsonl_and_csv_rows(tmp_path):
    rows = load_rows(_jsonl(tmp_path / "d.jsonl", ROWS))
    assert rows[0] == ConflictRow("the capital of france is", "paris", "berlin", "clean")
    assert [r.conflict_type for r in rows] == ["clean", "substitution", "all"]
    with open(tmp_path / "d.csv", "w", newline="") as f:
        w = csv.DictWriter(f, ["prompt", "target", "other", "conflict_type"])
        w.writeheader()
        w.writerows(ROWS)
    assert load_rows(tmp_path / "d.csv") == rows


@pytest.mark.parametrize("content, message", [
    ('{"prompt": "x is"}\n', "line 1: no target"),
    ('{"target": "y"}\n', "line 1: no prompt"),
    ('{"prompt": "x", "target": "y"}\n{oops\n', "line 2: not JSON"),
    ("\n", "no rows"),
    ('["a list"]\n', "a row must be an object"),
])
def test_bad_rows_are_named(tmp_path, content, message):
    (tmp_path / "d.jsonl").write_text(content)
    with pytest.raises(ValueError, match=message):
        load_rows(tmp_path / "d.jsonl")


def test_the_papers_files_by_direction(shared_data, tmp_path):
    wc = load_rows(shared_data / "paraconflict" / "world_capital" / "head_finding_set_size_4.json")
    assert len(wc) == 12 and [r.conflict_type for r in wc[:3]] == ["clean", "substitution", "coherent"]
    ctx = load_rows(shared_data / "paraconflict" / "world_capital" / "head_finding_set_size_4.json", "contextual")
    assert (ctx[0].target, ctx[0].other) == (wc[0].other, wc[0].target)
    nq_line = (shared_data / "nqswap" / "nqswap.jsonl").read_text().splitlines()[0]
    nq = load_rows(_jsonl(tmp_path / "nq.jsonl", [json.loads(nq_line)]), "contextual")
    assert nq[0].conflict_type == "context" and nq[0].target == json.loads(nq_line)["sub_answer"][0]
    memotrap = shared_data / "memotrap" / "1-proverb-ending.csv"
    mt = load_rows(memotrap, "contextual")
    assert len(mt) == 860 and all(r.conflict_type == "context" for r in mt)
    with pytest.raises(ValueError, match="direction"):
        load_rows(memotrap, "sideways")


def test_identify_on_a_file_records_its_data(tmp_path, capsys):
    import juice.apps.cli as cli
    from juice.stage1 import load_heads

    lm = build_tiny("llama")
    folder = tmp_path / "model"
    lm.model.save_pretrained(folder)
    lm.tokenizer.save_pretrained(folder)
    data = _jsonl(tmp_path / "mine.jsonl", ROWS)
    out = tmp_path / "heads.json"
    assert cli.main(["identify", "--model", str(folder), "--data", str(data), "--out", str(out), "--k", "2"]) == 0
    artifact = load_heads(out)
    assert artifact.data["file"] == str(data) and artifact.data["rows"] == 3
    assert artifact.data["conflict_types"] == ["all", "clean", "substitution"]
    assert len(artifact.head_set) == 3 and artifact.head_set[0]["target"] == "paris"
    assert len(artifact.selection.positive) <= 2 and len(artifact.selection.negative) <= 2
    assert set(artifact.scores["positive"]["L0H0"]) == {"all", "clean", "substitution"}
    # a bad row fails before any model loads
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x"}\n')
    assert cli.main(["identify", "--model", "no-such-model", "--data", str(bad)]) == 2
    assert "line 1: no target" in capsys.readouterr().err
