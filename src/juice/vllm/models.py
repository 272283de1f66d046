"""vLLM model classes that steer attention heads per request: JuNE, JuICE's dual run, pruning.

Each class is vLLM's own (Gemma 3, Gemma 2, Llama, Qwen 2, Qwen 3, Mistral, Phi-3) with :class:`SteerableMixin` in
front; the plugin (:func:`juice.vllm.register`) puts them in vLLM's model registry under the
architectures' names. What the mixin adds:

- a forward pre-hook on every layer's attention output projection (`self_attn.o_proj`): per token
  row, its input `[tokens, n_local_heads * head_dim]` becomes `H * (1 + scale) + add * H_clean`
  (:mod:`juice.vllm.options`), the coefficients of the request the row belongs to (the rows of
  request i are `query_start_loc[i]:query_start_loc[i+1]` of the forward's attention metadata,
  batch index i as :mod:`juice.vllm.processor` tracks it). A layer no request steers is left
  alone; a batch of Original requests runs vLLM's forward unchanged.
- JuICE's dual run (paper Alg. 1) inside the same forward: a second attention module
  (`self_attn.attn_clean`, built from the same arguments as `self_attn.attn`, so vLLM gives it its
  own KV cache) on each layer from the first to the last layer the heads files steer. When a
  batch holds a JuICE request, the layers below the first dual-run layer run once (there a
  JuICE row is not steered, so its two runs are one computation and share the main KV cache),
  then the forward forks: run 1 goes on through the clean attention modules (the unmodified
  model; its residual stream and KV cache are the clean run's), saving the head outputs of the
  layers JuICE steers and stopping after the last of them; run 2 is the steered model, which
  adds beta times run 1's outputs. A batch without JuICE requests runs once, and the clean KV of
  its requests is never read.

Constraints, checked when the model is built (one-line errors, :mod:`juice.vllm.constraints`):
eager mode (`enforce_eager`: the hooks read per-batch Python state, which CUDA graphs and
torch.compile would freeze), prefix caching off (a cached block's KV belongs to one steering, and
the clean KV of a block is written only when a JuICE request computes it), no dual-batch overlap
or micro-batching (a micro-batch's `query_start_loc` counts its requests from 0), an attention
backend whose metadata has `query_start_loc` (not FlashInfer's), no pipeline parallelism. Tensor
parallelism works: each rank steers its own heads' slice of the row-parallel output projection.
After the weights load, each heads file's model fingerprint (model type, geometry, vocabulary,
a checksum of layer 0's output projection: :func:`juice.models.model_fingerprint`) is checked
against the served model. The geometry the API server checks pruned heads against at admission
(:attr:`juice.vllm.options.ServerHeads.geometry`) must be there and, where `JUICE_VLLM_GEOMETRY`
gave it, equal the model's; else the model refuses to build, naming the value to set.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable

import torch
from torch import Tensor, nn
from vllm.distributed import (get_pp_group, get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size,
                              tensor_model_parallel_all_gather)
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.attention import Attention

from juice.architectures import config_geometry
from juice.models import fingerprint_mismatch, weights_digest
from juice.vllm import ARCHITECTURES
from juice.vllm.constraints import (ROW_FIELD, PluginConfigError, check_attention_backend, check_engine_config,
                                    missing_rows_message)
from juice.vllm.options import ENV_GEOMETRY, ServerHeads, server_heads
from juice.vllm.processor import BATCH



class _CleanRunDone(Exception):
    """Raised by the last dual-run layer's hook: run 1 has what run 2 needs."""


