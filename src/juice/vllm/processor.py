"""Per-request steering into vLLM's worker: a logits processor that resolves each request's juice
fields once, at admission, and applies what admission resolved in the worker (vLLM V1's
`LogitsProcessor` interface, the documented per-request extension point).

vLLM calls `validate_params` when a request is admitted, in the process that admits it (the API
server, or the offline `LLM`'s), before it copies the request's `SamplingParams` for the engine: a
`ValueError` becomes HTTP 400 and the engine keeps serving. There the request's fields are checked
and resolved (:func:`juice.vllm.options.admit`) into the canonical steering that travels in its
`extra_args` (:data:`juice.vllm.options.WIRE_KEY`: kind and per-head coefficients). vLLM calls
`update_state` in every worker before each forward with the requests added to, removed from and
moved within the persistent batch; the worker builds each added request's tables from that
canonical steering (:func:`juice.vllm.options.applied`), reading no request field (a request handed
to the engine without admission, by vLLM's deprecated ways of passing a ready `EngineCoreRequest`,
is resolved from its fields there, :func:`juice.vllm.options.admitted_steering`). The processor
keeps batch index -> :class:`juice.vllm.options.RequestSteering` in :data:`BATCH`, which the
steered models (:mod:`juice.vllm.models`) read in the same process. It never changes logits.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from juice.architectures import config_geometry
from juice.vllm import steered_architectures
from juice.vllm.constraints import PluginConfigError, check_plugin_on_here
from juice.steering_request import SteeringRequestError
from juice.vllm.options import (RequestSteering, SteeringWireError, admit, admitted_steering, applied, plugin_enabled,
                                plugin_heads, served_heads)


class SteeringBuildError(RuntimeError):
    """A request's steering failed to build in the worker: admission and the worker disagree about
    the served heads, or a request handed to the engine without admission has fields that do not
    resolve (never expected; the engine stops rather than serve the request unsteered)."""


class BatchSteering:
    """Batch index -> steering of the worker's persistent batch (absent: Original).

    `version` changes whenever the batch's steering does, so the models rebuild their tables
    only then."""

    def __init__(self) -> None:
        self.rows: dict[int, RequestSteering] = {}
        self.version = 0


BATCH = BatchSteering()
"""This process's batch (one model runner per worker process)."""


class JuiceSteeringProcessor(LogitsProcessor):
    """Resolves each request's juice fields (`SamplingParams.extra_args`) at admission and carries
    the resolved steering to the steered model (module docstring)."""

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        """Refuse a request whose juice fields are wrong, else resolve them once: the request's
        `extra_args` get its canonical steering (:func:`juice.vllm.options.admit`, checked against
        the served geometry, which the steered model checks equal to its own at start), from which
        the engine core sets its KV cache salt (:mod:`juice.vllm.scheduler`) and the worker builds
        its tables. vLLM calls this on the caller's `SamplingParams` before copying them for the
        engine, so the caller's object gets that one key (a second admission of the same object
        writes it again from its fields; concurrent admissions of one object write equal values).

        Raises:
            ValueError: the one-line reason (vLLM answers HTTP 400 with it).
        """
        try:
            sampling_params.extra_args = admit(sampling_params.extra_args, plugin_heads())
        except SteeringRequestError as err:
            raise ValueError(str(err)) from None

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        """Raises: PluginConfigError: the plugin is on and the served architecture has no steered
        class (:func:`juice.vllm.steered_architectures`), or vLLM's config turns it on and this worker's
        environment does not (:func:`juice.vllm.constraints.check_plugin_on_here`): its requests
        would be served unsteered.

        The worker's set-up comes from vLLM's config where the launcher put it there
        (:func:`juice.vllm.options.served_heads`), as the steered model's does."""
        self.server = served_heads(vllm_config)
        check_plugin_on_here(self.server.enabled, plugin_enabled())
        served = list(getattr(vllm_config.model_config.hf_config, "architectures", None) or [])
        steered = steered_architectures()
        if self.server.enabled and not any(a in steered for a in served):
            raise PluginConfigError(f"juice's vLLM plugin steers {', '.join(sorted(steered))}; this model is "
                                    f"{', '.join(served) or 'of an unknown architecture'} (juice serve steers it "
                                    "with juice's own engine)")
        self.geometry = config_geometry(vllm_config.model_config.hf_config)
        self.resolving = replace(self.server, geometry=self.geometry)   # a request handed over without admission
        BATCH.rows.clear()
        BATCH.version += 1

    def is_argmax_invariant(self) -> bool:
        return True

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        rows = BATCH.rows
        for index in batch_update.removed:
            rows.pop(index, None)
        for index, params, _prompt, _output in batch_update.added:
            try:
                steering = applied(admitted_steering(params.extra_args, self.resolving), self.geometry, self.server)
            except (SteeringWireError, SteeringRequestError) as err:   # admission checked it against the served
                raise SteeringBuildError(                               # heads: stop rather than decode it unsteered
                    f"juice: a request's steering could not be applied in the worker ({err}); "
                    "stopping instead of decoding it as Original") from None
            if steering is None:
                rows.pop(index, None)
            else:
                rows[index] = steering
        for a, b, direction in batch_update.moved:
            first, second = rows.pop(a, None), rows.pop(b, None)
            if first is not None:
                rows[b] = first
            if direction == MoveDirectionality.SWAP and second is not None:
                rows[a] = second
        BATCH.version += 1


__all__ = ["BATCH", "BatchSteering", "JuiceSteeringProcessor", "SteeringBuildError"]
