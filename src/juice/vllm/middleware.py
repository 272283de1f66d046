"""An ASGI middleware for vLLM's OpenAI server: `juice serve`'s `juice` body field -> `vllm_xargs`.

vLLM's request models accept per-request extension arguments only as `vllm_xargs`, a flat object
of strings, numbers and lists. This middleware moves a body's `"juice": {"method": ...}` into
`vllm_xargs` as `juice_method`, ... (:func:`juice.vllm.options.request_fields` reads both), so the
same client code works against `juice serve` and `juice serve --engine vllm`. Bodies without a
`juice` object, and bodies that are not JSON, pass through unchanged (vLLM answers those).
Loaded by vLLM's `--middleware juice.vllm.middleware.JuiceFieldMiddleware` (the launcher adds it).
"""

from __future__ import annotations

import json
from typing import Any


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
            xargs[f"juice_{key}"] = value
    elif fields is not None:
        xargs["juice_invalid"] = str(fields)
    out["vllm_xargs"] = xargs
    return out


class JuiceFieldMiddleware:
    """Rewrites the JSON body of POST requests to `/v1/completions` and `/v1/chat/completions`."""

    PATHS = ("/v1/completions", "/v1/chat/completions")

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") != "POST" or scope.get("path") not in self.PATHS:
            return await self.app(scope, receive, send)
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
        if isinstance(data, dict) and "juice" in data:
            body = json.dumps(juice_field_to_xargs(data)).encode()
            headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"content-length"]
            scope = {**scope, "headers": [*headers, (b"content-length", str(len(body)).encode())]}
        return await self.app(scope, _replay([{"type": "http.request", "body": body, "more_body": False}], receive),
                              send)


def _replay(messages: list[dict], receive):
    pending = list(messages)

    async def replay():
        if pending:
            return pending.pop(0)
        return await receive()

    return replay


__all__ = ["JuiceFieldMiddleware", "juice_field_to_xargs"]
