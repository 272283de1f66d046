"""Streaming-input sessions through vLLM with juice's plugin (issue 65; slow tier: vLLM's `AsyncLLM`
in a subprocess from its own environment, skips without it): a session keeps its first chunk's
steering, and a later chunk that changes it ends the session with an error instead of being
computed under one steering and cached under another's salt."""

from __future__ import annotations

import json
import os
import re
import subprocess

from juice.tokens import token_ids

from helpers.vllm import (CONTEXTUAL, HERE, PARAMETRIC, VLLM_PYTHON, needs_vllm, tiny_llama_dir,  # noqa: E402
                          write_heads)

JUICE = {"method": "juice", "direction": "parametric", "beta_plus": 2.0, "beta_minus": -1.0}


@needs_vllm
def test_a_streaming_session_that_changes_its_steering_is_ended_with_an_error(tmp_path):
    lm, folder = tiny_llama_dir(tmp_path)
    files = [write_heads(tmp_path / f"{d}.json", lm.fingerprint(), d, s)
             for d, s in {"parametric": PARAMETRIC, "contextual": CONTEXTUAL}.items()]
    first, second = token_ids(lm.tokenizer, "the capital of france is"), token_ids(lm.tokenizer, "japan tokyo")[1:]
    steered = [{"ids": first, "juice": JUICE, "max_tokens": 3}, {"ids": second, "juice": JUICE, "max_tokens": 3}]
    sessions = {"same": {"chunks": steered, "initial": JUICE},
                # generate's own parameters (Original) differ from every chunk's: vLLM's end-of-stream
                # marker carries them, and is no chunk of the session
                "same, generate's parameters Original": {"chunks": steered},
                "changed": {"chunks": [steered[0], {"ids": second, "max_tokens": 3}], "initial": JUICE}}
    (tmp_path / "in.json").write_text(json.dumps({"model": folder, "sessions": sessions, "after": first}))
    env = {**os.environ, "JUICE_VLLM_HEADS": os.pathsep.join(files), "VLLM_CPU_KVCACHE_SPACE": "1"}
    done = subprocess.run([VLLM_PYTHON, str(HERE / "vllm_env" / "streaming_session.py"), str(tmp_path / "in.json"),
                           str(tmp_path / "out.json")], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads((tmp_path / "out.json").read_text())
    print(out)
    for same in ("same", "same, generate's parameters Original"):
        assert out[same]["error"] is None and out[same]["finish_reason"] == "length", out[same]
        assert len(out[same]["tokens"]) == 6, out[same]   # both chunks' tokens
    assert out["same"]["tokens"] == out["same, generate's parameters Original"]["tokens"]
    changed = out["changed"]
    assert changed["error"] is not None or changed["finish_reason"] == "error", changed
    assert done.stderr.count("changed its steering") == 1   # the "changed" session's chunk, nothing else
    assert re.search(r"streaming request session-changed-\w+ changed its steering after its first chunk "
                     r"\(juice parametric \(2, -1\) -> original\)", done.stderr)
    assert out["after"] is not None and len(out["after"]) == 4   # the engine still serves
