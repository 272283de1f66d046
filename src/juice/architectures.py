"""One small mapping per architecture: where the heads are.

A head's output is its slice of the input to its layer's attention output projection
(`o_proj`, `dense`, `c_proj`, ...): `x[..., h * head_dim:(h + 1) * head_dim]` (paper Sec. 3,
Eq. 1). An :class:`ArchitectureAdapter` says where the decoder layers are, which module inside a
layer is that projection, and how its weight is laid out. Everything else (the number of query
heads, `head_dim`) is read from the model's config.

Adding an architecture is one call:

```python
from juice.architectures import ArchitectureAdapter, register_architecture
register_architecture(ArchitectureAdapter(
    model_types=("my_model",), layers="model.decoder.blocks", output_projection="attn.out",
))
```
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from torch import nn


class UnsupportedArchitectureError(ValueError):
    """The model's `config.model_type` has no registered adapter."""


@dataclass(frozen=True)
class ArchitectureAdapter:
    """Where the attention heads of one architecture live.

    Attributes:
        model_types: the `config.model_type` values this adapter serves.
        layers: dotted path from the top-level model to the list of decoder layers.
            For a base model (no LM head) the first component is dropped automatically.
        output_projection: dotted path from one decoder layer to the attention output
            projection whose input holds the concatenated head outputs.
        weight_layout: "linear" (`nn.Linear`, weight `[out, in]`: a head owns columns) or
            "conv1d" (GPT-2's `Conv1D`, weight `[in, out]`: a head owns rows).
        attn_implementation: attention implementation to request at load time, or None for the
            library's default. Gemma 2 soft-caps attention logits, which `sdpa` drops: "eager".
        vllm: the model types juice's vLLM plugin steers, each as (model type, vLLM's model
            module under `vllm.model_executor.models`, vLLM's architecture class): the plugin's
            steered class is `juice.vllm.models.Juice<class>`, registered under the class's name
            (:func:`vllm_architectures`, :mod:`juice.vllm`).
    """

    model_types: tuple[str, ...]
    layers: str = "model.layers"
    output_projection: str = "self_attn.o_proj"
    weight_layout: Literal["linear", "conv1d"] = "linear"
    attn_implementation: str | None = None
    vllm: tuple[tuple[str, str, str], ...] = ()

    def __post_init__(self) -> None:
        stray = [t for t, _, _ in self.vllm if t not in self.model_types]
        if stray:
            raise ValueError(f"vllm names model type {stray[0]!r}, which this adapter does not serve")


_REGISTRY: dict[str, ArchitectureAdapter] = {}


def register_architecture(adapter: ArchitectureAdapter, *, overwrite: bool = False) -> None:
    """Register `adapter` for each of its `model_types`.

    Raises:
        ValueError: a model type is already registered and `overwrite` is False.
    """
    for model_type in adapter.model_types:
        if model_type in _REGISTRY and not overwrite:
            raise ValueError(f"model type {model_type!r} already has an adapter; pass overwrite=True")
        _REGISTRY[model_type] = adapter


for _adapter in (
    ArchitectureAdapter(("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma3_text", "olmo", "olmo2",
                         "stablelm", "phi3", "mixtral", "granite"),
                        vllm=(("gemma3_text", "gemma3", "Gemma3ForCausalLM"), ("llama", "llama", "LlamaForCausalLM"),
                              ("qwen2", "qwen2", "Qwen2ForCausalLM"), ("qwen3", "qwen3", "Qwen3ForCausalLM"),
                              ("mistral", "mistral", "MistralForCausalLM"), ("phi3", "phi3", "Phi3ForCausalLM"))),
    ArchitectureAdapter(("gemma2",), attn_implementation="eager", vllm=(("gemma2", "gemma2", "Gemma2ForCausalLM"),)),
    ArchitectureAdapter(("phi",), output_projection="self_attn.dense"),
    ArchitectureAdapter(("gpt2",), layers="transformer.h", output_projection="attn.c_proj",
                        weight_layout="conv1d"),
    ArchitectureAdapter(("gpt_neox",), layers="gpt_neox.layers", output_projection="attention.dense"),
):
    register_architecture(_adapter)


