"""The vLLM configurations the plugin refuses at start (:mod:`juice.vllm.constraints`; issue 33):
dual-batch overlap and micro-batching, whose micro-batches would read other requests' steering,
and an attention backend without `query_start_loc` (FlashInfer's), each in one line naming the
flag; full CUDA graphs, LoRA, speculative decoding, KV-sharing layers and Model Runner V2 (issue 46). The checks import nothing of vLLM; the real backends' metadata is read from vLLM's sources
where its environment is installed."""

from __future__ import annotations

import ast
import dataclasses
import enum
import re
import subprocess
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Generic, TypeVar

import pytest

from juice.vllm.constraints import (CLEAN_RUN_OP, COMPILE_KEY, PROCESSOR_NAME, SHADOW_ATTENTION_OP,
                                    PluginConfigError, check_attention_backend, check_engine_config, check_kv_sharing,
                                    check_logits_processor, check_plugin_on_here, check_scheduler, metadata_fields,
                                    note_compiled_structure, split_at_run1)
from juice.vllm.launch import find_vllm_python

VLLM_PYTHON = find_vllm_python(required=False)


def _config(eager=True, prefix=False, dbo=False, ubatch=0):
    return SimpleNamespace(model_config=SimpleNamespace(enforce_eager=eager),
                           cache_config=SimpleNamespace(enable_prefix_caching=prefix),
                           parallel_config=SimpleNamespace(enable_dbo=dbo, ubatch_size=ubatch))


def test_a_steered_model_without_juices_logits_processor_is_refused_naming_the_flag():
    """Issue 46: the logits processor loads only where it is named (no entry point), so a vLLM
    without juice's heads runs none of juice's code; a steered model whose engine does not name
    it would serve every request unsteered, and is refused."""
    def named(*processors):
        return SimpleNamespace(model_config=SimpleNamespace(logits_processors=list(processors)))

    check_logits_processor(named(PROCESSOR_NAME))
    check_logits_processor(named("other.module:Processor", PROCESSOR_NAME))
    fake = type("JuiceSteeringProcessor", (), {"__module__": "juice.vllm.processor"})
    check_logits_processor(named(fake))   # the class itself, as LLM(logits_processors=[cls]) passes it
    for bad in (named(), named("other.module:Processor"), SimpleNamespace(model_config=SimpleNamespace())):
        with pytest.raises(PluginConfigError, match="--logits-processors juice.vllm.processor:JuiceSteeringProcessor"):
            check_logits_processor(bad)
    import juice.vllm
    assert juice.vllm.LOGITS_PROCESSOR == PROCESSOR_NAME
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text(encoding="utf-8")
    assert "vllm.logits_processors" not in pyproject and "vllm.general_plugins" in pyproject


def test_a_worker_whose_config_has_juice_but_whose_environment_leaves_it_off_is_refused(tmp_path):
    """Issue 46: vLLM loads plugins from each worker's environment, before the config reaches the
    model; a worker that gets juice's set-up in `additional_config` but no on-switch (vLLM's legacy
    Ray executor without juice's prefix) would build vLLM's own model, so the logits processor's
    check refuses it, naming the variable. A worker with the switch, or a config without juice,
    passes; the two inputs are what the processor reads."""
    from juice.interventions import Head, HeadSelection
    from juice.stage1.heads_file import HeadsArtifact, save_heads
    from juice.vllm.options import config_entry, plugin_enabled, served_heads

    model = {"name": "m", "model_type": "llama", "n_layers": 4, "n_heads": 4, "head_dim": 32}
    save_heads(HeadsArtifact(model, "parametric", 1, [1.0], [-1.0], HeadSelection((Head(1, 0),), (Head(2, 1),))),
               tmp_path / "p.json")
    entry = config_entry({"JUICE_VLLM_HEADS": str(tmp_path / "p.json")})
    config = SimpleNamespace(additional_config={"juice": entry})
    remote = {"PATH": "/usr/bin"}   # a worker's environment without juice's variables
    assert served_heads(config, remote).enabled and not plugin_enabled(remote)
    with pytest.raises(PluginConfigError, match="VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY=JUICE_"):
        check_plugin_on_here(served_heads(config, remote).enabled, plugin_enabled(remote))
    check_plugin_on_here(served_heads(config, remote).enabled, plugin_enabled({"JUICE_VLLM": "1"}))
    check_plugin_on_here(served_heads(SimpleNamespace(additional_config={}), remote).enabled,
                         plugin_enabled(remote))


