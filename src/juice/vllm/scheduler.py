"""Each steered request's KV cache salt, set in vLLM's engine core from the request's own steering.

vLLM's prefix cache keys a block by its tokens and its request's `cache_salt`. A steered
request's KV is not the unmodified model's (JuNE and pruning change every layer above the
first steered head; JuICE's blocks also hold the clean KV of the dual run), so a steered request
must never reuse a block another steering, or Original, computed. The salt is therefore the
steering's own (:func:`juice.vllm.options.steering_salt`, combined with the client's salt where it
sent one), and it is set here, where the prefix cache reads it: the scheduler's `add_request`
reads the request's `juice` fields from its `SamplingParams.extra_args`, resolves them against the
served heads (the server's default steering included), sets `request.cache_salt` and recomputes
the request's block hashes before vLLM looks anything up. A request cannot carry the wrong salt
however it was built (offline with a plain prompt, over HTTP with `vllm_xargs`, a salt copied
from another request): the salt is derived, never trusted.

Original requests keep their client's salt (they share blocks with unsteered vLLM), except a
client salt that starts with `juice-` (the prefix of every steering's salt), which is re-keyed
so that no client can name a steered request's blocks.

Streaming-input sessions (vLLM's resumable requests: later input chunks arrive under the same
request id, each with its own `SamplingParams`) keep the steering of their first chunk: a later
chunk whose steering differs (:func:`steering_changed`) is refused. Its KV would be computed under
the new steering but cached under the session's salt, and the session's earlier KV is the old
steering's, so no salt could be right. The chunk is not applied; the session ends with vLLM's
error finish reason (the client's stream ends with `finish_reason` "error") and one warning line
on the `juice` logger names the request and both steerings. A chunk that repeats the first
chunk's steering, or sends none where the first sent none, goes on as vLLM handles it.

vLLM takes the scheduler as `--scheduler-cls` (:data:`juice.vllm.SCHEDULER`, a function that
builds vLLM's own scheduler class with this `add_request`, synchronous or asynchronous as the
engine's `async_scheduling` says); `juice serve --engine vllm` and :func:`juice.vllm.llm_options`
pass it, and the steered model refuses to start with prefix caching on without it
(:func:`juice.vllm.constraints.check_scheduler`). vLLM logs that a custom scheduler's interface is
not public: the plugin relies on `Scheduler.add_request`, `Request.cache_salt`,
`Request.block_hashes` and `Request.update_block_hashes`, and for a refused streaming chunk
`Scheduler.finish_requests`, `Scheduler.update_from_output`'s return and `EngineCoreOutput` (vLLM 0.32).
"""

from __future__ import annotations

import functools
import hashlib
import logging
from typing import Any

from juice.methods import by_protocol
from juice.steering_request import SteeringRequestError
from juice.steering_request import request_fields
from juice.vllm.options import (SALT_PREFIX, PluginHeads, request_ask, request_cache_salt, served_heads,
                                steering_salt)

LOG = logging.getLogger("juice")


def effective_salt(extra_args: dict[str, Any] | None, client_salt: str | None, server: PluginHeads) -> str | None:
    """The `cache_salt` a request is cached under: its steering's salt combined with the
    client's (:func:`juice.vllm.options.request_cache_salt`) for a steered request; the client's
    own for Original, re-keyed when it starts with :data:`juice.vllm.options.SALT_PREFIX`
    (module docstring).

    Args:
        extra_args: the request's `SamplingParams.extra_args` (its juice fields; None: the
            server's default steering).
        client_salt: the `cache_salt` the request arrived with.
        server: the served heads (:func:`juice.vllm.options.served_heads`).

    Raises:
        SteeringRequestError: the fields are wrong (vLLM's admission refuses such a request before
            it reaches the engine: :class:`juice.vllm.processor.JuiceSteeringProcessor`).
    """
    salt = steering_salt(request_ask(request_fields(extra_args), server), server)
    if salt is not None:
        return request_cache_salt(salt, client_salt)
    if client_salt and client_salt.startswith(SALT_PREFIX):
        return "client-" + hashlib.sha256(client_salt.encode()).hexdigest()[:32]
    return client_salt


