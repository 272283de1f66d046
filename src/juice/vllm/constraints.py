"""The vLLM configurations juice's plugin can steer in, checked when the model is built.

The steered model (:mod:`juice.vllm.models`) reads each request's token rows from the forward's
attention metadata, `query_start_loc[i]:query_start_loc[i+1]` for the batch's i-th request, with
per-batch Python state. A configuration where that reading would be wrong is refused with a
one-line :class:`PluginConfigError` naming the flag, before any request is served:

- no dual-batch overlap or micro-batching (`--enable-dbo`, `--ubatch-size`): each micro-batch's
  metadata numbers its requests from 0, so a second micro-batch would read the first one's
  requests' coefficients;
- an attention backend whose metadata has `query_start_loc` (FlashInfer's has none, and would
  crash on the first steered batch): `--attention-backend` picks another;
- CUDA graphs only where the steering provably runs on every step (:func:`cuda_graph_refusal`):
  vLLM's piecewise compilation (compilation mode VLLM_COMPILE) with `cudagraph_mode` PIECEWISE,
  breakable graphs off, FX graph splitting (not Inductor's graph partition) and splitting ops to
  which juice's run-1 op is added (:func:`split_at_run1`). Any other way of capturing graphs
  would replay steps without the Python that fills the steering's per-step tables and runs
  JuICE's run 1: full graphs (FULL, FULL_DECODE_ONLY, FULL_AND_PIECEWISE, vLLM's default on a
  GPU; and what vLLM 0.32 captures when compilation is off, `TORCH_COMPILE_DISABLE=1` or
  `-cc.mode=NONE`: the whole model as one FULL_DECODE_ONLY graph, so every pure-decode step
  would be served unsteered), breakable graphs (`VLLM_USE_BREAKABLE_CUDAGRAPH=1`, which
  `VLLM_BATCH_INVARIANT=1` turns on for bf16 on Hopper: the whole model stream-captured with only
  attention breaking out). `juice serve --engine vllm` passes `cudagraph_mode=PIECEWISE` on a GPU;
  `--enforce-eager` or `cudagraph_mode=NONE` capture nothing and always pass;
- not stock torch.compile (`-cc.mode=STOCK_TORCH_COMPILE`): vLLM compiles the whole model with
  `fullgraph=True`, the steering's per-step plan (host reads, `.tolist()`, the batch's Python
  state) included, which that mode cannot trace faithfully;
- no LoRA (`--enable-lora`): vLLM's LoRA layers call the output projection's weights directly,
  so the steering hook would never fire;
- no speculative decoding (`--speculative-config`): the draft model would be steered too, and
  the dual run does not return what EAGLE-style drafts read;
- no KV-sharing attention layers (`kv_sharing_target_layer_name`): run 1's clean attention would
  write its KV into another layer's cache;
- no KV transfer or offloading (`--kv-transfer-config`, `--kv-offloading-size`): a connector
  such as LMCache's looks blocks up by their tokens without the request's `cache_salt`, so a
  steered request could load another steering's KV (and JuICE's clean layers, which Original
  never writes);
- no weight transfer (`--weight-transfer-config`, the RL weight updates): the heads files'
  fingerprints are checked against the weights served at start, and new weights would be
  steered with another model's heads;
- juice's logits processor named in vLLM's `logits_processors` (`--logits-processors
  juice.vllm.processor:JuiceSteeringProcessor`): it carries each request's steering to the model;
  without it every request would be served unsteered;
- with prefix caching on, juice's scheduler named in vLLM's `scheduler_cls` (`--scheduler-cls
  juice.vllm.scheduler.salting_scheduler`): it sets each steered request's KV cache salt from its
  steering (:mod:`juice.vllm.scheduler`); without it a steered request would reuse KV that
  another steering, or Original, computed;
- in each worker, the plugin on where vLLM's config carries juice's set-up: the on-switch
  (`JUICE_VLLM_HEADS` or `JUICE_VLLM=1`) is read from the worker's environment when vLLM loads its
  plugins, before the config reaches the model; a worker without it (vLLM's legacy Ray executor,
  `VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0`, copies only the variables with the prefixes it is told)
  would build vLLM's own model and serve every request unsteered;
- vLLM's V1 model runner, the one whose contract (the persistent batch the logits processor
  sees, the attention metadata the model reads) the plugin was built and tested against: Model
  Runner V2 (`VllmConfig.use_v2_model_runner`; vLLM picks it by default where Triton works, e.g.
  on a GPU) keeps its own request state and is refused until verified. `VLLM_USE_V2_MODEL_RUNNER=0`
  pins V1; `juice serve --engine vllm` sets it (:func:`juice.vllm.launch.server_environment`).

Kept apart from :mod:`juice.vllm.models` so that it imports nothing of vLLM: its checks take
vLLM's config and backend classes as they are and are tested without vLLM installed.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from typing import Any

from juice.vllm import LOGITS_PROCESSOR, SCHEDULER
from juice.vllm.processes import PluginConfigError

ROW_FIELD = "query_start_loc"
"""The attention metadata field the steered model reads each request's token rows from."""