def test_prefix_caching_without_juices_scheduler_is_refused_naming_the_flag():
    """Issue 46, part 2: the steering's KV cache salt is set by juice's scheduler in the engine
    core; with prefix caching on and another scheduler, a steered request would reuse KV another
    steering computed, so the model refuses to start. Without prefix caching no salt is needed."""
    import juice.vllm
    from juice.vllm.scheduler import salting_scheduler

    def config(prefix, scheduler):
        return SimpleNamespace(cache_config=SimpleNamespace(enable_prefix_caching=prefix),
                               scheduler_config=SimpleNamespace(scheduler_cls=scheduler))

    check_scheduler(config(True, juice.vllm.SCHEDULER))
    check_scheduler(config(True, salting_scheduler))   # the function itself, as LLM(scheduler_cls=...) may pass it
    check_scheduler(config(False, None))
    for other in (None, "vllm.v1.core.sched.scheduler.Scheduler", print):
        with pytest.raises(PluginConfigError, match="--scheduler-cls juice.vllm.scheduler.salting_scheduler"):
            check_scheduler(config(True, other))
    assert juice.vllm.llm_options({})["scheduler_cls"] == juice.vllm.SCHEDULER
    assert juice.vllm.SCHEDULER.rsplit(".", 1) == [salting_scheduler.__module__, salting_scheduler.__name__]


def test_engine_configurations_that_would_mix_requests_steering_are_refused_naming_the_flag():
    check_engine_config(_config())   # the plugin's configuration passes
    with pytest.raises(PluginConfigError, match="without --enable-dbo and --ubatch-size"):
        check_engine_config(_config(dbo=True))
    with pytest.raises(PluginConfigError, match="dual-batch overlap or micro-batching"):
        check_engine_config(_config(ubatch=2))
    check_engine_config(_config(eager=False, prefix=True))   # compiled and prefix-cached: vLLM's defaults (issue 36)
    for bad in (_config(dbo=True), _config(ubatch=4)):
        with pytest.raises(PluginConfigError) as err:
            check_engine_config(bad)
        assert "\n" not in str(err.value)


M = TypeVar("M")


class AttentionMetadataBuilder(Generic[M]):
    """vLLM's builder base, as its backends subclass it (`AttentionMetadataBuilder[Metadata]`)."""


def _backend(name: str, fields: list[str]):
    metadata = dataclasses.make_dataclass(f"{name}Metadata", fields)
    builder = types.new_class(f"{name}MetadataBuilder", (AttentionMetadataBuilder[metadata],))
    return type(f"{name}Backend", (), {"get_builder_cls": staticmethod(lambda: builder),
                                      "get_name": staticmethod(lambda: name)})


def _vllm_metadata_fields(module: str, klass: str) -> list[str]:
    """A metadata dataclass's annotated fields, read from vLLM's installed source (FlashInfer's
    module cannot be imported without the flashinfer package)."""
    root = subprocess.run([VLLM_PYTHON, "-c", "import importlib.util as u; print(u.find_spec('vllm').origin)"],
                          capture_output=True, text=True, check=True).stdout.strip()
    tree = ast.parse((Path(root).parent / "v1" / "attention" / "backends" / f"{module}.py").read_text())
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == klass)
    return [s.target.id for s in node.body if isinstance(s, ast.AnnAssign)]


def test_an_attention_backend_without_query_start_loc_is_refused_in_one_line():
    check_attention_backend(_backend("CPU_ATTN", ["query_start_loc", "seq_lens"]))
    flashinfer = _backend("FLASHINFER", ["num_actual_tokens", "slot_mapping"])
    assert metadata_fields(flashinfer) == {"num_actual_tokens", "slot_mapping"}
    with pytest.raises(PluginConfigError, match="cannot steer with the FLASHINFER attention backend") as err:
        check_attention_backend(flashinfer)
    assert "--attention-backend" in str(err.value) and "\n" not in str(err.value)
    unreadable = type("B", (), {"get_builder_cls": staticmethod(lambda: object), "get_name": staticmethod(lambda: "X")})
    assert metadata_fields(unreadable) is None
    check_attention_backend(unreadable)   # left to the model's check on the first steered batch


