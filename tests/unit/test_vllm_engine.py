"""The pipeline's vLLM engine without vLLM (:mod:`juice.vllm.engine`): a steering becomes the request
protocol's per-head coefficients and back without a bit lost, the returned tokens are cut where
juice's engine stops, what vLLM cannot run is handed back with its reason, a server's refusal is
read from its log in one line, and a bad set-up is refused before anything starts."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import make_tokenizer
from juice.architectures import HeadGeometry
from juice.engine import Choice, Contrast, Stream
from juice.interventions import Head, HeadSelection
from juice.engine.sampling import Sampling
from juice.steering import ORIGINAL, JuICE, JuNE, Prune, Steering
from juice.steering_request import ServedHeads, read_steering
from juice.vllm.engine import VllmEngine, _cut, _steering_xargs, _why
from juice.steering_request import request_fields
from juice.vllm.options import PluginHeads

GEOMETRY = HeadGeometry(4, 4, 8)
SELECTION = HeadSelection((Head(1, 0), Head(2, 3)), (Head(1, 2), Head(2, 3)))


def _read_back(xargs: dict, served: ServedHeads) -> torch.Tensor:
    """The coefficients a server applies for a request's flat `vllm_xargs` (what the plugin does)."""
    return read_steering(request_fields(xargs), served).steering(GEOMETRY, served).coefficients


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3),
                          st.floats(-100, 100, width=32).filter(lambda x: x != 0)), min_size=1, max_size=6),
       st.sampled_from(["scale", "add"]))
def test_a_steering_reaches_the_server_with_every_coefficient_exact(cells, kind):
    """The engine sends a steering as per-head coefficients (`"L1H2=0.1"`, the flat form): read
    back by the request protocol they are the same float tensor, bit for bit."""
    coefficients = torch.zeros(4, 4)
    for layer, head, value in cells:
        coefficients[layer, head] = value
    steering = Steering(kind, coefficients)
    served = ServedHeads(geometry=GEOMETRY)
    assert torch.equal(_read_back(_steering_xargs(steering), served), coefficients)


def test_the_presets_and_original_become_the_methods_the_plugin_applies():
    juice, june = JuICE(GEOMETRY, SELECTION, 2.0, -1.0), JuNE(GEOMETRY, SELECTION, 3.0, -0.5)
    assert _steering_xargs(ORIGINAL) == {"juice_method": "original"} == _steering_xargs(None)
    assert _steering_xargs(JuICE(GEOMETRY, SELECTION, 0.0, 0.0)) == {"juice_method": "original"}   # = Original
    assert _steering_xargs(juice)["juice_method"] == "juice" and _steering_xargs(june)["juice_method"] == "june"
    assert _steering_xargs(Prune(GEOMETRY, [Head(3, 1)])) == {"juice_method": "june", "juice_heads": ["L3H1=-1.0"]}
    plugin = PluginHeads(selections={"parametric": SELECTION}, geometry=GEOMETRY, enabled=True)
    assert torch.equal(_read_back(_steering_xargs(juice), plugin), juice.coefficients)
    assert torch.equal(_read_back(_steering_xargs(june), plugin), june.coefficients)   # a head in both sets


def test_the_plugin_refuses_juice_on_a_head_whose_run_1_output_it_does_not_keep():
    from juice.steering_request import SteeringRequestError

    plugin = PluginHeads(selections={"parametric": SELECTION}, geometry=GEOMETRY, enabled=True)
    outside = JuICE(GEOMETRY, HeadSelection((Head(0, 0),), ()), 1.0, 0.0)
    with pytest.raises(SteeringRequestError, match="L0H0 is not one"):
        _read_back(_steering_xargs(outside), plugin)
    assert _read_back(_steering_xargs(JuNE(GEOMETRY, HeadSelection((Head(0, 0),), ()), 1.0, 0.0)), plugin)[0, 0] == 1