def check_engine_config(vllm_config: Any, breakable: bool | None = None) -> None:
    """Refuse an engine configuration the steering would be wrong in (module docstring).

    Args:
        vllm_config: vLLM's `VllmConfig` (reads `parallel_config.enable_dbo` and `.ubatch_size`,
            `compilation_config` (:func:`cuda_graph_refusal`), `lora_config`, `speculative_config`,
            `kv_transfer_config`, `weight_transfer_config`, `use_v2_model_runner`).
        breakable: whether vLLM uses breakable CUDA graphs; None reads this process's environment
            as vLLM does (:func:`breakable_cuda_graphs`).

    Raises:
        PluginConfigError: one line naming the flag to change.
    """
    parallel = vllm_config.parallel_config
    if getattr(parallel, "enable_dbo", False) or getattr(parallel, "ubatch_size", 0) > 1:
        raise PluginConfigError("juice's vLLM plugin does not support dual-batch overlap or micro-batching "
                                "(each micro-batch would read other requests' steering): start vLLM without "
                                "--enable-dbo and --ubatch-size")
    refusal = cuda_graph_refusal(vllm_config, breakable_cuda_graphs() if breakable is None else breakable)
    if refusal is not None:
        raise PluginConfigError(refusal)
    if getattr(vllm_config, "lora_config", None) is not None:
        raise PluginConfigError("juice's vLLM plugin does not support LoRA (vLLM's LoRA layers bypass the output "
                                "projection's hook, so nothing would be steered): start vLLM without --enable-lora")
    if getattr(vllm_config, "speculative_config", None) is not None:
        raise PluginConfigError("juice's vLLM plugin does not support speculative decoding (the draft model would "
                                "be steered too): start vLLM without --speculative-config")
    if getattr(vllm_config, "kv_transfer_config", None) is not None:
        raise PluginConfigError("juice's vLLM plugin does not support KV transfer or offloading (a KV connector such "
                                "as LMCache looks prompts up by their tokens without the steering's cache salt, and "
                                "would load another steering's KV, or JuICE clean layers Original never wrote): start "
                                "vLLM without --kv-transfer-config and --kv-offloading-size")
    if getattr(vllm_config, "weight_transfer_config", None) is not None:
        raise PluginConfigError("juice's vLLM plugin does not support weight transfer (heads files are chosen on, and "
                                "fingerprinted to, the weights served at start; new weights would be steered with "
                                "another model's heads): start vLLM without --weight-transfer-config")
    if getattr(vllm_config, "use_v2_model_runner", False) is True:
        raise PluginConfigError("juice's vLLM plugin was built and tested on vLLM's V1 model runner, not Model "
                                "Runner V2 (its request state and metadata are unverified): start vLLM with "
                                "VLLM_USE_V2_MODEL_RUNNER=0")


PROCESSOR_NAME = LOGITS_PROCESSOR
"""The logits processor's fully qualified name (:data:`juice.vllm.LOGITS_PROCESSOR`)."""

PROCESSOR_MISSING = ("juice's vLLM plugin needs its logits processor, which carries each request's steering to the "
                     f"model: start vLLM with --logits-processors {PROCESSOR_NAME} (juice serve --engine vllm passes "
                     "it; offline: LLM(..., **juice.vllm.llm_options()))")


def check_logits_processor(vllm_config: Any) -> None:
    """Refuse a steered model whose engine does not load juice's logits processor (module docstring).

    Args:
        vllm_config: vLLM's `VllmConfig` (reads `model_config.logits_processors`: names as
            `module:Class` or classes).

    Raises:
        PluginConfigError: :data:`PROCESSOR_MISSING`.
    """
    named = getattr(vllm_config.model_config, "logits_processors", None) or []
    module, _, name = PROCESSOR_NAME.partition(":")
    for entry in named:
        if entry == PROCESSOR_NAME or (isinstance(entry, type) and (entry.__module__, entry.__qualname__) == (module,
                                                                                                             name)):
            return
    raise PluginConfigError(PROCESSOR_MISSING)