@pytest.mark.skipif(VLLM_PYTHON is None, reason="no vLLM environment (run scripts/install-vllm.sh)")
def test_the_installed_vllms_flashinfer_metadata_is_refused_and_its_cpu_metadata_passes():
    flashinfer = _vllm_metadata_fields("flashinfer", "FlashInferMetadata")
    cpu = _vllm_metadata_fields("cpu_attn", "CPUAttentionMetadata")
    assert flashinfer and "query_start_loc" not in flashinfer and "query_start_loc" in cpu
    with pytest.raises(PluginConfigError, match="FLASHINFER"):
        check_attention_backend(_backend("FLASHINFER", flashinfer))
    check_attention_backend(_backend("CPU_ATTN", cpu))


class _GraphMode(enum.Enum):
    """vLLM's `CUDAGraphMode` as its config holds it (names, values and `has_full_cudagraphs`)."""

    NONE = 0
    PIECEWISE = 1
    FULL = 2
    FULL_DECODE_ONLY = (2, 0)
    FULL_AND_PIECEWISE = (2, 1)

    def has_full_cudagraphs(self) -> bool:
        return self in (_GraphMode.FULL, _GraphMode.FULL_DECODE_ONLY, _GraphMode.FULL_AND_PIECEWISE)


ATTENTION_SPLIT = ["vllm::unified_attention_with_output"]


def _gpu_config(mode, capture=(1, 2, 4), eager=False, lora=None, speculative=None, v2=False, level=3,
                splitting=ATTENTION_SPLIT, partition=False):
    return SimpleNamespace(model_config=SimpleNamespace(enforce_eager=eager),
                           parallel_config=SimpleNamespace(enable_dbo=False, ubatch_size=0),
                           compilation_config=SimpleNamespace(mode=level, cudagraph_mode=mode,
                                                              cudagraph_capture_sizes=list(capture),
                                                              splitting_ops=list(splitting),
                                                              use_inductor_graph_partition=partition),
                           lora_config=lora, speculative_config=speculative, use_v2_model_runner=v2)


def test_full_cuda_graphs_lora_and_speculative_decoding_are_refused_in_one_line():
    for mode in (_GraphMode.FULL, _GraphMode.FULL_DECODE_ONLY, _GraphMode.FULL_AND_PIECEWISE):
        with pytest.raises(PluginConfigError, match=f"cudagraph_mode {mode.name}: .*PIECEWISE.* or --enforce-eager"):
            check_engine_config(_gpu_config(mode))
    for fine in (_gpu_config(_GraphMode.PIECEWISE), _gpu_config(_GraphMode.NONE),
                 _gpu_config(_GraphMode.FULL_AND_PIECEWISE, capture=()),   # vLLM's CPU build captures no graph
                 _gpu_config(_GraphMode.FULL, eager=True)):
        check_engine_config(fine)
    with pytest.raises(PluginConfigError, match="does not support LoRA.*without --enable-lora"):
        check_engine_config(_gpu_config(_GraphMode.PIECEWISE, lora=SimpleNamespace(max_loras=1)))
    with pytest.raises(PluginConfigError, match="speculative decoding.*without --speculative-config"):
        check_engine_config(_gpu_config(_GraphMode.PIECEWISE, speculative=SimpleNamespace(method="eagle3")))
    for bad in (_gpu_config(_GraphMode.FULL), _gpu_config(_GraphMode.NONE, lora=1), _gpu_config(_GraphMode.NONE, speculative=1)):
        with pytest.raises(PluginConfigError) as err:
            check_engine_config(bad)
        assert "\n" not in str(err.value)


