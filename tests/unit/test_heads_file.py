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