class SaltsSteeredRequests:
    """The `add_request` juice's scheduler adds to vLLM's (module docstring). Mixed in before
    vLLM's `Scheduler` or `AsyncScheduler` by :func:`salting_scheduler`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.juice_server = served_heads(_vllm_config(args, kwargs))
        self.juice_refused: list[Any] = []   # streaming sessions ended since the last output, to tell

    def add_request(self, request: Any) -> None:
        session = self.requests.get(request.request_id)
        if session is None:   # a new request, not a streaming session's next chunk
            salt_request(request, self.juice_server)
        elif getattr(request, "resumable", False) and steering_changed(session, request, self.juice_server):
            # (a request that is not resumable is vLLM's end-of-stream marker, with generate's own parameters)
            self._juice_refuse_chunk(session, request)
            return
        super().add_request(request)

    def _juice_refuse_chunk(self, session: Any, chunk: Any) -> None:
        """End a streaming session whose later chunk changed its steering (module docstring): the
        chunk is not applied, the session finishes with vLLM's FINISHED_ERROR, and the next
        :meth:`update_from_output` tells its client."""
        from vllm.v1.request import RequestStatus

        LOG.warning("juice: streaming request %s changed its steering after its first chunk (%s -> %s): the session "
                    "is ended with an error; a streaming session keeps its first chunk's steering",
                    session.request_id, _steering_name(session, self.juice_server),
                    _steering_name(chunk, self.juice_server))
        self.finish_requests(session.request_id, RequestStatus.FINISHED_ERROR)
        self.juice_refused.append(session)

    def update_from_output(self, *args: Any, **kwargs: Any) -> Any:
        outputs = super().update_from_output(*args, **kwargs)
        if self.juice_refused:
            from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs

            refused, self.juice_refused = self.juice_refused, []
            for session in refused:
                message = EngineCoreOutput(request_id=session.request_id, new_token_ids=[],
                                           finish_reason=session.get_finished_reason())
                outputs.setdefault(session.client_index, EngineCoreOutputs()).outputs.append(message)
        return outputs


def salt_request(request: Any, server: PluginHeads) -> None:
    """Set a vLLM `Request`'s `cache_salt` to :func:`effective_salt` and recompute its block hashes
    (vLLM hashed its blocks with the salt it arrived with). A request whose fields are wrong is
    left as it is: vLLM's admission refused it already, and the steered model refuses it again."""
    params = getattr(request, "sampling_params", None)
    try:
        salt = effective_salt(getattr(params, "extra_args", None), request.cache_salt, server)
    except SteeringRequestError:
        return
    if salt != request.cache_salt:
        request.cache_salt = salt
        request.block_hashes.clear()
        request.update_block_hashes()


def steering_changed(session: Any, chunk: Any, server: PluginHeads) -> bool:
    """Whether a streaming session's next chunk asks for another steering than the session's
    (their resolved steerings' salts differ, :func:`juice.vllm.options.steering_salt`; a chunk
    without juice fields gets the server's default, as its first chunk would have). A chunk whose
    fields are wrong counts as changed (vLLM's admission refuses such fields before they arrive).

    Args:
        session, chunk: vLLM `Request`s (reads `sampling_params.extra_args`).
        server: the served heads (:func:`juice.vllm.options.served_heads`).
    """
    try:
        return _steering_of(session, server) != _steering_of(chunk, server)
    except SteeringRequestError:
        return True


def _steering_of(request: Any, server: PluginHeads) -> str | None:
    params = getattr(request, "sampling_params", None)
    return steering_salt(request_ask(request_fields(getattr(params, "extra_args", None)), server), server)


def _steering_name(request: Any, server: PluginHeads) -> str:
    params = getattr(request, "sampling_params", None)
    try:
        ask = request_ask(request_fields(getattr(params, "extra_args", None)), server)
    except SteeringRequestError as err:
        return f"invalid: {err}"
    if by_protocol(ask.method).tuned != "betas":   # Original, pruning, auto: no direction and betas
        return ask.method
    return f"{ask.method} {ask.direction} ({ask.beta_plus:g}, {ask.beta_minus:g})"


@functools.cache
def _scheduler_class(asynchronous: bool) -> type:
    if asynchronous:
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler as base
    else:
        from vllm.v1.core.sched.scheduler import Scheduler as base
    return type(f"Juice{base.__name__}", (SaltsSteeredRequests, base), {"__module__": __name__})


def salting_scheduler(*args: Any, **kwargs: Any) -> Any:
    """vLLM's scheduler (`AsyncScheduler` when the engine schedules asynchronously, else
    `Scheduler`) with :class:`SaltsSteeredRequests`' `add_request`; vLLM's engine core calls it
    as it would call its scheduler class (its `--scheduler-cls`, :data:`juice.vllm.SCHEDULER`)."""
    asynchronous = bool(_vllm_config(args, kwargs).scheduler_config.async_scheduling)
    return _scheduler_class(asynchronous)(*args, **kwargs)


def _vllm_config(args: tuple, kwargs: dict) -> Any:
    """The `vllm_config` of vLLM's scheduler constructor call (a keyword, or the first argument)."""
    return kwargs["vllm_config"] if "vllm_config" in kwargs else args[0]


__all__ = ["SaltsSteeredRequests", "effective_salt", "salt_request", "salting_scheduler", "steering_changed"]