def test_cuda_graphs_are_allowed_only_under_piecewise_compilation_with_run_1_split_out():
    """Issue 65: where graphs are captured, only VLLM_COMPILE + PIECEWISE + breakable graphs off +
    FX splitting with splitting ops passes; each other way is refused in one line naming the flag.
    Stock torch.compile is refused with or without graphs; nothing captured (eager, NONE, no
    capture sizes) always passes the graph rules."""
    piecewise = _GraphMode.PIECEWISE
    check_engine_config(_gpu_config(piecewise), breakable=False)
    refused = {
        "VLLM_USE_BREAKABLE_CUDAGRAPH=0": (_gpu_config(piecewise, level=0), True),
        "compilation mode NONE, cudagraph_mode FULL_DECODE_ONLY.*-cc.cudagraph_mode=NONE":
            (_gpu_config(_GraphMode.FULL_DECODE_ONLY, level=0), False),
        "compilation mode DYNAMO_TRACE_ONCE": (_gpu_config(_GraphMode.FULL, level=2), False),
        "stock torch.compile.*without -cc.mode=1": (_gpu_config(_GraphMode.FULL_DECODE_ONLY, level=1), False),
        "Inductor's graph partition.*use_inductor_graph_partition=false": (_gpu_config(piecewise, partition=True),
                                                                             False),
        r"no splitting ops \(-cc.splitting_ops=\[\]": (_gpu_config(piecewise, splitting=()), False),
    }
    for message, (config, breakable) in refused.items():
        with pytest.raises(PluginConfigError, match=message) as err:
            check_engine_config(config, breakable=breakable)
        assert "\n" not in str(err.value) and ("--enforce-eager" in str(err.value))
    with pytest.raises(PluginConfigError, match="stock torch.compile"):   # no graphs (vLLM's CPU build) either
        check_engine_config(_gpu_config(_GraphMode.NONE, level=1, capture=()), breakable=False)
    for nothing_captured in (_gpu_config(_GraphMode.NONE, level=0), _gpu_config(piecewise, level=2, capture=()),
                             _gpu_config(_GraphMode.FULL, level=0, eager=True)):
        check_engine_config(nothing_captured, breakable=True)


def test_the_breakable_switch_is_read_as_vllm_reads_it_and_the_launcher_turns_it_off():
    from juice.vllm.constraints import BREAKABLE_ENV, breakable_cuda_graphs
    from juice.vllm.launch import server_environment

    assert [breakable_cuda_graphs({BREAKABLE_ENV: v}) for v in ("1", "0", "true", "")] == [True, False, False, False]
    assert breakable_cuda_graphs({}) is False
    assert server_environment([], base={})[BREAKABLE_ENV] == "0"   # so VLLM_BATCH_INVARIANT=1 keeps piecewise
    assert server_environment([], base={BREAKABLE_ENV: "1"})[BREAKABLE_ENV] == "1"   # the user's: refused at start


GPU_SETTINGS = {
    # name: (environment, EngineArgs keywords, what juice says: a refusal's words or None)
    "vLLM's default (FULL_AND_PIECEWISE)": ({}, {}, "full CUDA graphs .cudagraph_mode FULL_AND_PIECEWISE"),
    "juice serve's PIECEWISE": ({}, {"compilation_config": {"cudagraph_mode": "PIECEWISE"}}, None),
    "TORCH_COMPILE_DISABLE=1": ({"TORCH_COMPILE_DISABLE": "1"}, {},
                                "compilation mode NONE, cudagraph_mode FULL_DECODE_ONLY"),
    "-cc.mode=none": ({}, {"compilation_config": {"mode": 0}}, "compilation mode NONE, cudagraph_mode FULL_DECODE_ONLY"),
    "-cc.mode=none, PIECEWISE (vLLM: no graphs)": ({}, {"compilation_config": {"mode": 0, "cudagraph_mode": "PIECEWISE"}},
                                                   None),
    "VLLM_USE_BREAKABLE_CUDAGRAPH=1": ({"VLLM_USE_BREAKABLE_CUDAGRAPH": "1"},
                                       {"compilation_config": {"cudagraph_mode": "PIECEWISE"}}, "breakable CUDA graphs"),
    "VLLM_BATCH_INVARIANT=1, bf16 on Hopper": ({"VLLM_BATCH_INVARIANT": "1"},
                                               {"dtype": "bfloat16", "compilation_config": {"cudagraph_mode": "PIECEWISE"}},
                                               "breakable CUDA graphs"),
    "VLLM_BATCH_INVARIANT=1 under juice serve's environment": ({"VLLM_BATCH_INVARIANT": "1",
                                                                "VLLM_USE_BREAKABLE_CUDAGRAPH": "0"},
                                                               {"dtype": "bfloat16",
                                                                "compilation_config": {"cudagraph_mode": "PIECEWISE"}},
                                                               None),
    "-cc.mode=1": ({}, {"compilation_config": {"mode": 1}}, "stock torch.compile"),
    "-cc.mode=1, no graphs": ({}, {"compilation_config": {"mode": 1, "cudagraph_mode": "NONE"}}, "stock torch.compile"),
    "-cc.mode=2": ({}, {"compilation_config": {"mode": 2}}, "compilation mode DYNAMO_TRACE_ONCE"),
    "-cc.mode=2, no graphs (the CPU build's mode)": ({}, {"compilation_config": {"mode": 2, "cudagraph_mode": "NONE"}},
                                                    None),
    "PIECEWISE, splitting_ops=[] (vLLM: no graphs)": ({}, {"compilation_config": {"cudagraph_mode": "PIECEWISE",
                                                                                "splitting_ops": []}}, None),
    "FULL_AND_PIECEWISE, splitting_ops=[] (vLLM: FULL)": ({}, {"compilation_config": {"splitting_ops": []}},
                                                          "full CUDA graphs .cudagraph_mode FULL:"),
    "Inductor graph partition": ({}, {"compilation_config": {"cudagraph_mode": "PIECEWISE",
                                                             "use_inductor_graph_partition": True}},
                                 "Inductor's graph partition"),
    "--enforce-eager": ({}, {"enforce_eager": True}, None),
}


