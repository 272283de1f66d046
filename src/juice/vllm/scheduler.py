"""Each steered request's KV cache salt, set in vLLM's engine core from the request's own steering.

vLLM's prefix cache keys a block by its tokens and its request's `cache_salt`. A steered
request's KV is not the unmodified model's (JuNE and pruning change every layer above the
first steered head; JuICE's blocks also hold the clean KV of the dual run), so a steered request
must never reuse a block another steering, or Original, computed. The salt is therefore the
steering's own (:func:`juice.vllm.options.steering_salt`, combined with the client's salt where it
sent one), and it is set here, where the prefix cache reads it: the scheduler's `add_request`
reads the steering admission resolved from the request's fields (the server's default steering
included) and wrote into its `SamplingParams.extra_args` (:func:`juice.vllm.options.admit`,
:data:`juice.vllm.options.WIRE_KEY`; no field is parsed here), sets `request.cache_salt` and
recomputes the request's block hashes before vLLM looks anything up. A request cannot carry the
wrong salt however it was built (offline with a plain prompt, over HTTP with `vllm_xargs`, a salt
copied from another request): the salt is derived at admission, which overwrites any steering a
caller put in `extra_args`, never trusted from the client. A request handed to the engine without
admission (vLLM's deprecated ways of passing a ready `EngineCoreRequest`) is salted from its
fields, resolved here on the served heads, as before admission resolved them
(:func:`juice.vllm.options.admitted_steering`).

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

from juice.steering_request import SteeringRequestError
from juice.vllm.options import SALT_PREFIX, PluginHeads, admitted_steering, request_cache_salt, served_heads

LOG = logging.getLogger("juice")


def effective_salt(extra_args: dict[str, Any] | None, client_salt: str | None, server: PluginHeads) -> str | None:
    """The `cache_salt` a request is cached under: its steering's salt (admission's,
    :func:`juice.vllm.options.admitted_steering`) combined with the client's
    (:func:`juice.vllm.options.request_cache_salt`) for a steered request; the client's own for
    Original, re-keyed when it starts with :data:`juice.vllm.options.SALT_PREFIX` (module
    docstring).

    Args:
        extra_args: the request's `SamplingParams.extra_args`, as admission passed them on.
        client_salt: the `cache_salt` the request arrived with.
        server: the served heads (:func:`juice.vllm.options.served_heads`), which resolve the
            fields of a request handed over without admission.

    Raises:
        SteeringRequestError: no admitted steering and fields that do not resolve.
    """
    salt = _salt_of(extra_args, server)
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
    (vLLM hashed its blocks with the salt it arrived with). A request handed over without admission
    whose fields do not resolve is left as it is (the worker refuses it)."""
    try:
        salt = effective_salt(_extra_args(request), request.cache_salt, server)
    except SteeringRequestError:
        return
    if salt != request.cache_salt:
        request.cache_salt = salt
        request.block_hashes.clear()
        request.update_block_hashes()


def steering_changed(session: Any, chunk: Any, server: PluginHeads) -> bool:
    """Whether a streaming session's next chunk asks for another steering than the session's:
    the salts of their admitted steerings differ (:func:`juice.vllm.options.steering_salt`; a
    chunk without juice fields was given the server's default at admission, as its first chunk
    was). A chunk whose steering does not resolve counts as changed.

    Args:
        session, chunk: vLLM `Request`s (reads `sampling_params.extra_args`).
        server: the served heads (for a request handed over without admission).
    """
    try:
        return _salt_of(_extra_args(session), server) != _salt_of(_extra_args(chunk), server)
    except SteeringRequestError:
        return True


def _extra_args(request: Any) -> Any:
    return getattr(getattr(request, "sampling_params", None), "extra_args", None)


def _salt_of(extra_args: Any, server: PluginHeads) -> str | None:
    return admitted_steering(extra_args, server).get("salt")


def _steering_name(request: Any, server: PluginHeads) -> str:
    try:
        return str(admitted_steering(_extra_args(request), server).get("name"))
    except SteeringRequestError as err:
        return f"invalid: {err}"


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