class _Pass:
    """The tables of one forward: `scale`, `add` `[tokens, n_layers, n_local_heads, 1]`, the layers
    each one touches on any head (the same on every tensor-parallel rank), and run 1's saved head
    outputs."""

    def __init__(self, scale: Tensor, add: Tensor, scaled: set[int], added: set[int]) -> None:
        self.scale, self.add = scale, add
        self.scaled, self.added = scaled, added
        self.clean = False
        self.saved: dict[int, Tensor] = {}
        self.last_added = max(self.added) if self.added else -1


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
        self.juice_server: ServerHeads = server_heads()
        check_engine_config(vllm_config)
        for layer in self.model.layers:
            check_attention_backend(layer.self_attn.attn.attn_backend)
        if get_pp_group().world_size > 1:
            raise PluginConfigError("juice's vLLM plugin does not support pipeline parallelism; "
                                    "use tensor parallelism")
        self.juice_geometry = config_geometry(vllm_config.model_config.hf_config)
        g, told = self.juice_geometry, self.juice_server.geometry
        if told is None:   # admission could not check pruned heads against the model
            raise PluginConfigError(f"juice's vLLM plugin without heads files needs {ENV_GEOMETRY}={g.n_layers}x"
                                    f"{g.n_heads} (this model's layers x heads) in every vLLM process's environment, "
                                    "so that a request pruning a head outside the model is refused at admission")
        if self.juice_server.geometry_from == ENV_GEOMETRY and (told.n_layers, told.n_heads) != (g.n_layers,
                                                                                                  g.n_heads):
            raise PluginConfigError(f"{ENV_GEOMETRY}={told.n_layers}x{told.n_heads}, but the served model has "
                                    f"{g.n_layers} layers x {g.n_heads} heads")   # a heads file: load_weights
        tp = get_tensor_model_parallel_world_size()
        self.juice_local_heads = self.juice_geometry.n_heads // tp
        first = get_tensor_model_parallel_rank() * self.juice_local_heads
        self.juice_head_slice = slice(first, first + self.juice_local_heads)
        self.juice_layers = list(self.model.layers)
        self.juice_pass: _Pass | None = None
        for index, layer in enumerate(self.juice_layers):
            layer.self_attn.o_proj.register_forward_pre_hook(self._juice_hook(index))
        self.juice_dual = self.juice_server.dual_run_layers()
        if self.juice_dual is not None:
            lo, hi = self.juice_dual
            for index in range(lo, hi + 1):
                attention = self.juice_layers[index].self_attn
                arguments = dict(records[attention.attn.layer_name])
                arguments["prefix"] = attention.attn.layer_name + "_clean"
                attention.attn_clean = type(attention.attn)(**arguments)

    # --- the hook --------------------------------------------------------------------------------
    def _juice_hook(self, layer: int):
        def hook(module: nn.Module, args: tuple):
            state = self.juice_pass
            if state is None:
                return None
            x = args[0]
            if state.clean:
                if layer in state.added:
                    state.saved[layer] = x.view(x.shape[0], self.juice_local_heads, -1).clone()
                if layer == state.last_added:
                    raise _CleanRunDone
                return None
            if layer not in state.scaled and layer not in state.added:
                return None
            h = x.view(x.shape[0], self.juice_local_heads, -1)
            rows = x.shape[0]
            out = h * (1 + state.scale[:rows, layer]) if layer in state.scaled else h.clone()
            if layer in state.added:
                out = out + state.add[:rows, layer] * state.saved[layer]
            return (out.view(x.shape), *args[1:])

        return hook

    # --- per-forward tables ----------------------------------------------------------------------
    def _juice_plan(self, n_tokens: int) -> _Pass | None:
        if not BATCH.rows:
            return None
        metadata = get_forward_context().attn_metadata
        if isinstance(metadata, list):
            metadata = metadata[0] if metadata else None
        if not metadata:
            return None
        first = next(iter(metadata.values()))
        if not hasattr(first, ROW_FIELD):   # a backend whose metadata check_attention_backend could not read
            raise PluginConfigError(missing_rows_message(type(first).__name__))
        starts = first.query_start_loc.to("cpu")
        counts = starts.diff()
        n_requests = counts.shape[0]
        g = self.juice_geometry
        scale = torch.zeros(n_requests, g.n_layers, g.n_heads)
        add = torch.zeros_like(scale)
        for index, steering in BATCH.rows.items():
            if index < n_requests:
                scale[index] = steering.scale
                add[index] = steering.add
        # Which layers run which step is decided on every head, so that under tensor parallelism
        # all ranks run the same passes (and collectives) even where a rank steers none of its heads.
        scaled = set(torch.nonzero(scale.ne(0).any(-1).any(0)).flatten().tolist())
        added = set(torch.nonzero(add.ne(0).any(-1).any(0)).flatten().tolist())
        if not (scaled or added):
            return None
        actual = int(starts[-1])
        pad = max(n_tokens - actual, 0)
        device, dtype = self.juice_device_dtype()
        local = self.juice_head_slice

        def per_token(table: Tensor) -> Tensor:
            rows = table[:, :, local].repeat_interleave(counts, dim=0)
            if pad:
                rows = torch.cat([rows, rows.new_zeros(pad, *rows.shape[1:])])
            return rows[:n_tokens, :, :, None].to(device=device, dtype=dtype)

        return _Pass(per_token(scale), per_token(add), scaled, added)

    def juice_device_dtype(self) -> tuple[torch.device, torch.dtype]:
        weight = self.juice_layers[0].self_attn.o_proj.weight
        return weight.device, weight.dtype

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **kwargs):
        n_tokens = input_ids.shape[0] if input_ids is not None else inputs_embeds.shape[0]
        state = self._juice_plan(n_tokens)
        if state is None:
            return super().forward(input_ids, positions, intermediate_tensors, inputs_embeds, **kwargs)
        self.juice_pass = state
        try:
            if not state.added:   # JuNE and pruning: one run
                return super().forward(input_ids, positions, intermediate_tensors, inputs_embeds, **kwargs)
            return self._dual_run(input_ids, positions, inputs_embeds, state)
        finally:
            self.juice_pass = None

    def _dual_run(self, input_ids, positions, inputs_embeds, state: _Pass) -> Tensor:
        """Layers below the first dual-run layer once (a JuICE row is not steered there, so its
        clean and steered streams are one), then run 1 through the clean attention modules up to
        the last layer this batch adds to, then run 2 to the top. The layer loop is vLLM's own
        (`embed_input_ids`, `layer(positions, hidden, residual)`, the final fused norm)."""
        first, last = self.juice_dual
        if not state.added <= set(range(first, last + 1)):
            raise RuntimeError("juice: JuICE coefficients outside the dual-run layers")   # admission prevents it
        model = self.model
        hidden = inputs_embeds if inputs_embeds is not None else model.embed_input_ids(input_ids)
        residual = None
        for layer in self.juice_layers[:first]:
            hidden, residual = layer(positions, hidden, residual)
        swapped = [layer.self_attn for layer in self.juice_layers[first: state.last_added + 1]]
        for attention in swapped:
            attention._modules["attn"], attention._modules["attn_clean"] = attention.attn_clean, attention.attn
        state.clean = True
        try:
            clean, clean_residual = hidden.clone(), None if residual is None else residual.clone()
            for layer in self.juice_layers[first:]:
                clean, clean_residual = layer(positions, clean, clean_residual)
        except _CleanRunDone:
            pass
        finally:
            state.clean = False
            for attention in swapped:
                attention._modules["attn"], attention._modules["attn_clean"] = attention.attn_clean, attention.attn
        for layer in self.juice_layers[first:]:
            hidden, residual = layer(positions, hidden, residual)
        hidden, _ = model.norm(hidden, residual)
        return hidden

    # --- the heads files' fingerprints ----------------------------------------------------------
    def load_weights(self, weights: Iterable[tuple[str, Tensor]]) -> set[str]:
        loaded = super().load_weights(weights)
        if self.juice_server.fingerprints:
            mine = self.juice_fingerprint()
            for direction, theirs in self.juice_server.fingerprints.items():
                mismatch = fingerprint_mismatch(theirs, mine, "the served model has")
                if mismatch is not None:
                    raise PluginConfigError(f"{self.juice_server.files[direction]} {mismatch}")
        return loaded

    def juice_fingerprint(self) -> dict:
        """:func:`juice.models.model_fingerprint` of the served model (the output projection's
        first 8 rows gathered over tensor-parallel ranks)."""
        weight = self.juice_layers[0].self_attn.o_proj.weight.detach()[:8]
        if get_tensor_model_parallel_world_size() > 1:
            weight = tensor_model_parallel_all_gather(weight.contiguous(), dim=-1)
        digest = weights_digest(weight)
        g = self.juice_geometry
        config = self.config.get_text_config() if hasattr(self.config, "get_text_config") else self.config
        return {"model_type": self.config.model_type, "n_layers": g.n_layers, "n_heads": g.n_heads,
                "head_dim": g.head_dim, "vocab_size": int(config.vocab_size), "weights_sha256_16": digest}


