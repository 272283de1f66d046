"""An ASGI middleware for vLLM's OpenAI server: `juice serve`'s `juice` body field -> `vllm_xargs`,
checked by juice's one request protocol before vLLM sees it.

vLLM's request models accept per-request extension arguments only as `vllm_xargs`, a flat object
of strings, numbers and lists. On the routes it steers (:data:`STEERED_PATHS`), this middleware

1. reads the body's juice fields, the `juice` object or the `juice_*` keys of `vllm_xargs`, from
   the JSON as the client sent it, and checks them against the server's heads files with
   :func:`juice.vllm.options.request_ask` (:mod:`juice.steering_request`, the same function
   `juice serve` uses), so a body gets the same status and the same one-line message from both
   servers; vLLM's request model would have turned `true` into 1 before the plugin saw it;
2. moves the `juice` object into `vllm_xargs` as `juice_method`, ...
   (:func:`juice.steering_request.request_fields` reads both forms; per-head coefficients
   `{"L1H2": 0.5}` become `["L1H2=0.5"]`);
3. adds the request's steering warning (untuned betas) to the response in the
   :data:`juice.steering_request.WARNING_HEADER` header, as `juice serve` does.

Bodies that are not JSON objects pass through unchanged (vLLM answers those). Loaded by vLLM's
`--middleware juice.vllm.middleware.JuiceFieldMiddleware` (the launcher adds it).

Never ignored (:func:`refusal`): vLLM 0.32 serves more generating routes than those it steers
(`/v1/responses`, `/v1/messages`, `/v1/chat/completions/batch`, `/generative_scoring`, ...),
and runs each beam-search step with `SamplingParams` of its own, without the request's
`vllm_xargs` (vllm/entrypoints/generate/beam_search/online.py). A POST whose JSON body carries
juice fields (the `juice` object, or `juice_*` keys in `vllm_xargs`) to any route but
:data:`STEERED_PATHS`, or with `use_beam_search`, is answered 400 in that route's error shape
(Anthropic's on `/v1/messages`) naming the field, before vLLM sees it. A steered
request's KV cache salt is not set here but in the engine core, from the steering vLLM's admission
resolved (:mod:`juice.vllm.scheduler`), so a request that reaches vLLM by another way is salted too.
"""

from __future__ import annotations

import json
from typing import Any

from juice.steering_request import WARNING_HEADER, SteeringRequestError


def juice_field_to_xargs(body: dict[str, Any]) -> dict[str, Any]:
    """The body with its `juice` object moved into `vllm_xargs` (`juice_<key>`); a `juice` value
    that is not an object becomes `juice_invalid`, which the plugin refuses (HTTP 400)."""
    if "juice" not in body:
        return body
    out = dict(body)
    fields = out.pop("juice")
    xargs = dict(out.get("vllm_xargs") or {})
    if isinstance(fields, dict):
        for key, value in fields.items():
            xargs[f"juice_{key}"] = _xargs_value(key, value)
    elif fields is not None:
        xargs["juice_invalid"] = str(fields)
    out["vllm_xargs"] = xargs
    return out


def _xargs_value(key: Any, value: Any) -> Any:
    """A juice field's value as `vllm_xargs` holds it: per-head coefficients `{"L1H2": 0.5}`
    become `["L1H2=0.5"]` (vllm_xargs holds no objects); anything else as it is."""
    if key == "heads" and isinstance(value, dict):
        return [f"{name}={number!r}" for name, number in value.items()]
    return value


def check_body(body: dict[str, Any]) -> str | None:
    """The steering warning of a request body, or None. The body's steering, resolved from its
    fields as the client sent them, is kept for vLLM's admission of the same request
    (:func:`juice.vllm.options.remember`), which then reads it instead of parsing the fields again
    (when the rewritten body's fields are the same; otherwise admission parses them itself).

    Raises:
        SteeringRequestError: the body's juice fields are wrong (the one-line message).
    """
    from juice.steering_request import request_fields
    from juice.vllm.options import fields_key, plugin_heads, remember, request_ask, request_fields_of, wire_steering

    server = plugin_heads()
    xargs = body.get("vllm_xargs")
    extra = dict(xargs) if isinstance(xargs, dict) else {}
    if "juice" in body and body["juice"] is not None:
        extra["juice"] = body["juice"]
    fields = request_fields(extra)
    ask = request_ask(fields, server)
    wire = wire_steering(ask, server)
    rewritten = juice_field_to_xargs(body).get("vllm_xargs")
    try:
        passed_on = request_fields_of(rewritten if isinstance(rewritten, dict) else None)
    except SteeringRequestError:
        passed_on = None
    as_written = None if fields is None else {k: _xargs_value(k, v) for k, v in fields.items()}
    if fields_key(passed_on) == fields_key(as_written):   # the JSON, which tells true from 1
        remember(passed_on, server, wire)
    return ask.warning


STEERED_PATHS = ("/v1/completions", "/v1/chat/completions", "/invocations")
"""vLLM 0.32's routes whose requests the plugin steers: OpenAI's completions and chat completions,
and SageMaker's `/invocations`, which parses its body as one of the two. Their `juice` field is
checked and moved into `vllm_xargs`."""