def test_returned_tokens_are_cut_where_juices_engine_stops():
    """EOS ends a row (kept in its tokens, not in its text); a stop rule on the text is checked
    after every token, as :func:`juice.engine.generate` checks it."""
    tok = make_tokenizer()
    ids = tok(" w10 w11 w12 w13 w14", add_special_tokens=False)["input_ids"]
    eos = tok.eos_token_id
    assert _cut(ids, None, None, tok) == ids
    assert _cut(ids[:2] + [eos] + ids[2:], eos, None, tok) == ids[:2] + [eos]
    three_words = lambda text: len(text.split()) >= 3   # noqa: E731
    assert _cut(ids, eos, three_words, tok) == ids[:3]
    assert _cut(ids[:1] + [eos] + ids[1:], eos, three_words, tok) == ids[:1] + [eos]


def test_what_vllm_cannot_run_is_handed_to_juices_engine_with_its_reason(tmp_path):
    engine = VllmEngine("m", tmp_path)
    assert engine.decodes(Stream(0)) is None
    assert engine.decodes(Stream(0, JuICE(GEOMETRY, SELECTION, 1.0, 0.0))) is None
    assert "two distributions" in engine.decodes(Stream(0, contrast=Contrast(1, lambda a, b: a)))
    choice = Choice(1, (ORIGINAL,), lambda a, b: a.argmax(-1) * 0)
    assert "question-only" in engine.decodes(Stream(0, choice=choice))
    assert "random generator" in engine.decodes(Stream(0, sampling=Sampling(temperature=0.7)))
    assert "repetition penalty" in engine.decodes(Stream(0, repetition_penalty=1.2))
    post_norm = Steering("scale", torch.ones(4, 4), site="post_norm")
    assert "post_norm" in engine.decodes(Stream(0, post_norm))


def test_a_server_that_stops_at_start_is_explained_by_its_refusal_line(tmp_path):
    log = tmp_path / "vllm-server.log"
    log.write_text("=== an earlier start\nValueError: old\n=== 2026-11-27 start\nINFO starting\n"
                   "(EngineCore) juice.vllm.constraints.PluginConfigError: juice's vLLM plugin does not support LoRA "
                   "(...): start vLLM without --enable-lora\nRuntimeError: Engine core initialization failed\n")
    assert _why(log).endswith("start vLLM without --enable-lora")
    log.write_text("=== start\nINFO\nsomething odd happened\n")
    assert _why(log) == "something odd happened"


def test_an_engine_name_is_read_once_and_its_class_opens_it_refusing_what_does_not_fit_in_one_line(tmp_path):
    from juice.engine.backend import JUICE_ENGINE, Engine, JuiceEngine, stage_key
    from juice.engines import ENGINES, engine_class

    assert engine_class("juice") is JuiceEngine and engine_class("vllm") is VllmEngine and list(ENGINES) == ["juice", "vllm"]
    assert JuiceEngine.open("m", tmp_path) is JUICE_ENGINE
    with pytest.raises(ValueError, match="--vllm-arg is for --engine vllm"):
        JuiceEngine.open("m", tmp_path, ["--enforce-eager"])
    with pytest.raises(ValueError, match="--vllm-offline is for --engine vllm"):
        JuiceEngine.open("m", tmp_path, offline=True)
    with pytest.raises(ValueError, match="^engine must be juice or vllm, not 'sglang'$"):
        engine_class("sglang")
    opened = VllmEngine.open("m", tmp_path, ["--enforce-eager"], offline=True)
    assert isinstance(opened, VllmEngine) and opened.vllm_args == ["--enforce-eager"] and opened.offline
    for engine in (JUICE_ENGINE, opened):
        assert isinstance(engine, Engine)   # both are the one interface the stages read
    # what a stage reads instead of a name: in this process or not, every stream or not, the keys it adds
    assert (JuiceEngine.in_process, JuiceEngine.every_stream, VllmEngine.in_process, VllmEngine.every_stream) == (
        True, True, False, False)
    assert stage_key(JUICE_ENGINE) == {} and stage_key(VllmEngine) == stage_key(opened) == {"engine": "vllm"}