def gpu_engine_configs(python: str, folder: Path, settings: dict) -> dict:
    """vLLM's engine configuration for each of `settings` (name -> (environment, EngineArgs
    keywords, ...)) as an H100 builds it, with juice's verdict (tests/vllm_env/gpu_engine_configs.py
    run by `python`, vLLM's), on a config-only Llama whose output projection is a Hopper-tuned
    2048 x 2048 (so VLLM_BATCH_INVARIANT=1 in bf16 really switches breakable graphs on); files in
    `folder`. Every setting runs with VLLM_USE_V2_MODEL_RUNNER=0, as juice serve starts vLLM.

    Raises:
        RuntimeError: the script failed (its stderr's end)."""
    import json

    from transformers import AutoConfig

    from conftest import COMMON, make_tokenizer

    model = folder / "hopper-shaped"   # a config only: building an engine config reads no weights
    AutoConfig.for_model("llama", hidden_size=2048, intermediate_size=6144, num_hidden_layers=1,
                         num_attention_heads=16, num_key_value_heads=8, head_dim=128, torch_dtype="bfloat16",
                         **COMMON).save_pretrained(model)
    make_tokenizer().save_pretrained(model)
    (folder / "settings.json").write_text(json.dumps({name: {"env": {"VLLM_USE_V2_MODEL_RUNNER": "0", **env},
                                                             "args": args}
                                                      for name, (env, args, *_) in settings.items()}))
    script = Path(__file__).resolve().parents[1] / "vllm_env" / "gpu_engine_configs.py"
    done = subprocess.run([python, str(script), str(model), str(folder / "settings.json"),
                           str(folder / "out.json")], capture_output=True, text=True, timeout=600, cwd=folder)
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads((folder / "out.json").read_text())


@pytest.mark.skipif(VLLM_PYTHON is None, reason="no vLLM environment (run scripts/install-vllm.sh)")
def test_vllms_own_gpu_engine_configs_get_the_verdicts_the_rules_say(tmp_path):
    """Issue 65: vLLM 0.32's own `EngineArgs(...).create_engine_config()` as an H100 gets it (vLLM's
    CUDA platform class told capability 9.0; tests/vllm_env/gpu_engine_configs.py), under each
    setting a user can start with: the graph mode vLLM settles on, and juice's verdict. Shows the
    paths that were silent before (compilation off -> one FULL_DECODE_ONLY graph; breakable graphs,
    also switched on by VLLM_BATCH_INVARIANT for a bf16 model whose output projection is a Hopper-tuned
    2048 x 2048) refused, juice serve's own settings passing, and vLLM itself turning piecewise graphs
    with no splitting ops into none."""
    got = gpu_engine_configs(VLLM_PYTHON, tmp_path, GPU_SETTINGS)
    for name, (_, _, expected) in GPU_SETTINGS.items():
        result = got[name]
        assert result["breakable_juice"] == result["breakable_vllm"], (name, result)
        if expected is None:
            assert result["refusal"] is None, (name, result)
        else:
            assert result["refusal"] is not None and re.search(expected, result["refusal"]), (name, result)
            assert "\n" not in result["refusal"]
    assert got["TORCH_COMPILE_DISABLE=1"]["cudagraph_mode"] == "FULL_DECODE_ONLY"   # the silent path, now refused
    assert got["VLLM_BATCH_INVARIANT=1, bf16 on Hopper"]["breakable_vllm"] is True
    assert got["juice serve's PIECEWISE"]["capture_sizes"] > 0 and got["juice serve's PIECEWISE"]["splitting_ops"]
    assert got["PIECEWISE, splitting_ops=[] (vLLM: no graphs)"]["cudagraph_mode"] == "NONE"


