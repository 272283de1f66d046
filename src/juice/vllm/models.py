"""vLLM model classes that steer attention heads per request: JuNE, JuICE's dual run, pruning.

Each class is vLLM's own (Gemma 3, Gemma 2, Llama, Qwen 2, Qwen 3, Mistral, Phi-3) with :class:`SteerableMixin` in
front; the plugin (:func:`juice.vllm.register`) puts them in vLLM's model registry under the
architectures' names. What the mixin adds:

- a forward pre-hook on every layer's attention output projection (`self_attn.o_proj`): per token
  row, its input `[tokens, n_local_heads * head_dim]` becomes `H * (1 + scale) + add * H_clean`
  (:mod:`juice.vllm.options`), the coefficients of the request the row belongs to (the rows of
  request i are `query_start_loc[i]:query_start_loc[i+1]` of the forward's attention metadata,
  batch index i as :mod:`juice.vllm.processor` tracks it). The coefficients live in persistent
  per-token tables (`juice_factor` = 1 + scale, `juice_add`, and run 1's outputs `juice_clean`,
  buffers of the model at fixed addresses), filled in place before each forward; the hook's
  arithmetic is the same for every batch (1 and 0 where a row is not steered), so vLLM's
  torch.compile traces it once and every later step reads the tables' current values. In eager
  mode (`--enforce-eager`) a layer no request steers is skipped, and a batch of Original requests
  runs vLLM's forward unchanged.
- JuICE's dual run (paper Alg. 1): a second attention module (`self_attn.attn_clean`, built from
  the same arguments as `self_attn.attn`, so vLLM gives it its own KV cache) on each layer from
  the first to the last layer the heads files steer. A batch without JuICE requests has no run 1,
  and the clean KV of its requests is never read. When a batch holds a JuICE request, run 1 (the
  unmodified model for JuICE rows) runs in one of two ways:

  - **Shadow rows** (the default where no CUDA graph replays the forward: vLLM's CPU build,
    `--enforce-eager`, `cudagraph_mode=NONE`): the forward gets one more row per JuICE token row,
    after the batch's rows (and its padding), so run 1 goes through the same matrix products as
    run 2, each layer's weights read once. Below the first dual-run layer a shadow row's values
    are not used (the live attention's metadata does not count it, so it reads and writes no KV);
    at that layer's input it takes its JuICE row's hidden state (`juice_source`: a JuICE row is
    not steered below it, so the two runs agree there); in each dual-run layer up to the last one
    the batch adds to, a custom op after the attention
    (:data:`juice.vllm.constraints.SHADOW_ATTENTION_OP`) runs the clean attention module on the
    shadow rows with the JuICE requests' own metadata and slots, and the output projection's hook
    adds beta times the shadow row's head outputs (`juice_partner`) to its JuICE row's. The
    forward returns the batch's rows. A forward whose shadow rows would pass
    `max_num_batched_tokens` (a long JuICE prefill chunk) runs run 1 separately instead.
  - **Separately** (where vLLM captures CUDA graphs, which replay a fixed batch: a forward with
    more rows has no graph): run 1 starts at the first dual-run layer from run 2's input to that
    layer (the layers below run once), takes the JuICE requests' tokens through the clean
    attention modules up to the last layer the batch adds to, and saves the outputs of the heads
    JuICE adds to (`juice_clean`); run 2 goes on from the same layer, its hooks adding beta times
    them. Those layers' weights are read twice.

Run 1 run separately is a custom op, :data:`juice.vllm.constraints.CLEAN_RUN_OP`, called by a pre-hook of the
first dual-run layer, in eager and compiled mode alike. In compiled mode (vLLM's default) vLLM's
compiled forward (run 2) has the call at that point, traced once; at run time the op runs run 1
eagerly (vLLM's layers called one by one) when the batch has JuICE rows and returns at once
when it has none (or runs them as shadow rows). The shadow rows' gather and attention op are in
the compiled forward too, the identity and a no-op without shadow rows. On vLLM's CPU build,
which compiles the whole forward with Inductor, Inductor calls the ops from its code; with
piecewise compilation (a GPU) the run-1 op is one of vLLM's splitting ops
(:func:`juice.vllm.constraints.split_at_run1`), so it runs between the compiled pieces and
outside piecewise CUDA graphs, as vLLM's attention does. Every other way of capturing graphs
(full graphs, graphs with compilation off, breakable graphs) would replay steps without the
Python that fills the tables and runs run 1: they are refused at start
(:func:`juice.vllm.constraints.cuda_graph_refusal`). The graph depends on the heads files
(which heads have slots in `juice_clean`) and on the ops, so the model puts both in vLLM's
`additional_config`, part of vLLM's compile cache key
(:func:`juice.vllm.constraints.note_compiled_structure`). Measured on the CPU only (docs/vllm.md,
"Compiled mode").

Prefix caching (vLLM's default) is correct because every steered request is cached under its
steering's `cache_salt` (:func:`juice.vllm.options.steering_salt`), which juice's scheduler sets
in the engine core from the request's own fields (:mod:`juice.vllm.scheduler`; the model refuses
to start with prefix caching on without it): a cached block is reused only by requests whose
steering computed the same KV, and a JuICE request's blocks hold the clean KV run 1 wrote for
them. Original requests keep the client's salt (or none) and share their blocks with every
unsteered request.

Constraints, checked when the model is built (one-line errors, :mod:`juice.vllm.constraints`):
no dual-batch overlap or micro-batching (a micro-batch's `query_start_loc` counts its requests
from 0), an attention backend whose metadata has `query_start_loc` (not FlashInfer's), no
pipeline parallelism. Tensor parallelism works: each rank steers its own heads' slice of the
row-parallel output projection. Every heads file's head must be in the served model
(:func:`juice.stage1.heads_file.check_selection_fits`). After the weights load, each heads
file's model fingerprint (model type, geometry, vocabulary, a checksum of layer 0's output
projection: :func:`juice.models.model_fingerprint`) is checked against the served model: in
`load_weights`; a loader that writes the weights without it (`--load-format dummy`,
`sharded_state`, `runai_streamer_sharded`, `ipc_cache`) is refused at start, in vLLM's model-level
post-load hook, and one that skips that hook too (`tensorizer` on a vLLM-tensorized model) at the
first forward (on a GPU vLLM's profiling run; on the CPU in eager mode the first request, which
fails rather than be served). Without heads files there is no fingerprint, and nothing to refuse. The geometry the
API server checks pruned heads against at admission (:attr:`juice.vllm.options.PluginHeads.geometry`)
must be there and, where `JUICE_VLLM_GEOMETRY` gave it, equal the model's; else the model refuses
to build, naming the value to set.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Iterable

import torch
from torch import Tensor, nn
from vllm.distributed import (get_pp_group, get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size,
                              tensor_model_parallel_all_gather)
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.attention import Attention

from juice.architectures import config_geometry, vllm_architectures
from juice.models import fingerprint_mismatch, weights_digests
from juice.stage1.heads_file import check_selection_fits
from juice.vllm.constraints import (CLEAN_RUN_OP, ROW_FIELD, SHADOW_ATTENTION_OP, PluginConfigError,
                                    captures_cuda_graphs, check_attention_backend, check_engine_config,
                                    check_kv_sharing, check_logits_processor, check_scheduler, compiled_mode,
                                    missing_rows_message, note_compiled_structure, split_at_run1)
from juice.vllm.options import ENV_GEOMETRY, PluginHeads, head_slots, served_heads
from juice.vllm.processor import BATCH



class _CleanRunDone(Exception):
    """Raised by the last dual-run layer's hook: run 1 has what run 2 needs."""


