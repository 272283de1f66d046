"""A heads file for another model and a prompt longer than the context, on the embedded Gemma (the slow
tier: it loads the model; the rest of the bad-input table is tests/integration/test_bad_input.py)."""

from __future__ import annotations

import json

import juice.apps.cli as cli
from helpers.bad_input import HEADS, write  # noqa: E402


def test_a_heads_file_for_another_model_and_a_prompt_too_long(tmp_path, capsys):
    path = write(tmp_path / "h.json", json.dumps(HEADS))
    assert cli.main(["generate", "x", "--heads", str(path)]) == 2
    assert "was made for model 'other'" in capsys.readouterr().err
    from juice.models import load_model

    lm = load_model("gemma-3-270m")
    mine = dict(HEADS, model=lm.fingerprint())
    write(path, json.dumps(mine))
    too_long = "word " * 40000
    assert cli.main(["generate", too_long, "--heads", str(path)]) == 2
    assert "the model's context holds" in capsys.readouterr().err
