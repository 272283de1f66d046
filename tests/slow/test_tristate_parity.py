"""juice's CAD, AdaCAD, CoCoA, COIECD and GRD against TriState-Bench's own implementations, replayed
from the committed reference (benchmarks/results/tristate-parity-gemma-3-270m.json, written by
benchmarks/tristate_parity.py from their code, which this test does not need): on the embedded
Gemma 3 270M, every input whose output the record found equal to theirs is still equal, and
every difference the record explains is the same one."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "benchmarks" / "results" / "tristate-parity-gemma-3-270m.json"
sys.path.insert(0, str(ROOT / "benchmarks"))


@pytest.fixture(scope="module")
def record() -> dict:
    if not RECORD.is_file():
        pytest.skip(f"{RECORD.name} is not committed")
    return json.loads(RECORD.read_text(encoding="utf-8"))


@pytest.mark.parametrize("per_state", [pytest.param(None, marks=pytest.mark.long), 1])
def test_juice_still_gives_their_outputs_where_the_record_says_it_does(record, real_model, shared_data, per_state):
    """Every input of the record (`pytest -m long`), or its first per state (CI: every rule on every
    state; 3 per state took 11 minutes of a shared machine)."""
    import tristate_parity as parity

    from juice.data.tristate import state_files

    lm = real_model
    assert record["fingerprint"] == json.loads(json.dumps(lm.fingerprint(), default=str))
    files = state_files(shared_data / "tristate")[record["inputs"]["folder"]]
    n = record["inputs"]["per_state"]
    inputs = {s: parity.read_inputs(path, n) for s, path in files.items()}
    for state, xs in inputs.items():
        assert [x["index"] for x in xs] == record["inputs"]["indices"][state]
    inputs = {s: xs[:per_state or n] for s, xs in inputs.items()}
    eos = set(record["eos_ids"])   # their runner's: the generation config's and the tokenizer's
    for name, rule in parity.juice_rules().items():
        method = "adacad" if name == "adacad-nats" else name
        for state, xs in inputs.items():
            ids = parity.juice_tokens(lm, rule, xs, eos)
            texts = [parity.text_of(lm.tokenizer, t) for t in ids]
            differ = {d["index"]: d for d in record["results"][name][state]["differ"]}
            for x, got, want in zip(xs, texts, record["reference"][method][state]):
                if x["index"] in differ:
                    assert got == differ[x["index"]]["juice"], (name, state, x["index"])
                else:
                    assert got == want, (name, state, x["index"])