_STEERED: "weakref.WeakValueDictionary[str, SteerableMixin]" = weakref.WeakValueDictionary()
"""This process's steered models, by their first dual-run layer's attention name (a name that
is the same in every process, so a compiled graph cached on disk finds its model)."""


def _clean_run_op(hidden: Tensor, residual: Tensor | None, positions: Tensor, clean: Tensor, model: str) -> None:
    _STEERED[model].juice_run1(hidden, residual, positions, clean)


_SHADOWED: "dict[str, tuple[weakref.ReferenceType, int]]" = {}
"""This process's dual-run attention modules, by their attention name: (the steered model, the
layer's index)."""


def _shadow_attention_op(query: Tensor, key: Tensor, value: Tensor, out: Tensor, layer: str) -> None:
    model, index = _SHADOWED[layer]
    model().juice_shadow_attention(query, key, value, out, index)


def _register_op(name: str, schema: str, body: Callable) -> None:
    """`name` ("juice::op") as a PyTorch operator with `schema`, run by `body` on every device and
    a no-op under fake tensors. Defined through `torch.library.Library`, as vLLM registers its own
    ops, rather than `torch.library.custom_op`, whose Python wrapper runs on every call: the
    shadow rows' op is called once per dual-run layer on every step."""
    op = name.split("::")[1]
    _LIBRARY.define(f"{op}{schema}")
    _LIBRARY.impl(op, body, "CompositeExplicitAutograd")
    torch.library.register_fake(name, lambda *args: None, lib=_LIBRARY)


_LIBRARY = torch.library.Library("juice", "FRAGMENT")
_register_op(CLEAN_RUN_OP, "(Tensor hidden, Tensor? residual, Tensor positions, Tensor(a!) clean, str model) -> ()",
             _clean_run_op)
_register_op(SHADOW_ATTENTION_OP, "(Tensor query, Tensor key, Tensor value, Tensor(a!) out, str layer) -> ()",
             _shadow_attention_op)


class _Shadows:
    """A forward's shadow rows (run 1 inside run 2's matrix products, :meth:`SteerableMixin.forward`):
    rows `start:start + count` of the extended forward are run 1 of the JuICE token rows `tokens`
    (`[count]`, on the model's device), in that order."""

    def __init__(self, start: int, tokens: Tensor) -> None:
        self.start, self.count, self.tokens = start, int(tokens.numel()), tokens


class _Pass:
    """What one forward steers: the layers any request scales or adds to (decided on every head,
    so that every tensor-parallel rank runs the same passes and collectives), and whether the hooks
    are in run 1 (the clean pass, which saves head outputs) or run 2."""

    def __init__(self, scaled: set[int], added: set[int], juice_rows: Tensor, starts: Tensor) -> None:
        self.scaled, self.added = scaled, added
        self.clean = False
        self.clean_out: Tensor | None = None   # where run 1 writes its head outputs (the op's `clean`)
        self.last_added = max(self.added) if self.added else -1
        self.juice_rows, self.starts = juice_rows, starts   # the JuICE requests' batch indices; query_start_loc
        self.tokens: Tensor | None = None   # the token rows run 1 computes (None: all of them)
        self.shadows: _Shadows | None = None   # run 1 as shadow rows of this forward (None: run 1 separately)