PLUGIN_OFF_HERE = ("juice's vLLM plugin is in vLLM's config (additional_config) but off in this worker's "
                   "environment (no JUICE_VLLM_HEADS or JUICE_VLLM=1), so the worker would build vLLM's own model "
                   "and serve every request unsteered: give every worker juice's variables (Ray: "
                   "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY=JUICE_, which juice serve --engine vllm sets)")


def check_plugin_on_here(configured: bool, on_here: bool) -> None:
    """Refuse a worker whose vLLM config carries juice's set-up while its environment leaves the
    plugin off (module docstring): vLLM loads its plugins, and juice's registers the steered model
    classes, from the environment, before the config reaches the model.

    Args:
        configured: the worker's vLLM config turns the plugin on
            (:func:`juice.vllm.options.served_heads`' `enabled`).
        on_here: this process's environment turns it on (:func:`juice.vllm.options.plugin_enabled`,
            the condition under which :func:`juice.vllm.register` registers the steered classes).

    Raises:
        PluginConfigError: :data:`PLUGIN_OFF_HERE`.
    """
    if configured and not on_here:
        raise PluginConfigError(PLUGIN_OFF_HERE)


SCHEDULER_MISSING = ("juice's vLLM plugin with prefix caching needs juice's scheduler, which gives each steered "
                     "request its steering's KV cache salt: start vLLM with --scheduler-cls "
                     f"{SCHEDULER} (juice serve --engine vllm passes it; offline: "
                     "LLM(..., **juice.vllm.llm_options())) or with --no-enable-prefix-caching")


def check_scheduler(vllm_config: Any) -> None:
    """Refuse a steered model whose engine caches prefixes without juice's scheduler (module docstring).

    Args:
        vllm_config: vLLM's `VllmConfig` (reads `cache_config.enable_prefix_caching` and
            `scheduler_config.scheduler_cls`: the name :data:`juice.vllm.SCHEDULER` or the function).

    Raises:
        PluginConfigError: :data:`SCHEDULER_MISSING`.
    """
    if not getattr(vllm_config.cache_config, "enable_prefix_caching", False):
        return
    named = getattr(vllm_config.scheduler_config, "scheduler_cls", None)
    if callable(named):   # the function itself, as LLM(scheduler_cls=...) may pass it
        named = f"{getattr(named, '__module__', '')}.{getattr(named, '__qualname__', '')}"
    if named == SCHEDULER:
        return
    raise PluginConfigError(SCHEDULER_MISSING)


COMPILATION_MODES = {0: "NONE", 1: "STOCK_TORCH_COMPILE", 2: "DYNAMO_TRACE_ONCE", 3: "VLLM_COMPILE"}
"""vLLM's `CompilationMode` values and names (vLLM 0.32, `vllm.config.compilation`)."""

BREAKABLE_ENV = "VLLM_USE_BREAKABLE_CUDAGRAPH"
"""The environment variable that turns vLLM's breakable CUDA graphs on (vLLM's own config sets it
when `VLLM_BATCH_INVARIANT=1` serves bf16 on Hopper, or for some architectures by default)."""


def breakable_cuda_graphs(environ: Any = None) -> bool:
    """Whether vLLM captures breakable CUDA graphs in this process: :data:`BREAKABLE_ENV` is "1",
    read as `vllm.envs` reads it (the engine's config has set it by the time the model is built).

    Args:
        environ: the environment to read (default `os.environ`)."""
    return (os.environ if environ is None else environ).get(BREAKABLE_ENV, "0") == "1"


def captures_cuda_graphs(vllm_config: Any) -> bool:
    """Whether vLLM will capture CUDA graphs of the forward: a `cudagraph_mode` other than NONE
    and capture sizes (vLLM's CPU build and `--enforce-eager` leave none)."""
    compilation = getattr(vllm_config, "compilation_config", None)
    mode = getattr(compilation, "cudagraph_mode", None)
    if mode is None or getattr(mode, "name", str(mode)) == "NONE" or vllm_config.model_config.enforce_eager:
        return False
    return bool(getattr(compilation, "cudagraph_capture_sizes", None))