def vllm_architectures() -> dict[str, str]:
    """vLLM's architecture class name -> its model module (under `vllm.model_executor.models`),
    for every architecture juice's vLLM plugin steers (the adapters' `vllm`), read from the
    registry when called. OLMo 2 is not among them: vLLM 0.32 serves it through its Transformers
    backend, whose layers the plugin does not drive (the plugin refuses to start on it,
    :class:`juice.vllm.processor.JuiceSteeringProcessor`)."""
    return {cls: module for adapter in dict.fromkeys(_REGISTRY.values()) for model_type, module, cls in adapter.vllm
            if _REGISTRY.get(model_type) is adapter}   # not a model type another adapter has since taken over


def supported_model_types() -> list[str]:
    """The `model_type` values that have an adapter, sorted."""
    return sorted(_REGISTRY)


def adapter_for(model_type: str) -> ArchitectureAdapter:
    """Return the adapter registered for `model_type`.

    Raises:
        UnsupportedArchitectureError: no adapter; the message lists the supported types and how
            to register one.
    """
    try:
        return _REGISTRY[model_type]
    except KeyError:
        raise UnsupportedArchitectureError(
            f"juice has no architecture adapter for model_type {model_type!r}. Supported: "
            f"{', '.join(supported_model_types())}. Register one with "
            "juice.architectures.register_architecture(ArchitectureAdapter(...)) (see README)."
        ) from None


def _resolve(root: nn.Module, path: str) -> nn.Module:
    module = root
    for name in path.split("."):
        module = getattr(module, name)
    return module


@dataclass(frozen=True)
class HeadGeometry:
    """Head layout of a model: `n_layers` decoder layers of `n_heads` query heads each."""

    n_layers: int
    n_heads: int
    head_dim: int


def config_geometry(config) -> HeadGeometry:
    """The head geometry a Hugging Face config declares (a multimodal config: its text part), read
    without building the model; `head_dim` is `hidden_size // n_heads` where the config has none.
    :class:`ModelHeads` checks it against the built model's output projection."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    n_heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // n_heads
    return HeadGeometry(text.num_hidden_layers, n_heads, head_dim)


class ModelHeads:
    """A model bound to its adapter: the layers, output projections and head geometry.

    Grouped-query attention: heads are query heads (`num_attention_heads`), never KV heads.

    Raises:
        UnsupportedArchitectureError: the model type has no adapter.
        ValueError: the output projection's input width is not `n_heads * head_dim`.
    """

    def __init__(self, model: nn.Module):
        config = model.config.get_text_config()
        self.model = model
        self.adapter = adapter_for(model.config.model_type)
        self.layers: list[nn.Module] = list(self._layer_list(model))
        self.projections: list[nn.Module] = [_resolve(layer, self.adapter.output_projection) for layer in self.layers]
        n_heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_head")
        in_features = self.projection_in_features(self.projections[0])
        head_dim = getattr(config, "head_dim", None) or in_features // n_heads
        if in_features != n_heads * head_dim:
            raise ValueError(
                f"{config.model_type}: output projection takes {in_features} features, expected "
                f"n_heads * head_dim = {n_heads} * {head_dim}"
            )
        self.geometry = HeadGeometry(len(self.layers), int(n_heads), int(head_dim))

    def _layer_list(self, model: nn.Module) -> nn.ModuleList:
        path = self.adapter.layers
        try:
            return _resolve(model, path)
        except AttributeError:
            head, _, rest = path.partition(".")
            try:
                return _resolve(model, rest)
            except AttributeError:
                raise UnsupportedArchitectureError(
                    f"{type(model).__name__}: no decoder layers at {path!r} or {rest!r}"
                ) from None

    def projection_in_features(self, projection: nn.Module) -> int:
        """Input width of an output projection, `n_heads * head_dim`."""
        if self.adapter.weight_layout == "conv1d":
            return int(projection.weight.shape[0])
        return int(projection.weight.shape[1])