def juice_field(body: dict[str, Any]) -> str | None:
    """The name of the body's field that carries juice fields (`juice`, or `vllm_xargs.juice` /
    `vllm_xargs.juice_<key>` for the first such key, the forms the plugin reads from `extra_args`),
    or None when it has none (a `juice` of null is none)."""
    if body.get("juice") is not None:
        return "juice"
    xargs = body.get("vllm_xargs")
    if isinstance(xargs, dict):
        for key in xargs:
            if isinstance(key, str) and (key == "juice" or key.startswith("juice_")):
                return f"vllm_xargs.{key}"
    return None


def refusal(path: str, body: dict[str, Any]) -> str | None:
    """Why a POST body to `path` cannot be steered as it asks (module docstring), or None.

    >>> refusal("/v1/responses", {"input": "hi", "juice": {"method": "june"}})[-49:]
    'send this request to /v1/chat/completions instead'
    >>> beam = {"prompt": "hi", "use_beam_search": True, "vllm_xargs": {"juice_method": "june"}}
    >>> refusal("/v1/completions", beam)[:57]
    'vllm_xargs.juice_method: juice does not steer beam search'
    >>> refusal("/v1/completions", {"prompt": "hi", "juice": {"method": "june"}}) is None
    True
    """
    field = juice_field(body)
    if field is None:
        return None
    if path not in STEERED_PATHS:
        return (f"{field}: juice checks and steers {', '.join(STEERED_PATHS[:-1])} and {STEERED_PATHS[-1]} on this "
                f"server, not {path} (a juice object would be dropped there, and its steering is not tested): "
                "send this request to /v1/chat/completions instead")
    if body.get("use_beam_search"):
        return (f"{field}: juice does not steer beam search (vLLM runs each beam step without the request's "
                "vllm_xargs); drop use_beam_search or the juice fields")
    return None


def error_body(message: str, path: str = "") -> bytes:
    """The 400 error body in the route's shape: Anthropic's on `/v1/messages`, else vLLM's (OpenAI's)."""
    if path.startswith("/v1/messages"):
        return json.dumps({"type": "error", "error": {"type": "invalid_request_error", "message": message}}).encode()
    return json.dumps({"error": {"message": message, "type": "BadRequestError", "param": "juice",
                                 "code": 400}}).encode()


def route_path(scope) -> str:
    """The path vLLM's router matches: the request's `path` less the app's `root_path` (vLLM's
    `--root-path`), as Starlette strips it; the ASGI spec's `path` includes the root path.

    >>> route_path({"path": "/x/v1/completions", "root_path": "/x"})
    '/v1/completions'
    >>> route_path({"path": "/v1/completions", "root_path": "/x"})
    '/v1/completions'
    """
    path, root = scope.get("path", ""), scope.get("root_path", "") or ""
    if root and path.startswith(root) and (len(path) == len(root) or path[len(root)] == "/"):
        return path[len(root):] or "/"
    return path


def _is_json(scope) -> bool:
    for key, value in scope.get("headers", []):
        if key.lower() == b"content-type":
            return b"json" in value.lower()
    return True   # no content type: vLLM's routes read JSON


class JuiceFieldMiddleware:
    """Checks and rewrites the JSON body of POST requests: steered on :data:`STEERED_PATHS`,
    refused elsewhere and with beam search when they carry juice fields (:func:`refusal`)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") != "POST" or not _is_json(scope):
            return await self.app(scope, receive, send)
        path = route_path(scope)
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] != "http.request":   # the client went away: let the app see it
                return await self.app(scope, _replay([message], receive), send)
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        try:
            data = json.loads(body)
        except ValueError:
            data = None
        warning = None
        if isinstance(data, dict):
            try:
                why = refusal(path, data)
                if why is not None:
                    raise SteeringRequestError(why)
                if path in STEERED_PATHS:
                    warning = check_body(data)
            except SteeringRequestError as err:
                payload = error_body(str(err), path)
                await send({"type": "http.response.start", "status": 400,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(payload)).encode())]})
                await send({"type": "http.response.body", "body": payload})
                return None
            if "juice" in data and path in STEERED_PATHS:
                body = json.dumps(juice_field_to_xargs(data)).encode()
                headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"content-length"]
                scope = {**scope, "headers": [*headers, (b"content-length", str(len(body)).encode())]}
        if warning is not None:
            send = _with_header(send, WARNING_HEADER, warning)
        return await self.app(scope, _replay([{"type": "http.request", "body": body, "more_body": False}], receive),
                              send)


def _with_header(send, name: str, value: str):
    async def sending(message):
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), (name.lower().encode(), value.encode())]}
        return await send(message)

    return sending


def _replay(messages: list[dict], receive):
    pending = list(messages)

    async def replay():
        if pending:
            return pending.pop(0)
        return await receive()

    return replay


__all__ = ["STEERED_PATHS", "JuiceFieldMiddleware", "check_body", "error_body", "juice_field", "juice_field_to_xargs",
           "refusal", "route_path"]