def cuda_graph_refusal(vllm_config: Any, breakable: bool) -> str | None:
    """The one-line refusal of a compilation and CUDA graph set-up in which some steps would run
    unsteered or with a stale run 1 (module docstring), or None where the steering runs on every
    step. Where graphs are captured, steering provably runs only under compilation mode
    VLLM_COMPILE, `cudagraph_mode` PIECEWISE, breakable graphs off, FX graph splitting, and a
    non-empty `splitting_ops` (juice's run-1 op joins it, :func:`split_at_run1`): pieces
    between splitting ops are replayed, the hooks' arithmetic in them reads the tables at fixed
    addresses, and the splitting ops (attention, run 1) run eagerly. Stock torch.compile is
    refused with or without graphs.

    Args:
        vllm_config: vLLM's `VllmConfig` after its own normalisation (reads `model_config.enforce_eager`,
            `compilation_config.mode`, `.cudagraph_mode`, `.cudagraph_capture_sizes`, `.splitting_ops`,
            `.use_inductor_graph_partition`).
        breakable: whether vLLM uses breakable CUDA graphs (:func:`breakable_cuda_graphs`).

    Source: vLLM 0.32's `VllmConfig.__post_init__` (`config/vllm.py`: compilation off turns
    FULL_AND_PIECEWISE into FULL_DECODE_ONLY; breakable graphs set mode NONE and keep piecewise),
    `GPUModelRunner.load_model` (the wrappers), `CompilationConfig.set_splitting_ops_for_v1`.
    """
    compilation = getattr(vllm_config, "compilation_config", None)
    if compilation is None:
        return None
    level = getattr(compilation, "mode", None)
    level = None if level is None else int(level)
    if level == 1 and not vllm_config.model_config.enforce_eager:
        return ("juice's vLLM plugin cannot steer under stock torch.compile (compilation mode STOCK_TORCH_COMPILE "
                "compiles the whole model with fullgraph=True, the steering's per-step plan included): start vLLM "
                "without -cc.mode=1 (vLLM's default, VLLM_COMPILE, steers) or with --enforce-eager")
    if not captures_cuda_graphs(vllm_config):
        return None
    graph = compilation.cudagraph_mode
    graph = getattr(graph, "name", str(graph))
    if breakable:
        return (f"juice's vLLM plugin cannot steer under breakable CUDA graphs ({BREAKABLE_ENV}=1, also set by "
                f"VLLM_BATCH_INVARIANT=1 for bf16 on Hopper: the whole model is captured and only attention breaks "
                f"out, so replayed steps skip the steering and run 1): start vLLM with {BREAKABLE_ENV}=0, or with "
                "--enforce-eager")
    if level != 3:
        name = COMPILATION_MODES.get(level, str(level))
        return (f"juice's vLLM plugin cannot steer under CUDA graphs without vLLM's piecewise compilation "
                f"(compilation mode {name}, cudagraph_mode {graph}: the whole model is one captured graph, so "
                "replayed decode steps would run unsteered): start vLLM with -cc.cudagraph_mode=NONE, or compiled "
                "(no TORCH_COMPILE_DISABLE=1, -cc.mode=VLLM_COMPILE) with -cc.cudagraph_mode=PIECEWISE, or with "
                "--enforce-eager")
    if graph != "PIECEWISE":
        return (f"juice's vLLM plugin cannot steer under full CUDA graphs (cudagraph_mode {graph}: a replayed graph "
                "skips the steering, so JuICE would add a stale run 1): start vLLM with --compilation-config "
                "'{\"cudagraph_mode\": \"PIECEWISE\"}' or --enforce-eager")
    if getattr(compilation, "use_inductor_graph_partition", False):
        return ("juice's vLLM plugin has not been verified with Inductor's graph partition (run 1's split out of "
                "the captured pieces is proven for vLLM's FX splitting only): start vLLM with "
                "-cc.use_inductor_graph_partition=false, or with --enforce-eager")
    if not getattr(compilation, "splitting_ops", None):
        return ("juice's vLLM plugin cannot steer under piecewise CUDA graphs with no splitting ops "
                "(-cc.splitting_ops=[]: run 1 would be captured inside a piece and replayed stale): leave "
                "splitting_ops unset, or start vLLM with --enforce-eager")
    return None


def check_kv_sharing(attention: Any, layer_name: str) -> None:
    """Refuse an attention layer that shares another layer's KV cache (module docstring).

    Args:
        attention: a vLLM `Attention` module (reads `kv_sharing_target_layer_name`).

    Raises:
        PluginConfigError: one line naming both layers.
    """
    target = getattr(attention, "kv_sharing_target_layer_name", None)
    if target:
        raise PluginConfigError(f"juice's vLLM plugin cannot steer a model whose attention layers share KV caches "
                                f"({layer_name} reads {target}'s; run 1 would write into it)")


