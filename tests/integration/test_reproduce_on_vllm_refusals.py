"""`juice reproduce --engine vllm`'s refusals that need no vLLM: an architecture the plugin does not
steer, no vLLM environment, a configuration and an engine that disagree (the runs themselves:
tests/slow/test_reproduce_on_vllm.py)."""

from __future__ import annotations

import pytest

from juice.experiments.table1 import ReproduceConfig, reproduce
from juice.vllm.engine import VllmEngine, VllmEngineError

from test_reproduce_on_vllm import TINY  # noqa: E402


def test_an_architecture_the_plugin_does_not_steer_is_refused_before_any_stage(tmp_path):
    from conftest import build_tiny

    lm = build_tiny("gpt2")
    with pytest.raises(VllmEngineError, match="this model is GPT2LMHeadModel: run with --engine juice"):
        reproduce(ReproduceConfig(out_dir=tmp_path, engine="vllm", **TINY), lm=lm,
                  engine=VllmEngine("m", tmp_path / "vllm"))
    assert not (tmp_path / "state").exists()


def test_without_vllm_the_run_says_how_to_install_it(tiny_llama, tmp_path, monkeypatch):
    from juice.vllm.launch import VllmNotFoundError

    monkeypatch.setenv("JUICE_VLLM_PYTHON", str(tmp_path / "no-such-python"))
    with pytest.raises(VllmNotFoundError, match="is not a file"):
        reproduce(ReproduceConfig(out_dir=tmp_path, engine="vllm", **TINY), lm=tiny_llama,
                  engine=VllmEngine("m", tmp_path / "vllm"))


def test_the_configuration_and_the_engine_must_agree(tiny_llama, tmp_path):
    with pytest.raises(ValueError, match="names engine vllm, but the juice engine was given"):
        reproduce(ReproduceConfig(out_dir=tmp_path, engine="vllm", **TINY), lm=tiny_llama)
    with pytest.raises(ValueError, match="vllm_args are for engine vllm"):
        ReproduceConfig(vllm_args=("--enforce-eager",))
    with pytest.raises(ValueError, match="engine must be juice or vllm"):
        ReproduceConfig(engine="sglang")
