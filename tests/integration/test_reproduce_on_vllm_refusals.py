"""`juice reproduce --engine vllm`'s refusals that need no vLLM: an architecture the plugin does not
steer, no vLLM environment, a configuration and an engine that disagree (the runs themselves:
tests/slow/test_reproduce_on_vllm.py)."""

from __future__ import annotations

import pytest

from juice.pipeline.run import ReproduceConfig
from juice.experiments.table1 import reproduce
from juice.vllm.engine import VllmEngine, VllmEngineError

from helpers.reproduce import TINY  # noqa: E402


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


def test_stage_1_runs_on_juices_engine_where_asked_and_the_run_records_it(tiny_llama, tmp_path):
    """Issue 75: `--stage1-engine juice` under `--engine vllm`: exact Stage 1 on juice's engine
    (never asking the run's engine), everything else on the run's engine; results.json says where
    each stage ran. A stand-in named "vllm" (juice's engine underneath) counts what it is asked."""
    import json

    from juice.engine.backend import JuiceEngine

    class Standin(JuiceEngine):
        name = "vllm"
        in_process = every_stream = False   # decodes elsewhere, as vLLM does

        def __init__(self):
            self.asked = []

        def intervention_probs_many(self, lm, targets, interventions, max_rows=256):
            self.asked.append("stage 1")
            return super().intervention_probs_many(lm, targets, interventions, max_rows)

        def generate(self, lm, prompts, streams, max_new_tokens=10, **options):
            self.asked.append("generate")
            return super().generate(lm, prompts, streams, max_new_tokens, **options)

    for stage1_engine, on_standin in ((None, True), ("juice", False)):
        out, engine = tmp_path / str(stage1_engine), Standin()
        reproduce(ReproduceConfig(out_dir=out, engine="vllm", stage1_engine=stage1_engine, **TINY), lm=tiny_llama,
                  engine=engine)
        assert ("stage 1" in engine.asked) == on_standin and "generate" in engine.asked
        stages = json.loads((out / "results.json").read_text())["protocol"]["engine"]["stages"]
        assert stages["tuning"] == "vllm"
        assert stages["stage 1"] == ("vllm" if on_standin else
                                     "juice (--stage1-engine juice: its growing batch runs the layers below a scaled "
                                     "head once)")
    with pytest.raises(ValueError, match="stage1_engine must be juice or the run's engine"):
        ReproduceConfig(engine="juice", stage1_engine="vllm")


def test_on_vllm_juices_copy_of_the_model_waits_for_a_stage_that_needs_it(tmp_path):
    """Issue 75: with `--engine vllm` the run starts with the tokenizer, config and fingerprint of
    juice's copy (:class:`juice.models.DeferredModel`), not its weights, and results.json says
    whether a stage loaded them; juice's own engine loads them at start."""
    from conftest import build_tiny

    from juice.engine.backend import JuiceEngine
    from juice.models import DeferredModel
    from juice.pipeline.run import start_run

    class Standin(JuiceEngine):
        name = "vllm"
        in_process = every_stream = False   # decodes elsewhere, as vLLM does

        def check(self, lm):
            pass

    lm = build_tiny("llama")
    lm.model.save_pretrained(tmp_path / "model")
    lm.tokenizer.save_pretrained(tmp_path / "model")
    cfg = ReproduceConfig(model=str(tmp_path / "model"), out_dir=tmp_path / "out", engine="vllm", device="cpu", **TINY)
    run, timings = start_run(cfg, None, engine=Standin())
    assert isinstance(run.lm, DeferredModel) and "load_model" in timings
    assert run.engine_record()["juice_copy"] == {"loaded": False, "device": "cpu"}
    assert run.lm.fingerprint()["weights_sha256_16"] == lm.fingerprint()["weights_sha256_16"]
    run.lm.heads   # a stage on juice's engine (PH3's path patching) reads the heads
    record = run.engine_record()["juice_copy"]
    assert record["loaded"] and record["load_seconds"] >= 0
    own, _ = start_run(ReproduceConfig(model=str(tmp_path / "model"), out_dir=tmp_path / "own", device="cpu", **TINY),
                        None)
    assert not isinstance(own.lm, DeferredModel) and "juice_copy" not in own.engine_record()