def _steerable(base: type) -> type:
    return type(f"Juice{base.__name__}", (SteerableMixin, base), {"__module__": __name__,
                                                                   "__doc__": f"{base.__name__} with juice's steering."})


def _load(module: str, name: str) -> type:
    import importlib

    return getattr(importlib.import_module(f"vllm.model_executor.models.{module}"), name)


JuiceGemma3ForCausalLM = _steerable(_load("gemma3", "Gemma3ForCausalLM"))
JuiceGemma2ForCausalLM = _steerable(_load("gemma2", "Gemma2ForCausalLM"))
JuiceLlamaForCausalLM = _steerable(_load("llama", "LlamaForCausalLM"))
JuiceQwen2ForCausalLM = _steerable(_load("qwen2", "Qwen2ForCausalLM"))
JuiceQwen3ForCausalLM = _steerable(_load("qwen3", "Qwen3ForCausalLM"))
JuiceMistralForCausalLM = _steerable(_load("mistral", "MistralForCausalLM"))
JuicePhi3ForCausalLM = _steerable(_load("phi3", "Phi3ForCausalLM"))

__all__ = ["ARCHITECTURES", "JuiceGemma2ForCausalLM", "JuiceGemma3ForCausalLM", "JuiceLlamaForCausalLM",
           "JuiceMistralForCausalLM", "JuicePhi3ForCausalLM", "JuiceQwen2ForCausalLM", "JuiceQwen3ForCausalLM",
           "PluginConfigError", "SteerableMixin"]
