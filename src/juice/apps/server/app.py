"""`juice serve`'s routes: the FastAPI app, its error handlers and its endpoints, over the
admission, response, metrics and worker rooms (:mod:`juice.apps.server`)."""

# no `from __future__ import annotations`: FastAPI reads the routes' annotations (Request, the
# request models) at run time, and Request is imported inside create_app (the server extra).
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from juice.apps.server.worker import Worker
from juice.apps.openai_schema import ChatRequest, CompletionRequest, ServerLimits, error_body, validation_message
from juice.apps.server.admission import Admission, ApiError
from juice.apps.server.metrics import ServerMetrics
from juice.apps.server.responses import Responder
from juice.models import LoadedModel
from juice.steering_request import ServedHeads

PLAYGROUND = Path(__file__).with_name("playground.html")
"""The page `GET /` answers: a prompt, an optional passage, a direction and a strength; Original,
JuNE and JuICE side by side, each one request to this server's `/v1/completions`; the steered
heads on a layer x head grid (from `GET /v1/models`' `juice` view,
:meth:`juice.apps.server.admission.Admission.heads_view`). One file, no script from another host."""


def _error_handlers(app, metrics: ServerMetrics) -> None:
    """Every error answered in OpenAI's shape (:func:`juice.apps.openai_schema.error_body`) and
    counted: juice's :class:`ApiError`, FastAPI's validation errors (400), Starlette's HTTP errors
    (404 for an unknown route, ...) and anything else (500)."""
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    def error_response(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                       code: str | int | None = None, headers: dict | None = None) -> JSONResponse:
        metrics.rejected(status)
        return JSONResponse(status_code=status, content=error_body(message, kind, param, code), headers=headers)

    @app.exception_handler(ApiError)
    async def api_error(request, exc: ApiError):
        return error_response(exc.status, exc.message, exc.kind, exc.param, exc.code, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request, exc: RequestValidationError):
        message, param = validation_message(list(exc.errors()))
        return error_response(400, message, param=param)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc: StarletteHTTPException):
        if exc.status_code == 404:   # OpenAI's words for a route it does not have
            return error_response(404, f"Invalid URL ({request.method} {request.url.path}): this server answers "
                                       "/v1/models, /v1/completions, /v1/chat/completions, /health, /metrics and /",
                                  code="unknown_url")
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def server_error(request, exc: Exception):
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}", "server_error")


def create_app(lm: LoadedModel, heads: Sequence[Any] = (), *, model_name: str | None = None,
               limits: ServerLimits | None = None, aliases: Mapping[str, Mapping[str, Any]] | None = None,
               default: Mapping[str, Any] | None = None):
    """The FastAPI app (:mod:`juice.apps.server`).

    Args:
        lm: the model.
        heads: heads artifacts (:func:`juice.load_heads`), at most one per direction.
        model_name: the name clients use in `model` (default: the model's name).
        limits: what the server admits (default :class:`ServerLimits`).
        aliases: more model names, each with the `juice` options its requests get (a request's
            own `juice` field overrides them key by key); :func:`juice.apps.server.parse_alias`
            reads `juice serve --alias NAME=SPEC`.
        default: the `juice` options of a request that sends none (`juice serve --default
            SPEC`, :func:`juice.steering_request.parse_spec`); None: the protocol's rule.

    Raises:
        ValueError: two heads files for the same direction; an alias that is the model's name, or
            an alias or default whose options the server cannot honour (the message says why).
    """
    from fastapi import FastAPI, Request
    from fastapi.responses import HTMLResponse, JSONResponse, Response

    limits = limits or ServerLimits()
    metrics = ServerMetrics()
    admission = Admission(lm, ServedHeads.of_artifacts(heads, lm.geometry, default), limits,
                          model_name or lm.name, aliases or {}, metrics.prompt_tokens.inc)
    worker = Worker(lm, limits.max_rows, limits.max_queued, on_step=metrics.tokens.inc, on_finish=metrics.finished)
    metrics.watch(worker)
    responder = Responder(lm.tokenizer, worker)

    app = FastAPI(title="juice", description="OpenAI-compatible completions with per-request head steering")
    app.state.worker, app.state.limits, app.state.registry = worker, limits, metrics.registry

    _error_handlers(app, metrics)

    @app.get("/health")
    def health() -> Any:
        if not worker.alive:
            return JSONResponse(status_code=503, content={"status": "the worker thread has stopped"})
        return {"status": "ok"}

    @app.get("/metrics")
    def metrics_text() -> Response:
        body, media_type = metrics.exposition()
        return Response(body, media_type=media_type)

    @app.get("/", include_in_schema=False)
    def playground() -> HTMLResponse:
        return HTMLResponse(PLAYGROUND.read_text(encoding="utf-8"))

    @app.get("/v1/models")
    def models() -> dict:
        view = admission.heads_view()   # an extra `juice` key, which OpenAI's clients ignore
        return {"object": "list", "data": [{"id": n, "object": "model", "created": 0, "owned_by": "juice",
                                            "juice": view} for n in admission.model_names]}

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request) -> Any:
        options = admission.options(req)
        ids, texts = admission.completion_prompts(req)
        job = admission.job(req, options, ids, req.max_tokens, req.logprobs, req.echo)

        def choice(k: int, text: str, reason: str) -> dict:
            head = texts[job.streams[k].prompt] if req.echo else ""
            lps = responder.logprobs_of(job, k, req.echo) if req.logprobs is not None or req.echo else None
            return {"text": head + text, "finish_reason": reason, "logprobs": lps}

        return await responder.respond(
            job, request, req.stream, req.model or admission.name, "cmpl", "text_completion", "text_completion",
            lambda text, reason, first: {"text": text, "logprobs": None, "finish_reason": reason}, choice)

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest, request: Request) -> Any:
        options = admission.options(req)
        job = admission.job(req, options, [admission.chat_ids(req)], req.max_completion_tokens or req.max_tokens)
        return await responder.respond(
            job, request, req.stream, req.model or admission.name, "chatcmpl", "chat.completion",
            "chat.completion.chunk",
            lambda text, reason, first: {"delta": ({"role": "assistant", "content": text} if first
                                                   else {"content": text} if text else {}), "finish_reason": reason},
            lambda k, text, reason: {"message": {"role": "assistant", "content": text}, "finish_reason": reason})

    return app


__all__ = ["create_app"]