def compiled_mode(vllm_config: Any) -> bool:
    """Whether vLLM compiles the model's forward (torch.compile; on a GPU also CUDA graphs): not
    `--enforce-eager` and a compilation mode other than none."""
    if vllm_config.model_config.enforce_eager:
        return False
    mode = getattr(vllm_config.compilation_config, "mode", None)
    return mode is None or int(mode) != 0   # CompilationMode.NONE == 0


CLEAN_RUN_OP = "juice::clean_run"
"""The custom op through which JuICE's run 1 runs inside vLLM's compiled forward
(:mod:`juice.vllm.models`): `(hidden, residual, positions, clean, model) -> ()`, writing run 1's
head outputs into `clean`."""


SHADOW_ATTENTION_OP = "juice::shadow_attention"
"""The custom op through which a dual-run layer's shadow rows (JuICE's run 1 inside run 2's matrix
products, :mod:`juice.vllm.models`) attend over their clean KV: `(query, key, value, out, layer) ->
()`, writing the shadow rows of `out`; called after the layer's attention, a no-op in a forward
without shadow rows."""


def split_at_run1(vllm_config: Any) -> None:
    """Make :data:`CLEAN_RUN_OP` a split point of vLLM's piecewise compilation (append it to
    `compilation_config.splitting_ops` when that list is not empty), so that run 1, which runs
    vLLM's attention and Python between the layers, runs eagerly between the compiled (on a GPU,
    CUDA-graph captured) pieces, as vLLM's attention does. With no splitting ops (vLLM's CPU
    build compiles the whole forward with Inductor), Inductor calls the op from its code.
    Called in the model's constructor, before vLLM compiles its first forward (vLLM reads the
    list when it compiles)."""
    ops = vllm_config.compilation_config.splitting_ops
    if ops and CLEAN_RUN_OP not in ops:
        ops.append(CLEAN_RUN_OP)


COMPILE_KEY = "juice_vllm"
"""The key of juice's entry in vLLM's `additional_config` (part of vLLM's compile cache key)."""


def note_compiled_structure(vllm_config: Any, geometry: Any, slots: list[tuple[int, int]],
                            dual: tuple[int, int] | None) -> None:
    """Put what the compiled graph depends on (the head slots JuICE adds to, the dual-run layers,
    the geometry, the plugin's code version) in `vllm_config.additional_config`, which vLLM hashes
    into its compile cache key: a graph compiled for other heads files, or by stock vLLM without
    the plugin's hooks, is then never loaded for this model. Called in the model's constructor,
    before vLLM compiles its first forward."""
    from juice import __version__

    extra = vllm_config.additional_config
    if not isinstance(extra, dict):
        raise PluginConfigError("juice's vLLM plugin in compiled mode needs additional_config to be a JSON object "
                                "(it keys the compile cache by the steered heads); or start vLLM with --enforce-eager")
    extra[COMPILE_KEY] = {"version": __version__, "run1": [CLEAN_RUN_OP, SHADOW_ATTENTION_OP],
                          "slots": [list(s) for s in slots],
                          "dual": list(dual) if dual else None, "layers": geometry.n_layers,
                          "heads": geometry.n_heads}


def metadata_fields(backend: Any) -> set[str] | None:
    """The field names of the attention metadata `backend` builds, or None where they cannot be
    read (its builder does not name a dataclass as `AttentionMetadataBuilder[Metadata]`).

    Args:
        backend: a vLLM attention backend class (`get_builder_cls()`).
    """
    builder = backend.get_builder_cls()
    for klass in getattr(builder, "__mro__", (builder,)):
        for base in getattr(klass, "__orig_bases__", ()):
            for arg in typing.get_args(base):
                if dataclasses.is_dataclass(arg):
                    return {f.name for f in dataclasses.fields(arg)}
    return None


def check_attention_backend(backend: Any) -> None:
    """Refuse an attention backend whose metadata has no `query_start_loc` (module docstring).
    A backend whose metadata cannot be read passes here; the steered model checks its metadata
    again on the first steered batch.

    Raises:
        PluginConfigError: one line naming the backend and `--attention-backend`.
    """
    fields = metadata_fields(backend)
    if fields is not None and ROW_FIELD not in fields:
        raise PluginConfigError(missing_rows_message(backend.get_name()))


def missing_rows_message(backend_name: str) -> str:
    """The refusal of an attention backend without `query_start_loc`."""
    return (f"juice's vLLM plugin cannot steer with the {backend_name} attention backend (its metadata has no "
            f"{ROW_FIELD} to find each request's tokens): start vLLM with --attention-backend naming another "
            "(e.g. FLASH_ATTN, TRITON_ATTN; CPU_ATTN on the CPU)")

