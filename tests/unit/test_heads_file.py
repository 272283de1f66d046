"""The heads-file format has one reader (:func:`juice.stage1.heads_file.heads_from_json`): juice's
`load_heads` and vLLM's plugin (`juice.vllm.options.read_heads_file`) accept and refuse the same
files with the same line."""

from __future__ import annotations

import json

import pytest

from juice.stage1.heads_file import load_heads
from juice.vllm.options import read_heads_file

GOOD = {"format": "juice-heads/1", "model": {"model_type": "llama", "n_layers": 2, "n_heads": 4},
        "direction": "contextual", "k": 1, "alphas_positive": [1.0], "alphas_negative": [-1.0],
        "positive_heads": ["L1H0"], "negative_heads": ["L0H1"], "tuned": {}}

BAD = [
    ({**GOOD, "format": "other/1"}, "not a juice heads file"),
    ({k: v for k, v in GOOD.items() if k != "model"}, "without its model fingerprint"),
    ({**GOOD, "direction": "sideways"}, "direction"),
    ({**GOOD, "tuned": ["juice"]}, "'tuned' must be an object"),
    ({**GOOD, "tuned": {"juice": [1, 2]}}, "tuned.juice must be an object"),
    ({k: v for k, v in GOOD.items() if k != "negative_heads"}, "without the field 'negative_heads'"),
    ({**GOOD, "positive_heads": ["layer one"]}, "names like 'L6H3'"),
    ("[1, 2", "not JSON"),
]


def _write(tmp_path, document) -> str:
    path = tmp_path / "heads.json"
    path.write_text(document if isinstance(document, str) else json.dumps(document), encoding="utf-8")
    return str(path)


def test_both_engines_read_a_heads_file_alike(tmp_path):
    path = _write(tmp_path, GOOD)
    artifact = load_heads(path)
    direction, selection, tuned, model = read_heads_file(path)
    assert (direction, selection, tuned, model) == (str(artifact.direction), artifact.selection, artifact.tuned,
                                                   artifact.model)


@pytest.mark.parametrize("document, match", BAD, ids=[m for _, m in BAD])
def test_both_engines_refuse_a_bad_heads_file_with_the_same_line(tmp_path, document, match):
    path = _write(tmp_path, document)
    with pytest.raises(ValueError, match=match) as juice_error:
        load_heads(path)
    with pytest.raises(ValueError) as vllm_error:
        read_heads_file(path)
    assert str(vllm_error.value) == str(juice_error.value) and "\n" not in str(juice_error.value)


@pytest.mark.parametrize("bad, shape", [("L6H9", "L6H9 is out of range for a model of 18 layers x 4 heads"),
                                        ("L18H0", "L18H0 is out of range for a model of 18 layers x 4 heads")])
def test_a_heads_file_naming_a_head_outside_its_own_fingerprint_is_refused_by_both_readers(tmp_path, bad, shape):
    """Issue 88, item 1: the shipped parametric heads with one head changed to one Gemma 3 270M
    does not have (18 layers x 4 heads; a head or a layer too far): the fingerprint still matches
    the model, so only the heads tell. juice's reader and the plugin's refuse the file in one line
    naming the head and the shape, before any model or engine is built."""
    from juice.stage1.shipped import shipped_path

    data = json.loads(shipped_path("gemma-3-270m", "parametric").read_text(encoding="utf-8"))
    data["positive_heads"][1] = bad
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    for read in (load_heads, read_heads_file):
        with pytest.raises(ValueError, match=shape) as refused:
            read(path)
        assert str(refused.value).startswith(str(path)) and "\n" not in str(refused.value)
