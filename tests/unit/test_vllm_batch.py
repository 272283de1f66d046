"""`juice run-batch`'s line checks (:mod:`juice.vllm.batch`; issue 88, item 3): vLLM's batch runner
builds no HTTP app, so juice checks and rewrites each line as the middleware does a request, and
puts a refused line's error in its place in the output. vLLM itself runs in
tests/slow/test_vllm_ways_in.py."""

from __future__ import annotations

import json
import os

import pytest

from juice.vllm.batch import check_line, merge

from helpers.vllm import CONTEXTUAL, PARAMETRIC, write_heads


@pytest.fixture
def heads_env(tmp_path, monkeypatch):
    model = {"name": "m", "model_type": "llama", "n_layers": 4, "n_heads": 4, "head_dim": 32}
    files = [write_heads(tmp_path / "p.json", model, "parametric", PARAMETRIC),
             write_heads(tmp_path / "c.json", model, "contextual", CONTEXTUAL)]
    monkeypatch.setenv("JUICE_VLLM_HEADS", os.pathsep.join(files))


def _line(url: str, body: dict, custom_id: str = "r") -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def test_a_line_s_juice_field_goes_into_vllm_xargs_and_bad_lines_are_refused_with_the_middleware_s_line(heads_env):
    ask = {"method": "juice", "direction": "context", "beta_plus": 2.0, "beta_minus": 0.0}
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    moved = check_line(_line("/v1/chat/completions", {**chat, "juice": ask}))
    assert moved.error is None
    assert json.loads(moved.text)["body"] == {**chat, "vllm_xargs": {f"juice_{k}": v for k, v in ask.items()}}
    plain = _line("/v1/chat/completions", chat)
    assert check_line(plain).text == plain   # no juice fields: untouched
    for body, url, message in [
        ({**chat, "juice": ask, "use_beam_search": True}, "/v1/chat/completions", "juice does not steer beam search"),
        ({**chat, "vllm_xargs": {"juice": "x"}, "use_beam_search": True}, "/v1/chat/completions", "beam search"),
        ({**chat, "juice": {"method": "june", "direction": "sideways"}}, "/v1/chat/completions", "direction"),
        ({"input": "hi", "juice": ask}, "/v1/embeddings", "not /v1/embeddings"),
    ]:
        refused = check_line(_line(url, body, "bad"))
        assert refused.text is None and refused.custom_id == "bad" and message in refused.error
    assert check_line("not json").text == "not json"   # vLLM answers what it cannot read


def test_the_output_keeps_input_order_with_refused_lines_in_their_places(heads_env):
    checked = [check_line(_line("/v1/chat/completions", {"messages": []}, "a")),
               check_line(_line("/v1/embeddings", {"input": "x", "juice": {"method": "june"}}, "b")),
               check_line(_line("/v1/chat/completions", {"messages": []}, "c"))]
    out = [json.loads(line) for line in merge(checked, ['{"custom_id": "a"}', '{"custom_id": "c"}'])]
    assert [o["custom_id"] for o in out] == ["a", "b", "c"]
    assert out[1]["response"]["status_code"] == 400 and "not /v1/embeddings" in out[1]["error"]
    with pytest.raises(RuntimeError, match="answered 1 lines for 2 sent"):
        merge(checked, ['{"custom_id": "a"}'])


def test_a_line_vllm_s_runner_cannot_read_gets_its_error_in_place_instead_of_stopping_the_batch(heads_env):
    """Review of issue 88: vLLM's batch runner reads every line before it runs any and stops the
    whole batch at one it cannot read; juice reads each line as vLLM does first (`validate`,
    `BatchRequestInput.model_validate_json` in vLLM's Python) and refuses only that line."""
    def vllm_reads(text: str) -> None:   # a stand-in for vLLM's reader: needs custom_id and url
        line = json.loads(text)
        if "custom_id" not in line or "url" not in line:
            raise ValueError("1 validation error for BatchRequestInput\ncustom_id\n  Field required")

    good = _line("/v1/chat/completions", {"messages": []}, "ok")
    assert check_line(good, vllm_reads).text == good
    refused = check_line(json.dumps({"method": "POST", "body": {"messages": []}}), vllm_reads)
    assert refused.text is None
    assert refused.error == "vLLM's batch runner cannot read this line: 1 validation error for BatchRequestInput"
    assert check_line("not json", vllm_reads).error.startswith("vLLM's batch runner cannot read this line: ")
    assert check_line("not json").text == "not json"   # without vLLM's reader: passed on