def test_the_in_flight_bound_scales_with_vllms_data_parallel_size():
    from juice.vllm.engine import data_parallel_size

    assert data_parallel_size([]) == 1 and data_parallel_size(["--tensor-parallel-size=2"]) == 1
    assert data_parallel_size(["--data-parallel-size=4"]) == 4 and data_parallel_size(["-dp", "2", "-tp", "2"]) == 2
    assert data_parallel_size(["--data-parallel-size", "x"]) == 1


def test_gpu_settings_come_from_the_python_that_runs_vllm_not_juices_torch(tmp_path, monkeypatch):
    """Issue 75: a CPU juice driving a CUDA vLLM: vLLM's Python is asked what it runs on, and the
    server gets a GPU's settings (piecewise graphs, the model's dtype), not `--enforce-eager`."""
    import json
    import stat

    from juice.vllm import launch

    fake = tmp_path / "python"
    answer = {"cuda": True, "device": "NVIDIA H200", "vllm": "0.32.0", "torch": "2.13.0+cu130"}
    fake.write_text(f"#!/bin/sh\necho '{json.dumps(answer)}'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    launch.vllm_platform.cache_clear()
    assert launch.vllm_platform(str(fake)) == answer
    assert launch.vllm_platform(str(tmp_path / "missing"))["cuda"] is False   # cannot say: not a GPU
    monkeypatch.setattr(launch, "find_vllm_python", lambda required=True: str(fake))
    monkeypatch.setattr(launch, "served_folder", lambda model: str(tmp_path))
    _, command, _ = launch.launch_plan("m", [], extra=[], geometry="4x4")
    assert '{"cudagraph_mode": "PIECEWISE"}' in command and "--dtype" not in command
    assert "--gpu-memory-utilization" not in command
    engine = VllmEngine("m", tmp_path)
    monkeypatch.setattr("juice.vllm.launch.find_vllm_python", lambda required=True: str(fake))
    assert engine.platform()["cuda"] is True and engine.provenance()["vllm_device"] == "NVIDIA H200"
    launch.vllm_platform.cache_clear()


class _Started(Exception):
    """Raised by the stand-in for launch_plan: the engine's arguments are what the test reads."""


@pytest.mark.parametrize("cuda, dtype, extra, want", [
    (False, torch.float32, [], ["--dtype", "float32"]), (True, torch.float32, [], []),
    (True, torch.bfloat16, [], ["--dtype", "bfloat16"]), (True, torch.float32, ["--dtype=float16"], [])])
def test_reproduce_on_vllm_passes_the_pipelines_dtype_only_where_the_launcher_would(monkeypatch, tmp_path, cuda,
                                                                                   dtype, extra, want):
    """Issue 88, item 7: `juice reproduce --engine vllm` on a GPU left vLLM at the pipeline's
    default float32 (unlike `juice serve --engine vllm`); now the pipeline's dtype reaches vLLM on
    the CPU, and on a GPU only where the run asked for another than float32."""
    import types

    import juice.vllm.engine as engine_module

    seen = {}

    def plan(model, heads, *, extra, **kwargs):
        seen["extra"] = list(extra)
        raise _Started

    engine = VllmEngine("m", tmp_path, vllm_args=extra)
    monkeypatch.setattr(engine, "platform", lambda: {"cuda": cuda})
    monkeypatch.setattr("juice.vllm.launch.launch_plan", plan)
    monkeypatch.setattr(engine_module, "context_length", lambda lm: 256)
    lm = types.SimpleNamespace(dtype=dtype, geometry=GEOMETRY)
    with pytest.raises(_Started):
        engine._start(lm, frozenset())
    dtypes = [a for i, a in enumerate(seen["extra"]) if a.startswith("--dtype") or
              (i and seen["extra"][i - 1] == "--dtype")]
    assert dtypes == (want or [a for a in extra if a.startswith("--dtype")])


def test_stage_1_asks_each_head_and_alpha_of_all_prompts_in_one_request(monkeypatch, tmp_path):
    """Issue 75: Stage 1 on the embedded model's D (12 prompts; 18 layers x 4 heads x 8 alphas)
    sends 1 + 576 requests, each with every prompt, where one per (prompt, head, alpha) made 6,924;
    every prompt gets its own target's probability back. docs/reproducing.md quotes the counts."""
    import math
    import types

    import juice.vllm.engine as engine_module

    sent = []

    async def answer(url, model, batches, on_progress, in_flight=64):
        sent.append([len(b) for b in batches])
        for batch in batches:
            for k, ask in enumerate(batch):
                ask.result = {"top_logprobs": [{f"token_id:{t}": math.log(0.01 * (k + 1)) for t in ask.probes}]}

    engine = VllmEngine("m", tmp_path)
    monkeypatch.setattr(engine, "_ensure", lambda lm, heads: types.SimpleNamespace(url="http://x", worker=None))
    monkeypatch.setattr(engine_module, "_send", answer)
    lm = types.SimpleNamespace(tokenizer=make_tokenizer())
    interventions = [(Head(layer, head), alpha) for layer in range(18) for head in range(4)
                     for alpha in (1.0, 3.0, 5.0, 10.0, 30.0, -1.0, -2.0, -5.0)]
    targets = [(f"the capital of w{i} is", 5 + i) for i in range(12)]
    found = engine.intervention_probs_many(lm, targets, interventions)
    assert [len(b) for b in sent] == [577] and set(sent[0]) == {12} and engine.requests == 577
    assert [round(clean, 6) for clean, _ in found] == [round(0.01 * (k + 1), 6) for k in range(12)]
    one_at_a_time = VllmEngine("m", tmp_path)
    monkeypatch.setattr(one_at_a_time, "_ensure", lambda lm, heads: types.SimpleNamespace(url="http://x", worker=None))
    for prompt, target in targets:
        one_at_a_time.intervention_probs(lm, prompt, target, interventions)
    assert one_at_a_time.requests == 6924


def test_juices_copy_goes_where_the_stages_on_juices_engine_run():
    """With vLLM, juice's copy is on the CPU unless Stage 1 runs on juice's engine (then "auto": the
    GPU where there is one), and on a GPU beside vLLM it needs vLLM to leave it room."""
    import types

    from juice.engine.backend import JuiceEngine
    from juice.vllm.engine import VllmEngineError, check_shared_gpu

    assert VllmEngine.model_device("auto") == "cpu" and VllmEngine.model_device("auto", stage1_in_process=True) == "auto"
    assert JuiceEngine.model_device("auto") == "auto" and VllmEngine.model_device("cuda:1") == "cuda:1"
    on_gpu = types.SimpleNamespace(device=torch.device("cuda", 0))
    with pytest.raises(VllmEngineError, match="--gpu-memory-utilization=0.5"):
        check_shared_gpu(on_gpu, ["--tensor-parallel-size=1"])
    check_shared_gpu(on_gpu, ["--gpu-memory-utilization=0.5"])
    check_shared_gpu(types.SimpleNamespace(device=torch.device("cpu")), [])


def test_the_offline_worker_gets_the_servers_engine_arguments_less_the_servers_own():
    """`--vllm-offline` runs vLLM's `LLM` with what the server command would give its engine: the
    model, the plugin's processor, scheduler and config, the caller's arguments; not the host,
    port, served name or middleware (juice.vllm.offline.engine_arguments)."""
    from juice.vllm.launch import server_command
    from juice.vllm.offline import engine_arguments

    command = server_command("/venv/bin/python", "/models/m", "m", host="127.0.0.1", port=8123, max_model_len=512,
                             extra=["--enforce-eager", "--port=9", "--tensor-parallel-size", "2"],
                             config={"heads": []})
    args = engine_arguments(command)
    assert args[:2] == ["--model", "/models/m"] and "--enforce-eager" in args
    assert args[args.index("--tensor-parallel-size") + 1] == "2" and args[args.index("--max-model-len") + 1] == "512"
    assert {"--logits-processors", "--scheduler-cls", "--additional-config", "--dtype"} <= set(args)
    for server_only in ("--host", "--port", "--port=9", "--served-model-name", "--middleware", "127.0.0.1", "8123"):
        assert server_only not in args
    with pytest.raises(ValueError, match="not a vLLM OpenAI server command"):
        engine_arguments(["python", "-m", "something.else"])