def _to_device(host: Tensor, device: torch.device, dtype: torch.dtype | None = None) -> Tensor:
    """`host` copied to `device` without the host waiting for it (pinned first on a GPU, so the
    copy is asynchronous and its memory is kept until the copy is done)."""
    if device.type == "cuda":
        host = host.pin_memory()
    return host.to(device, dtype, non_blocking=True)


def _record_attention_arguments() -> tuple[dict[str, dict], Callable[[], None]]:
    """Patch `Attention.__init__` to record each module's arguments by prefix; returns the
    records and the function that undoes the patch."""
    records: dict[str, dict] = {}
    original = Attention.__init__
    signature = inspect.signature(original)

    def recording(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        arguments = dict(bound.arguments)
        arguments.pop("self")
        extra = arguments.pop("extra_impl_args", {})
        records[arguments.get("prefix", "")] = {**arguments, **extra}
        original(self, *args, **kwargs)

    Attention.__init__ = recording

    def undo() -> None:
        Attention.__init__ = original

    return records, undo


class SteerableMixin:
    """Per-request head steering for a vLLM `*ForCausalLM` class (module docstring)."""

    def __init__(self, *, vllm_config, prefix: str = "") -> None:
        records, undo = _record_attention_arguments()
        try:
            super().__init__(vllm_config=vllm_config, prefix=prefix)
        finally:
            undo()
        self.juice_plugin: PluginHeads = served_heads(vllm_config)
        check_engine_config(vllm_config)
        check_logits_processor(vllm_config)
        check_scheduler(vllm_config)
        for layer in self.model.layers:
            check_attention_backend(layer.self_attn.attn.attn_backend)
            check_kv_sharing(layer.self_attn.attn, getattr(layer.self_attn.attn, "layer_name", ""))
        if get_pp_group().world_size > 1:
            raise PluginConfigError("juice's vLLM plugin does not support pipeline parallelism; "
                                    "use tensor parallelism")
        self.juice_geometry = config_geometry(vllm_config.model_config.hf_config)
        g, told = self.juice_geometry, self.juice_plugin.geometry
        if told is None:   # admission could not check pruned heads against the model
            raise PluginConfigError(f"juice's vLLM plugin without heads files needs {ENV_GEOMETRY}={g.n_layers}x"
                                    f"{g.n_heads} (this model's layers x heads) in every vLLM process's environment, "
                                    "so that a request pruning a head outside the model is refused at admission")
        if self.juice_plugin.geometry_from == ENV_GEOMETRY and (told.n_layers, told.n_heads) != (g.n_layers,
                                                                                                  g.n_heads):
            raise PluginConfigError(f"{ENV_GEOMETRY}={told.n_layers}x{told.n_heads}, but the served model has "
                                    f"{g.n_layers} layers x {g.n_heads} heads")   # a heads file: load_weights
        for direction, selection in self.juice_plugin.selections.items():   # before any table or layer index
            try:
                check_selection_fits(selection, g, self.juice_plugin.files[direction])
            except ValueError as err:
                raise PluginConfigError(str(err)) from None
        self.juice_weights_checked = not self.juice_plugin.fingerprints   # set by load_weights (juice_check_weights)
        tp = get_tensor_model_parallel_world_size()
        self.juice_local_heads = self.juice_geometry.n_heads // tp
        first = get_tensor_model_parallel_rank() * self.juice_local_heads
        self.juice_head_slice = slice(first, first + self.juice_local_heads)
        self.juice_layers = list(self.model.layers)
        self.juice_pass: _Pass | None = None
        self.juice_compiled = compiled_mode(vllm_config)
        self.juice_vllm_config = vllm_config
        self.juice_builders: dict[tuple[str, ...], object] = {}   # run 1's attention metadata builders, per KV group
        self.juice_dual = self.juice_plugin.dual_run_layers()
        self.juice_slots = head_slots(self.juice_plugin, self.juice_head_slice) if self.juice_dual else []
        self._juice_tables(vllm_config)
        for index, layer in enumerate(self.juice_layers):
            layer.self_attn.o_proj.register_forward_pre_hook(self._juice_hook(index))
        # Shadow rows (run 1 inside run 2's matrix products) wherever no CUDA graph replays the
        # forward: a step with shadow rows is longer than the batch vLLM padded and captured for.
        self.juice_shadows = self.juice_dual is not None and not captures_cuda_graphs(vllm_config)
        self.juice_shadow_limit = min(self.juice_max_tokens, int(vllm_config.scheduler_config.max_num_batched_tokens))
        self.juice_clean_names: set[str] = set()   # the clean attention modules' names
        if self.juice_dual is not None:
            lo, hi = self.juice_dual
            for index in range(lo, hi + 1):
                attention = self.juice_layers[index].self_attn
                arguments = dict(records[attention.attn.layer_name])
                arguments["prefix"] = attention.attn.layer_name + "_clean"
                attention.attn_clean = type(attention.attn)(**arguments)
                self.juice_clean_names.add(attention.attn_clean.layer_name)
                _SHADOWED[attention.attn.layer_name] = (weakref.ref(self), index)
                attention.attn.register_forward_hook(self._juice_shadow_hook(attention.attn.layer_name))
        if self.juice_dual is not None:   # run 1: a call (CLEAN_RUN_OP) at the first dual-run layer's input
            layer = self.juice_layers[self.juice_dual[0]]
            key = layer.self_attn.attn.layer_name
            _STEERED[key] = self
            layer.register_forward_pre_hook(self._juice_run1_hook(key))
        if self.juice_compiled:   # the compiled graph depends on the slots: key vLLM's compile cache by them
            note_compiled_structure(vllm_config, self.juice_geometry, self.juice_slots, self.juice_dual)
            split_at_run1(vllm_config)

    def _juice_tables(self, vllm_config) -> None:
        """The persistent per-token tables the hooks read, filled in place before each forward
        (the compiled graph and CUDA graphs read them at fixed addresses):

        - `juice_factor` `[max_tokens, n_layers, n_local_heads, 1]`: the live output's factor,
          1 + scale (1: not scaled);
        - `juice_add` `[max_tokens, n_slots, 1]`: JuICE's coefficient at each head slot (0: none);
        - `juice_clean` `[max_tokens, n_slots, head_dim]`: run 1's output of each slot's head, where
          run 1 runs separately (:meth:`_clean_run`);
        - `juice_source` `[max_tokens]` (int64): the row whose hidden state each row takes at the
          first dual-run layer's input (itself, or for a shadow row its JuICE row);
        - `juice_partner` `[max_tokens]` (int64): each row's shadow row (itself where it has none),
          whose head outputs a JuICE row adds;
        - `juice_shadowed` (a 0-d bool): whether this forward's JuICE rows read their shadow rows
          (True) or `juice_clean` (False).

        A slot is a head of a heads file on this rank (:func:`head_slots`): only those heads can
        be added to. They are buffers of the compiled module (`self.model`), so torch.compile lifts
        them as graph inputs rather than constants. `max_tokens` is the largest forward vLLM runs:
        `max_num_batched_tokens` or the largest CUDA graph capture size, rounded up to a multiple
        of the tensor-parallel size (sequence parallelism's padding)."""
        scheduler = vllm_config.scheduler_config
        sizes = list(getattr(vllm_config.compilation_config, "cudagraph_capture_sizes", None) or [])
        tp = get_tensor_model_parallel_world_size()   # sequence parallelism pads a forward to a multiple of it
        self.juice_max_tokens = -(-max([int(scheduler.max_num_batched_tokens), *sizes]) // tp) * tp
        device, dtype = self.juice_device_dtype()
        n, g = self.juice_max_tokens, self.juice_geometry
        head_dim = self.juice_layers[0].self_attn.o_proj.input_size // g.n_heads
        model = self.model
        model.register_buffer("juice_factor", torch.ones(n, g.n_layers, self.juice_local_heads, 1, device=device,
                                                         dtype=dtype), persistent=False)
        slots = max(len(self.juice_slots), 1)
        model.register_buffer("juice_add", torch.zeros(n, slots, 1, device=device, dtype=dtype), persistent=False)
        model.register_buffer("juice_clean", torch.zeros(n, slots, head_dim, device=device, dtype=dtype),
                              persistent=False)
        rows = torch.arange(n, device=device)
        model.register_buffer("juice_source", rows.clone(), persistent=False)
        model.register_buffer("juice_partner", rows.clone(), persistent=False)
        model.register_buffer("juice_shadowed", torch.zeros((), dtype=torch.bool, device=device), persistent=False)
        self.juice_identity = rows   # what the two index tables hold outside a forward with shadow rows
        self.juice_dirty = 0   # rows of the tables that may hold a request's values
        self.juice_layer_slots: dict[int, list[tuple[int, int]]] = {}
        for slot, (layer, local) in enumerate(self.juice_slots):
            self.juice_layer_slots.setdefault(layer, []).append((slot, local))

    # --- the hook --------------------------------------------------------------------------------
    def _juice_hook(self, layer: int):
        slots = self.juice_layer_slots.get(layer, [])
        model = self.model
        compiled = self.juice_compiled

        def hook(module: nn.Module, args: tuple):
            # Run 1 (the clean pass) runs eagerly: its branch is never traced.
            state = self.juice_pass
            x = args[0]
            if state is not None and state.clean:
                if slots and layer in state.added:
                    h = x.view(x.shape[0], self.juice_local_heads, -1)
                    clean = state.clean_out
                    if state.tokens is None:   # every row: the real ones' outputs, 0 in padding rows
                        real = torch.arange(x.shape[0], device=x.device) < state.starts[-1].to(x.device)
                    for slot, local in slots:
                        if state.tokens is None:
                            clean[: x.shape[0], slot].copy_(torch.where(real[:, None], h[:, local], 0))
                        else:   # run 1 on the JuICE requests' tokens only: back to their rows
                            clean[:, slot].index_copy_(0, state.tokens, h[:, local])
                if layer == state.last_added:
                    raise _CleanRunDone
                return None
            if not compiled and (state is None or (layer not in state.scaled and layer not in state.added)):
                return None   # eager: a layer no request steers is left alone
            # Run 2, branch-free over the batch (the tables hold 1 and 0 where a row is not steered):
            # the compiled graph traces this once and reads the tables' current values every step.
            # Run 1's head output is the row's shadow row's (`juice_partner`, the same input) or
            # `juice_clean` (run 1 run separately), read through `where`s: a row JuICE does not
            # add to takes 0, never 0 times whatever an earlier step or a padding row left there
            # (0 * inf is NaN).
            rows = x.shape[0]
            h = x.view(rows, self.juice_local_heads, -1)
            out = h * model.juice_factor[:rows, layer]
            if slots:
                shadow = h.index_select(0, model.juice_partner[:rows])
            for slot, local in slots:
                beta = model.juice_add[:rows, slot: slot + 1]
                clean = torch.where(model.juice_shadowed, shadow[:, local: local + 1],
                                    model.juice_clean[:rows, slot: slot + 1])
                out[:, local: local + 1] += torch.where(beta != 0, beta * clean, 0)
            return (out.view(x.shape), *args[1:])

        return hook

    # --- per-forward tables ----------------------------------------------------------------------
    def _juice_plan(self, n_tokens: int) -> _Pass | None:
        """Fill the tables for this forward's tokens; the layers it steers, or None (nothing).

        No value is read back from the device: the coefficients are built on the host per request
        (from :data:`juice.vllm.processor.BATCH`, with one more row, not steering, for padding
        tokens), copied to the device without waiting, and spread over the tokens there, each
        token taking the row of the request whose `query_start_loc` range holds it
        (`searchsorted`). So a step whose batch needs no sub-batch for run 1 makes no host
        synchronisation on a GPU; :meth:`_juice_sub_batch` makes one."""
        if n_tokens > self.juice_max_tokens:
            raise RuntimeError(f"juice: a forward of {n_tokens} tokens, more than the tables' "
                               f"{self.juice_max_tokens} (max_num_batched_tokens)")
        if not BATCH.rows:
            self._juice_reset(n_tokens)
            return None
        metadata = get_forward_context().attn_metadata
        if isinstance(metadata, list):
            metadata = metadata[0] if metadata else None
        if not metadata:
            self._juice_reset(n_tokens)
            return None
        first = next(iter(metadata.values()))
        if not hasattr(first, ROW_FIELD):   # a backend whose metadata check_attention_backend could not read
            raise PluginConfigError(missing_rows_message(type(first).__name__))
        starts = first.query_start_loc   # [requests + 1], on the model's device
        n_requests = starts.shape[0] - 1
        g = self.juice_geometry
        scale = torch.zeros(n_requests + 1, g.n_layers, g.n_heads)   # the last row: tokens of no request
        add = torch.zeros_like(scale)
        for index, steering in BATCH.rows.items():
            if index < n_requests:
                scale[index] = steering.scale
                add[index] = steering.add
        scaled = set(torch.nonzero(scale.ne(0).any(-1).any(0)).flatten().tolist())
        added = set(torch.nonzero(add.ne(0).any(-1).any(0)).flatten().tolist())
        if not (scaled or added):
            self._juice_reset(n_tokens)
            return None
        model = self.model
        device, dtype = model.juice_factor.device, model.juice_factor.dtype
        tokens = torch.arange(n_tokens, device=starts.device, dtype=starts.dtype)
        owner = torch.searchsorted(starts[1:], tokens, right=True).to(device)   # n_requests: padding
        local = self.juice_head_slice
        model.juice_factor[:n_tokens].copy_(_to_device(1 + scale[:, :, local], device, dtype)[owner][..., None])
        if self.juice_slots:
            rows = torch.stack([add[:, layer, local.start + head] for layer, head in self.juice_slots], dim=1)
            model.juice_add[:n_tokens].copy_(_to_device(rows, device, dtype)[owner][..., None])
        self.juice_dirty = max(self.juice_dirty, n_tokens)
        juice_rows = torch.nonzero(add[:n_requests].ne(0).flatten(1).any(1)).flatten()
        return _Pass(scaled, added, juice_rows, starts)

    def _juice_reset(self, n_tokens: int) -> None:
        """Set the tables' first rows back to not steering: those a request may have written and,
        in compiled mode (whose hooks read the tables on every step), the `n_tokens` rows this
        forward reads, so that a step reads only rows it set."""
        rows = max(self.juice_dirty, n_tokens if self.juice_compiled else 0)
        if rows:
            self.model.juice_factor[:rows].fill_(1)
            self.model.juice_add[:rows].zero_()
        self.juice_dirty = 0

    def juice_device_dtype(self) -> tuple[torch.device, torch.dtype]:
        weight = self.juice_layers[0].self_attn.o_proj.weight
        return weight.device, weight.dtype

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **kwargs):
        if not self.juice_weights_checked:   # weights that did not come through load_weights (module docstring)
            self.juice_require_checked()
        n_tokens = input_ids.shape[0] if input_ids is not None else inputs_embeds.shape[0]
        state = self._juice_plan(n_tokens)
        if state is None:
            return super().forward(input_ids, positions, intermediate_tensors, inputs_embeds, **kwargs)
        self.juice_pass = state
        shadowed = self._juice_shadow_rows(state, n_tokens) if self.juice_shadows and state.added else None
        if shadowed is None:
            try:   # JuICE's run 1 runs inside, at the first dual-run layer's input (CLEAN_RUN_OP)
                return super().forward(input_ids, positions, intermediate_tensors, inputs_embeds, **kwargs)
            finally:
                self.juice_pass = None
        shadows, metadata, slots = shadowed
        tokens = shadows.tokens
        context = get_forward_context()
        saved = context.attn_metadata, context.slot_mapping
        try:   # run 1 in shadow rows past the batch's rows (module docstring)
            context.attn_metadata, context.slot_mapping = metadata, slots
            state.shadows = shadows
            if input_ids is not None:
                input_ids = torch.cat([input_ids, input_ids[tokens.to(input_ids.device)]])
            if inputs_embeds is not None:
                inputs_embeds = torch.cat([inputs_embeds, inputs_embeds[tokens.to(inputs_embeds.device)]])
            positions = torch.cat([positions, positions[..., tokens.to(positions.device)]], dim=-1)
            out = super().forward(input_ids, positions, intermediate_tensors, inputs_embeds, **kwargs)
            return tuple(o[:n_tokens] for o in out) if isinstance(out, tuple) else out[:n_tokens]
        finally:
            context.attn_metadata, context.slot_mapping = saved
            self.juice_pass = None
            self._juice_unshadow(shadows)

    # --- run 1 as shadow rows ---------------------------------------------------------------------
    def _juice_shadow_rows(self, state: _Pass, n_tokens: int) -> tuple[_Shadows, dict, dict] | None:
        """Shadow rows for this forward's JuICE token rows, appended after its `n_tokens` rows: the
        tables' rows for them (not steered; `juice_source`, `juice_partner`), and the forward
        context's attention metadata and slot mappings with them: the live attention modules'
        slots gain -1 for the shadow rows (whose rows the metadata does not count, so the live
        attention neither reads nor writes KV for them), the clean modules (`attn_clean`) get the
        JuICE requests' own metadata and slots (:meth:`_juice_sub_batch`, or the batch's where
        every request is JuICE). None (run 1 runs separately, :meth:`_clean_run`) where the
        extended forward would pass `max_num_batched_tokens` or the metadata cannot be read."""
        context = get_forward_context()
        metadata, slots = context.attn_metadata, context.slot_mapping
        if not isinstance(metadata, dict) or not isinstance(slots, dict):
            return None
        if state.juice_rows.numel() == state.starts.numel() - 1:   # every request is JuICE
            real = int(state.starts[-1])
            if n_tokens + real > self.juice_shadow_limit:
                return None
            tokens = torch.arange(real, device=state.starts.device)
            clean_metadata = metadata
            clean_slots = {name: None if slots[name] is None else slots[name][:real]
                           for name in self.juice_clean_names if name in slots}
        else:
            counts = state.starts.diff()[state.juice_rows]
            if n_tokens + int(counts.sum()) > self.juice_shadow_limit:
                return None
            sub = self._juice_sub_batch(state)
            if sub is None:
                return None
            tokens, clean_metadata, clean_slots = sub
        count = int(tokens.numel())
        model = self.model
        device = model.juice_source.device
        tokens = tokens.to(device)
        end = n_tokens + count
        model.juice_factor[n_tokens:end].fill_(1)
        model.juice_add[n_tokens:end].zero_()
        self.juice_dirty = max(self.juice_dirty, end)
        model.juice_source[n_tokens:end].copy_(tokens)
        model.juice_partner.index_copy_(0, tokens, self.juice_identity[n_tokens:end])
        model.juice_shadowed.fill_(True)
        clean = self.juice_clean_names
        new_metadata, new_slots = dict(metadata), {}
        for name, m in slots.items():
            if name in clean:
                new_slots[name] = clean_slots[name]
            elif m is None:
                new_slots[name] = None
            else:
                new_slots[name] = torch.cat([m, m.new_full((end - m.shape[0],), -1)])
        for name in clean:
            new_metadata[name] = clean_metadata[name]
        return _Shadows(n_tokens, tokens), new_metadata, new_slots

    def _juice_unshadow(self, shadows: _Shadows) -> None:
        """Set `juice_source`, `juice_partner` and `juice_shadowed` back to no shadow rows."""
        model, end = self.model, shadows.start + shadows.count
        model.juice_source[shadows.start:end].copy_(self.juice_identity[shadows.start:end])
        model.juice_partner.index_copy_(0, shadows.tokens, shadows.tokens)
        model.juice_shadowed.fill_(False)

    def _juice_run1_hook(self, key: str):
        """The first dual-run layer's forward pre-hook: calls :data:`CLEAN_RUN_OP` with the
        layer's input, so a compiled forward has run 1's call at that point (traced once, with no
        branch on the batch: the op decides at run time whether the batch has JuICE rows); then
        gives each shadow row its JuICE row's input (`juice_source`: run 1 and run 2 agree below
        this layer, and the shadow rows' own pass below it read no KV). In compiled mode the
        gather runs on every forward (the identity where there are no shadow rows)."""
        model = self.model
        compiled = self.juice_compiled

        def hook(module: nn.Module, args: tuple):
            positions, hidden = args[0], args[1]
            residual = args[2] if len(args) > 2 else None
            torch.ops.juice.clean_run(hidden, residual, positions, model.juice_clean, key)
            state = self.juice_pass
            if not compiled and (state is None or state.shadows is None):
                return None
            source = model.juice_source[: hidden.shape[0]]
            hidden = hidden.index_select(0, source)
            if residual is not None:
                residual = residual.index_select(0, source)
            return (positions, hidden, *((residual,) if len(args) > 2 else ()), *args[3:])

        return hook

    def _juice_shadow_hook(self, name: str):
        """A dual-run layer's attention forward hook: :data:`SHADOW_ATTENTION_OP` writes the
        shadow rows' attention (over their clean KV) into the attention's output, in eager and
        compiled mode alike (a no-op in a forward without shadow rows)."""

        def hook(module: nn.Module, args: tuple, output: Tensor):
            if len(args) < 3:
                raise RuntimeError(f"juice: {name} was called without query, key and value as arguments")
            torch.ops.juice.shadow_attention(args[0], args[1], args[2], output, name)
            return output

        return hook

    def juice_shadow_attention(self, query: Tensor, key: Tensor, value: Tensor, out: Tensor, index: int) -> None:
        """:data:`SHADOW_ATTENTION_OP`'s body for layer `index`: the clean attention module
        (`attn_clean`, the forward context holding the JuICE requests' own metadata under its name,
        :meth:`forward`) on the shadow rows of `query`, `key`, `value` `[rows, heads * head_dim]`,
        written into the same rows of `out`; run 1's KV for the JuICE requests goes to the clean
        KV cache. Nothing without shadow rows, or past the last layer the batch adds to."""
        state = self.juice_pass
        shadows = None if state is None else state.shadows
        if shadows is None or index > state.last_added:
            return
        a, b = shadows.start, shadows.start + shadows.count
        attention = self.juice_layers[index].self_attn.attn_clean
        out[a:b].copy_(attention(query[a:b], key[a:b], value[a:b]).view(b - a, -1))

    def juice_run1(self, hidden: Tensor, residual: Tensor | None, positions: Tensor, clean: Tensor) -> None:
        """:data:`CLEAN_RUN_OP`'s body: run 1 from the first dual-run layer's input of run 2
        (the same for a JuICE row, which run 2 does not steer below it), writing the head
        outputs JuICE adds into `clean` (the op's argument, `juice_clean` or the compiler's copy
        of it); nothing when the forward has no JuICE row."""
        state = self.juice_pass
        if state is None or not state.added or state.clean or state.shadows is not None:
            return   # state.clean: run 1's own pass through the layer; shadows: run 1 is in the forward
        self._clean_run(positions, state, hidden, residual, clean)

    def _clean_run(self, positions: Tensor, state: _Pass, hidden: Tensor, residual: Tensor | None,
                   clean: Tensor) -> None:
        """Run 1 on the JuICE requests' tokens only (:meth:`_juice_sub_batch`; all tokens where the
        attention backend's metadata cannot be sliced), from the first dual-run layer's input
        `hidden`/`residual` `[tokens, hidden_size]` (run 2's, the same for a JuICE row): the clean
        attention modules up to the last layer this batch adds to, saving the head outputs JuICE
        adds into `clean`. The layer loop is vLLM's own (`layer(positions, hidden, residual)`),
        run eagerly; the inputs are not modified."""
        first, last = self.juice_dual
        if not state.added <= set(range(first, last + 1)):
            raise RuntimeError("juice: JuICE coefficients outside the dual-run layers")   # admission prevents it
        sub = self._juice_sub_batch(state)
        context = get_forward_context()
        saved = context.attn_metadata, context.slot_mapping
        if sub is not None:
            tokens, context.attn_metadata, context.slot_mapping = sub
            state.tokens = tokens.to(clean.device)
            positions = positions[..., tokens.to(positions.device)]
            hidden, residual = hidden[tokens], None if residual is None else residual[tokens]
        else:
            hidden, residual = hidden.clone(), None if residual is None else residual.clone()
        swapped: list[nn.Module] = []
        try:
            for layer in self.juice_layers[first: state.last_added + 1]:
                attention = layer.self_attn
                attention._modules["attn"], attention._modules["attn_clean"] = attention.attn_clean, attention.attn
                swapped.append(attention)
            state.clean, state.clean_out = True, clean
            for layer in self.juice_layers[first:]:
                hidden, residual = layer(positions, hidden, residual)
        except _CleanRunDone:
            pass
        finally:
            state.clean, state.clean_out = False, None
            state.tokens = None
            context.attn_metadata, context.slot_mapping = saved
            for attention in swapped:
                attention._modules["attn"], attention._modules["attn_clean"] = attention.attn_clean, attention.attn

    # --- run 1 on the JuICE requests' tokens ----------------------------------------------------
    def _juice_sub_batch(self, state: _Pass) -> tuple[Tensor, dict, dict] | None:
        """The token rows of the batch's JuICE requests (on the model's device), and the forward
        context's attention metadata and slot mappings for them alone (each KV cache group's
        metadata rebuilt by its backend's own builder from the sliced common metadata), so that
        run 1 costs in proportion to the JuICE share of a mixed batch. None (run 1 on every row, as
        correct and slower) when every request is JuICE, or the backend's metadata lacks a field
        this reads. The sub-batch's size depends on `query_start_loc`, so this reads it to the host:
        one host synchronisation on a GPU, for steps that mix JuICE with other requests only."""
        rows = state.juice_rows
        if rows.numel() == state.starts.numel() - 1:
            return None
        context = get_forward_context()
        metadata, slots = context.attn_metadata, context.slot_mapping
        if not isinstance(metadata, dict) or not isinstance(slots, dict):
            return None
        starts = state.starts.to("cpu")
        host = torch.cat([torch.arange(int(starts[i]), int(starts[i + 1])) for i in rows.tolist()])
        tokens = _to_device(host, state.starts.device)
        built: dict[int, object] = {}
        sub_metadata = {}
        for name, meta in metadata.items():
            if id(meta) not in built:
                group = [n for n, m in metadata.items() if m is meta]
                built[id(meta)] = self._juice_slice_metadata(group, meta, rows, starts, tokens)
                if built[id(meta)] is None:
                    return None
            sub_metadata[name] = built[id(meta)]
        sub_slots = {name: None if m is None else m[tokens.to(m.device)] for name, m in slots.items()}
        return tokens, sub_metadata, sub_slots

    def _juice_slice_metadata(self, group: list[str], meta, rows: Tensor, starts: Tensor, tokens: Tensor):
        """One KV cache group's attention metadata for the JuICE requests `rows` (host batch
        indices) alone, `starts` being the batch's `query_start_loc` on the host and `tokens`
        their token rows on the device. The longest sequence is the batch's (`max_seq_len`, an
        upper bound the backends take as one) where the metadata has it, so nothing more is read
        from the device."""
        from vllm.v1.attention.backend import CommonAttentionMetadata

        table = getattr(meta, "block_table", None)
        if table is None:
            table = getattr(meta, "block_table_tensor", None)
        if table is None or any(getattr(meta, f, None) is None for f in ("query_start_loc", "seq_lens",
                                                                          "slot_mapping")):
            return None
        key = tuple(group)
        builder = self.juice_builders.get(key)
        if builder is None:
            layer = get_forward_context().no_compile_layers[group[0]]
            spec = layer.get_kv_cache_spec(self.juice_vllm_config)
            builder = layer.attn_backend.get_builder_cls()(spec, group, self.juice_vllm_config,
                                                           meta.query_start_loc.device)
            self.juice_builders[key] = builder
        device = meta.query_start_loc.device
        counts = starts.diff()[rows]
        starts_host = torch.zeros(rows.numel() + 1, dtype=meta.query_start_loc.dtype)
        starts_host[1:] = counts.cumsum(0)
        index = _to_device(rows, device)
        seq_lens = meta.seq_lens[index.to(meta.seq_lens.device)]
        longest = getattr(meta, "max_seq_len", None)
        causal = getattr(meta, "causal", True)
        common = CommonAttentionMetadata(
            query_start_loc=_to_device(starts_host, device), query_start_loc_cpu=starts_host, seq_lens=seq_lens,
            num_reqs=int(rows.numel()), num_actual_tokens=int(starts_host[-1]), max_query_len=int(counts.max()),
            max_seq_len=int(seq_lens.max()) if longest is None else int(longest),
            block_table_tensor=table[index.to(table.device)],
            slot_mapping=meta.slot_mapping[tokens.to(meta.slot_mapping.device)],
            causal=causal if isinstance(causal, bool) else True)
        return builder.build(0, common)

    # --- the heads files' fingerprints ----------------------------------------------------------
    def load_weights(self, weights: Iterable[tuple[str, Tensor]]) -> set[str]:
        loaded = super().load_weights(weights)
        self.juice_check_weights()
        return loaded

    def process_weights_after_loading(self) -> None:
        """vLLM's model-level post-load hook (`process_weights_after_loading` in
        `vllm.model_executor.model_loader.utils`, called after the layers' own post-processing by
        vLLM's base loader and so by `dummy`, `sharded_state`, `runai_streamer_sharded` and
        `ipc_cache`): refuses weights that did not come through `load_weights`
        (:meth:`juice_require_checked`)."""
        parent = getattr(super(), "process_weights_after_loading", None)
        if parent is not None:
            parent()
        self.juice_require_checked()

    def juice_check_weights(self) -> None:
        """Check every heads file's model fingerprint against the weights `load_weights` just
        wrote (:func:`juice.models.fingerprint_mismatch`), before the layers' post-processing
        (which on the CPU repacks the output projection's weight).

        Raises:
            PluginConfigError: one line naming the heads file and what differs.
        """
        if self.juice_plugin.fingerprints:
            mine = self.juice_fingerprint()
            for direction, theirs in self.juice_plugin.fingerprints.items():
                mismatch = fingerprint_mismatch(theirs, mine, "the served model has")
                if mismatch is not None:
                    raise PluginConfigError(f"{self.juice_plugin.files[direction]} {mismatch}")
        self.juice_weights_checked = True

    def juice_require_checked(self) -> None:
        """Refuse a model with heads files whose weights never went through `load_weights`, so
        that their fingerprint was never checked (:meth:`juice_check_weights`): vLLM's `dummy`,
        `sharded_state`, `runai_streamer_sharded` and `ipc_cache` loaders write the weights
        themselves, and a heads file for another model (or random weights) would be served without
        a word. Called from vLLM's post-load hook and, where a loader skips it (`tensorizer` on a
        vLLM-tensorized model), at the first forward (on a GPU vLLM's profiling run).

        Raises:
            PluginConfigError: one line naming the load format.
        """
        if self.juice_weights_checked:
            return
        fmt = getattr(getattr(self.juice_vllm_config, "load_config", None), "load_format", "?")
        raise PluginConfigError(f"juice's vLLM plugin checks each heads file against the weights as load_weights "
                                f"reads them, and --load-format {fmt} writes them without it (the heads could be "
                                "another model's): load with a format that reads the checkpoint (auto, "
                                "safetensors, gguf)")

    def juice_fingerprint(self) -> dict:
        """:func:`juice.models.model_fingerprint` of the served model (the output projection's
        first 8 rows gathered over tensor-parallel ranks)."""
        weight = self.juice_layers[0].self_attn.o_proj.weight.detach()[:8]
        if get_tensor_model_parallel_world_size() > 1:
            weight = tensor_model_parallel_all_gather(weight.contiguous(), dim=-1)
        g = self.juice_geometry
        config = self.config.get_text_config() if hasattr(self.config, "get_text_config") else self.config
        return {"model_type": self.config.model_type, "n_layers": g.n_layers, "n_heads": g.n_heads,
                "head_dim": g.head_dim, "vocab_size": int(config.vocab_size), **weights_digests(weight)}


def _steerable(base: type) -> type:
    return type(f"Juice{base.__name__}", (SteerableMixin, base), {"__module__": __name__,
                                                                   "__doc__": f"{base.__name__} with juice's steering."})


def _load(module: str, name: str) -> type:
    import importlib

    return getattr(importlib.import_module(f"vllm.model_executor.models.{module}"), name)


for _class, _module in vllm_architectures().items():   # the architecture table's (juice.architectures)
    globals()[f"Juice{_class}"] = _steerable(_load(_module, _class))

__all__ = ["SteerableMixin", *sorted(f"Juice{c}" for c in vllm_architectures())]
