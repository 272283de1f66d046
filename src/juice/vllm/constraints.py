"""The vLLM configurations juice's plugin can steer in, checked when the model is built.

The steered model (:mod:`juice.vllm.models`) reads each request's token rows from the forward's
attention metadata, `query_start_loc[i]:query_start_loc[i+1]` for the batch's i-th request, with
per-batch Python state. A configuration where that reading would be wrong is refused with a
one-line :class:`PluginConfigError` naming the flag, before any request is served:

- eager mode (`--enforce-eager`): CUDA graphs and torch.compile would freeze the per-batch state;
- prefix caching off (`--no-enable-prefix-caching`): a cached block's KV belongs to one steering;
- no dual-batch overlap or micro-batching (`--enable-dbo`, `--ubatch-size`): each micro-batch's
  metadata numbers its requests from 0, so a second micro-batch would read the first one's
  requests' coefficients;
- an attention backend whose metadata has `query_start_loc` (FlashInfer's has none, and would
  crash on the first steered batch): `--attention-backend` picks another.

Kept apart from :mod:`juice.vllm.models` so that it imports nothing of vLLM: its checks take
vLLM's config and backend classes as they are and are tested without vLLM installed.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

ROW_FIELD = "query_start_loc"
"""The attention metadata field the steered model reads each request's token rows from."""


class PluginConfigError(ValueError):
    """vLLM was started in a way the steering cannot run in (the message says how to start it)."""


def check_engine_config(vllm_config: Any) -> None:
    """Refuse an engine configuration the steering would be wrong in (module docstring).

    Args:
        vllm_config: vLLM's `VllmConfig` (reads `model_config.enforce_eager`,
            `cache_config.enable_prefix_caching`, `parallel_config.enable_dbo` and
            `parallel_config.ubatch_size`).

    Raises:
        PluginConfigError: one line naming the flag to change.
    """
    if not vllm_config.model_config.enforce_eager:
        raise PluginConfigError("juice's vLLM plugin needs eager mode: start vLLM with --enforce-eager "
                                "(LLM(..., enforce_eager=True))")
    if vllm_config.cache_config.enable_prefix_caching:
        raise PluginConfigError("juice's vLLM plugin needs prefix caching off (one steering's KV must not "
                                "serve another): start vLLM with --no-enable-prefix-caching "
                                "(LLM(..., enable_prefix_caching=False))")
    parallel = vllm_config.parallel_config
    if getattr(parallel, "enable_dbo", False) or getattr(parallel, "ubatch_size", 0) > 1:
        raise PluginConfigError("juice's vLLM plugin does not support dual-batch overlap or micro-batching "
                                "(each micro-batch would read other requests' steering): start vLLM without "
                                "--enable-dbo and --ubatch-size")


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