def test_attention_layers_sharing_a_kv_cache_are_refused():
    check_kv_sharing(SimpleNamespace(kv_sharing_target_layer_name=None), "model.layers.3.self_attn.attn")
    with pytest.raises(PluginConfigError, match="model.layers.20.self_attn.attn reads model.layers.3.self_attn.attn's"):
        check_kv_sharing(SimpleNamespace(kv_sharing_target_layer_name="model.layers.3.self_attn.attn"),
                         "model.layers.20.self_attn.attn")


@pytest.mark.skipif(VLLM_PYTHON is None, reason="no vLLM environment (run scripts/install-vllm.sh)")
def test_vllms_own_graph_modes_are_classified_as_the_refusal_expects():
    """vLLM's real `CUDAGraphMode`: the full modes are refused, PIECEWISE and NONE pass."""
    code = ("from vllm.config import CUDAGraphMode as M\n"
            "print(' '.join(m.name for m in M if m.has_full_cudagraphs()))")
    done = subprocess.run([VLLM_PYTHON, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    full = set(done.stdout.split())
    assert full == {"FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"}
    for name in full:
        with pytest.raises(PluginConfigError):
            check_engine_config(_gpu_config(_GraphMode[name]))


def test_model_runner_v2_is_refused_and_the_launcher_pins_v1():
    with pytest.raises(PluginConfigError, match="V1 model runner, not Model Runner V2.*VLLM_USE_V2_MODEL_RUNNER=0"):
        check_engine_config(_gpu_config(_GraphMode.PIECEWISE, v2=True))
    check_engine_config(_gpu_config(_GraphMode.PIECEWISE, v2=False))
    from juice.vllm.launch import server_environment

    assert server_environment([], base={})["VLLM_USE_V2_MODEL_RUNNER"] == "0"


@pytest.mark.skipif(VLLM_PYTHON is None, reason="no vLLM environment (run scripts/install-vllm.sh)")
def test_vllms_own_runner_choice_follows_the_pin(tmp_path):
    """vLLM's real `VllmConfig.use_v2_model_runner` under the launcher's environment: V1, which
    passes. (V2 cannot be configured on vLLM's CPU build, "Model Runner V2 requires Triton"; its
    refusal is tested above on a config object.)"""
    import os

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from conftest import COMMON, make_tokenizer

    config = AutoConfig.for_model("llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, **COMMON)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "tiny")
    make_tokenizer().save_pretrained(tmp_path / "tiny")
    code = ("import sys\nfrom vllm.engine.arg_utils import EngineArgs\n"
            "from juice.vllm.constraints import PluginConfigError, check_engine_config\n"
            f"cfg = EngineArgs(model={str(tmp_path / 'tiny')!r}).create_engine_config()\n"
            "try:\n    check_engine_config(cfg); print('RUNNER', cfg.use_v2_model_runner, 'passes')\n"
            "except PluginConfigError as err:\n    print('RUNNER', cfg.use_v2_model_runner, 'refused')\n")
    from juice.vllm.launch import server_environment

    done = subprocess.run([VLLM_PYTHON, "-c", code], capture_output=True, text=True, timeout=300,
                          env=server_environment([], base=dict(os.environ)), cwd=tmp_path)
    assert "RUNNER False passes" in done.stdout, done.stderr[-2000:]


def test_run_1_is_a_split_point_of_piecewise_compilation_and_keys_the_compile_cache():
    """JuICE's run 1 is a call (CLEAN_RUN_OP) inside the compiled forward: with vLLM's piecewise
    splitting ops (a GPU's default) it is added to them once, so it runs eagerly between the
    captured pieces; with none (vLLM's CPU build, one Inductor graph) the list stays empty."""
    piecewise = SimpleNamespace(compilation_config=SimpleNamespace(splitting_ops=["vllm::unified_attention"]))
    split_at_run1(piecewise)
    split_at_run1(piecewise)
    assert piecewise.compilation_config.splitting_ops == ["vllm::unified_attention", CLEAN_RUN_OP]
    whole = SimpleNamespace(compilation_config=SimpleNamespace(splitting_ops=[]))
    split_at_run1(whole)
    assert whole.compilation_config.splitting_ops == []
    config = SimpleNamespace(additional_config={})
    note_compiled_structure(config, SimpleNamespace(n_layers=4, n_heads=2), [(1, 0)], (1, 2))
    # a graph without the calls is not reused
    assert config.additional_config[COMPILE_KEY]["run1"] == [CLEAN_RUN_OP, SHADOW_ATTENTION_OP]


@pytest.mark.skipif(VLLM_PYTHON is None, reason="no vLLM environment (run scripts/install-vllm.sh)")
def test_vllms_own_graph_splitter_puts_run_1_in_a_piece_of_its_own():
    """vLLM's `split_graph` (what piecewise compilation and CUDA graph capture use) on a traced
    forward that calls run 1's op between two layers' arithmetic: the op is a splitting piece
    alone (run eagerly), with compiled pieces before and after it."""
    code = ("import torch\nfrom torch import fx\nfrom vllm.compilation.backends import split_graph\n"
            "import juice.vllm.models\nfrom juice.vllm.constraints import CLEAN_RUN_OP\n"
            "class F(torch.nn.Module):\n"
            "    def forward(self, h, pos, clean):\n"
            "        h = h * 2\n"
            "        torch.ops.juice.clean_run(h, None, pos, clean, 'model.layers.1.self_attn.attn')\n"
            "        return h + clean[: h.shape[0], 0].sum(-1, keepdim=True)\n"
            "gm = fx.symbolic_trace(F())\n"
            "_, items = split_graph(gm, ['vllm::unified_attention_with_output', CLEAN_RUN_OP])\n"
            "for item in items:\n"
            "    ops = [str(n.target) for n in item.graph.graph.nodes if n.op == 'call_function']\n"
            "    print('PIECE', item.is_splitting_graph, '|'.join(ops))\n")
    done = subprocess.run([VLLM_PYTHON, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    pieces = [line.split(" ", 2)[1:] for line in done.stdout.splitlines() if line.startswith("PIECE")]
    assert [p[0] for p in pieces] == ["False", "True", "False"], done.stdout
    assert "juice.clean_run" in pieces[1][1] and "|" not in pieces[1][1]
    assert "juice.clean_run" not in pieces[0][1] + pieces[2][1]


def test_kv_transfer_kv_offloading_and_weight_transfer_are_refused_naming_the_flag():
    """Issue 88, items 2 and 5: a KV connector (LMCache and the others; `--kv-offloading-size`
    becomes one) looks blocks up without the steering's cache salt, and weight transfer replaces
    the weights the heads files were fingerprinted on: both refused at start in one line."""
    def config(**extra):
        base = SimpleNamespace(model_config=SimpleNamespace(enforce_eager=True),
                               parallel_config=SimpleNamespace(enable_dbo=False, ubatch_size=0))
        for key, value in extra.items():
            setattr(base, key, value)
        return base

    check_engine_config(config(kv_transfer_config=None, weight_transfer_config=None), breakable=False)
    with pytest.raises(PluginConfigError, match="--kv-transfer-config and --kv-offloading-size") as refused:
        check_engine_config(config(kv_transfer_config=SimpleNamespace(kv_connector="LMCacheConnectorV1")),
                            breakable=False)
    assert "\n" not in str(refused.value)
    with pytest.raises(PluginConfigError, match="without --weight-transfer-config"):
        check_engine_config(config(weight_transfer_config=SimpleNamespace(backend="nccl")), breakable=False)

