"""`juice serve`: an OpenAI-compatible HTTP server (FastAPI + uvicorn) with per-request steering.

Endpoints: `GET /v1/models`, `POST /v1/completions`, `POST /v1/chat/completions` (both with
`"stream": true`, server-sent events in OpenAI's format), `GET /health`, `GET /metrics`
(Prometheus text format). Steering per request in an extra body field (the official `openai`
client passes it with `extra_body`):

    "juice": {"direction": "context", "method": "juice", "beta_plus": 2, "beta_minus": 0}

The fields, their defaults and their errors are juice's one request protocol
(:mod:`juice.steering_request`, README "The juice request field"), shared with vLLM's plugin: a
body gets the same status and message from `juice serve` and `juice serve --engine vllm`.
`method` "juice" | "june" | "original" | "prune" (with `heads`); betas default to the heads
file's tuned values for the method (`juice tune`), else 2 and 0 with a warning in the
`X-Juice-Warning` response header (untuned betas can break a small model's text). A request
without a `juice` field gets the operator's default (`juice serve --default SPEC`), else the
tuned steering of the only heads file where that file holds tuned betas, else Original: an
untuned heads file never steers a request that did not ask (issue 38).

Scheduling: one worker thread owns the model (:class:`juice.apps.engine.Engine`) and decodes
every running request in one batch, one token per step; a request joins the batch at the next
step and leaves it the step it ends (EOS, a stop string, `max_tokens`), and is answered then
(iteration-level scheduling, :mod:`juice.continuous`). A request's tokens do not depend on the
others in the batch (tested: joining mid-flight, greedy and seeded sampling, every steering). A
closed connection or an abandoned stream leaves the batch at the next step.

Admission (:class:`juice.apps.openai_schema.ServerLimits`, README "Limits"): every field is
checked before a request is queued; errors come in OpenAI's shape
(`{"error": {"message", "type", "param", "code"}}`): 400 for a bad value or what is not
implemented (`logprobs`, `echo`, ...), 404 for a `model` the server does not serve, 429 with
Retry-After past the queue, 504 past the request timeout.
"""

# no `from __future__ import annotations`: FastAPI reads the routes' annotations (Request, the
# request models) at run time, and Request is imported inside create_app (the server extra).
import asyncio
import json
import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from juice.apps.engine import Engine, Job, QueueFull
from juice.apps.openai_schema import (ChatRequest, CompletionRequest, MAX_SEED, ServerLimits, error_body,
                                      validation_message)
from juice.decoding import Stream
from juice.models import LoadedModel
from juice.sampling import Sampling
from juice.completion_text import TextStream, chat_prompt, final_text
from juice.steering import Steering
from juice.steering_request import (MAX_ABS_BETA, WARNING_HEADER, ServedHeads, SteeringRequestError, juice_fields,
                                    parse_spec, read_steering)
from juice.tokens import context_length, token_ids

LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640)


class ApiError(Exception):
    """An HTTP error in OpenAI's shape."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                 code: str | int | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code
        self.headers = headers


def parse_alias(text: str) -> tuple[str, dict[str, Any]]:
    """`NAME=SPEC` (`juice serve --alias`), SPEC as :func:`parse_spec` reads it, e.g.
    `gemma+juice=direction:contextual,method:juice,beta_plus:2` -> ("gemma+juice",
    {"direction": "contextual", "method": "juice", "beta_plus": 2.0}).

    Raises:
        ValueError: no `=`, an empty name, or a pair without `:` (the message quotes it).
    """
    name, sep, spec = text.partition("=")
    if not sep or not name.strip():
        raise ValueError(f"--alias {text!r}: write NAME=key:value,key:value")
    return name.strip(), parse_spec(spec, f"--alias {text!r}")


def text_offsets(tokenizer, ids: list[int], window: int = 4) -> list[int]:
    """Where each token starts in the text `ids` decode to (special tokens skipped, so BOS and
    EOS have length 0): OpenAI's legacy `text_offset`, in characters.

    Token i's text is what decoding ids[j:i+1] adds to decoding ids[j:i] (j = i - `window`, so
    that separators and byte-fallback pieces come out as in the whole text); it starts where
    that addition ends less the token's own decoded length. Three batched decodes (windows of
    `window` + 1 tokens, and each token alone), not one decode per prefix (1.4 s for a
    2,100-token prompt)."""
    starts = [max(0, i - window) for i in range(len(ids))]
    with_token = tokenizer.batch_decode([ids[j:i + 1] for i, j in enumerate(starts)], skip_special_tokens=True)
    without = tokenizer.batch_decode([ids[j:i] for i, j in enumerate(starts)], skip_special_tokens=True)
    alone = tokenizer.batch_decode([[t] for t in ids], skip_special_tokens=True)
    offsets, at = [], 0
    for own, a, b in zip(alone, with_token, without):
        added = max(0, len(a) - len(b))
        offsets.append(at + max(0, added - len(own)))
        at += added
    return offsets


def create_app(lm: LoadedModel, heads: Sequence[Any] = (), *, model_name: str | None = None,
               limits: ServerLimits | None = None, aliases: Mapping[str, Mapping[str, Any]] | None = None,
               default: Mapping[str, Any] | None = None):
    """The FastAPI app (module docstring).

    Args:
        lm: the model.
        heads: heads artifacts (:func:`juice.load_heads`), at most one per direction.
        model_name: the name clients use in `model` (default: the model's name).
        limits: what the server admits (default :class:`ServerLimits`).
        aliases: more model names, each with the `juice` options its requests get (a request's
            own `juice` field overrides them key by key); :func:`parse_alias` reads
            `juice serve --alias NAME=SPEC`.
        default: the `juice` options of a request that sends none (`juice serve --default
            SPEC`, :func:`parse_spec`); None: the module docstring's rule.

    Raises:
        ValueError: two heads files for the same direction; an alias that is the model's name, or
            an alias or default whose options the server cannot honour (the message says why).
    """
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
    from starlette.exceptions import HTTPException as StarletteHTTPException

    limits = limits or ServerLimits()
    served = ServedHeads.of_artifacts(heads, lm.heads.geometry, default)
    name = model_name or lm.name
    aliases = {k: dict(v) for k, v in (aliases or {}).items()}
    if name in aliases:
        raise ValueError(f"alias {name!r} is the served model's own name")
    context = limits.max_total_tokens or context_length(lm.model)
    vocab = lm.model.get_output_embeddings().weight.shape[0]

    registry = CollectorRegistry()
    m_tokens = Counter("juice_generation_tokens", "Tokens generated", registry=registry)
    m_prompt = Counter("juice_prompt_tokens", "Prompt tokens admitted", registry=registry)
    m_requests = Counter("juice_requests", "Requests ended, by outcome (ok, cancelled, timeout, error, "
                         "rejected_400, rejected_404, rejected_429)", ["outcome"], registry=registry)
    m_latency = Histogram("juice_request_latency_seconds", "Seconds from admission to the last token of "
                          "requests that ended ok", buckets=LATENCY_BUCKETS, registry=registry)
    m_ttft = Histogram("juice_time_to_first_token_seconds", "Seconds from admission to the first token",
                       buckets=LATENCY_BUCKETS, registry=registry)

    def finished(job: Job) -> None:
        m_requests.labels(job.outcome).inc()
        if job.outcome == "ok":
            m_latency.observe(job.finished - job.submitted)
        if job.first_token is not None:
            m_ttft.observe(job.first_token - job.submitted)

    engine = Engine(lm, limits.max_rows, limits.max_queued, on_step=m_tokens.inc, on_finish=finished)
    Gauge("juice_requests_running", "Requests decoding", registry=registry).set_function(lambda: engine.running)
    Gauge("juice_requests_waiting", "Requests admitted and not started", registry=registry).set_function(
        lambda: engine.waiting)
    Gauge("juice_batch_rows", "Rows of the running batch (a JuICE stream holds two)",
          registry=registry).set_function(lambda: engine.session.rows)
    Gauge("juice_generation_tokens_per_second", "Tokens generated per second over the last 10 s",
          registry=registry).set_function(engine.tokens_per_second)

    app = FastAPI(title="juice", description="OpenAI-compatible completions with per-request head steering")
    app.state.engine, app.state.limits, app.state.registry = engine, limits, registry

    def error_response(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                       code: str | int | None = None, headers: dict | None = None) -> JSONResponse:
        if status in (400, 404, 429):
            m_requests.labels(f"rejected_{status}").inc()
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
        return error_response(exc.status_code, str(exc.detail), "not_found_error" if exc.status_code == 404
                              else "invalid_request_error")

    @app.exception_handler(Exception)
    async def server_error(request, exc: Exception):
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}", "server_error")

    def steering_of(options: Any) -> tuple[Steering, str | None]:
        """The steering a request's `juice` options ask for (:func:`juice.steering_request.read_steering`),
        and the warning to send with it."""
        try:
            ask = read_steering(options, served)
            return ask.steering(lm.heads.geometry, served), ask.warning
        except SteeringRequestError as err:
            raise ApiError(400, str(err), param="juice") from None

    def check_model(req) -> dict:
        """The request's `juice` options: its model's (an alias's) overridden by its own field."""
        if req.model is not None and req.model != name and req.model not in aliases:
            raise ApiError(404, f"The model `{req.model}` does not exist.", "NotFoundError", "model", 404)
        if message := req.unsupported():
            raise ApiError(400, message)
        try:
            own = juice_fields(req.juice)
        except SteeringRequestError as err:
            raise ApiError(400, str(err), param="juice") from None
        return {**aliases.get(req.model, {}), **own}

    for alias, options in [*aliases.items(), *([("--default", default)] if default is not None else [])]:
        try:   # refused at start, not per request
            steering_of(options)
        except ApiError as err:
            raise ValueError(f"{alias if alias == '--default' else f'alias {alias!r}'}: {err.message}") from None

    def job_of(req, options: dict, ids: list[list[int]], max_tokens: int | None, logprobs: int | None = None,
               echo: bool = False) -> Job:
        if req.n > limits.max_n:
            raise ApiError(400, f"n must be at most {limits.max_n} (this server's --max-n)", param="n")
        if len(req.stops()) > 4:
            raise ApiError(400, "stop: at most 4 stop strings", param="stop")
        steering, warning = steering_of(options)
        max_new = limits.default_max_tokens if max_tokens is None else max_tokens
        for row in ids:
            if not row:
                raise ApiError(400, "prompt is empty (no tokens)", param="prompt")
            if context is not None and len(row) + max_new > context:
                raise ApiError(400, f"This model's maximum context length is {context} tokens. However, you "
                                    f"requested {len(row) + max_new} tokens ({len(row)} in the prompt, {max_new} "
                                    "for the completion).", param="max_tokens")
        temperature = 1.0 if req.temperature is None else req.temperature
        seed = int.from_bytes(os.urandom(4), "little") if req.seed is None else req.seed
        streams = []
        for i in range(len(ids)):
            for k in range(req.n):
                sampling = None if temperature == 0 else Sampling(
                    temperature, max(0, req.top_k or 0), 1.0 if req.top_p is None else req.top_p, (seed + k) % MAX_SEED)
                streams.append(Stream(i, steering, sampling, req.repetition_penalty or 1.0))
        m_prompt.inc(sum(map(len, ids)))
        return Job(ids, streams, max_new, req.stops(), limits.request_timeout_s, logprobs=logprobs, echo=echo,
                   warning=warning)

    def text_of(job: Job, k: int) -> tuple[str, str]:
        return final_text(lm.tokenizer, job.tokens[k], job.stop), job.reasons[k] or "length"

    def usage(job: Job) -> dict:
        prompt = sum(map(len, job.prompt_ids))
        completion = sum(map(len, job.tokens))
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def submit(job: Job) -> None:
        try:
            engine.submit(job)
        except QueueFull as err:
            raise ApiError(429, f"the server is busy: {err}; retry later", "rate_limit_error", None,
                           "rate_limit_exceeded", {"Retry-After": "1"}) from None

    async def watch_disconnect(request: Request, job: Job) -> None:
        """Cancel `job` when the client closes the connection."""
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                engine.cancel(job)
                return

    def outcome_error(job: Job) -> ApiError | None:
        if job.outcome == "timeout":
            return ApiError(504, job.error or "timeout", "timeout_error", code="timeout")
        if job.outcome == "error":
            return ApiError(500, job.error or "error", "server_error")
        return None

    def warning_header(job: Job) -> dict[str, str]:
        return {} if job.warning is None else {WARNING_HEADER: job.warning}

    async def respond(job: Job, request: Request, stream: bool, model: str, prefix: str, kind: str,
                      chunk_kind: str, chunk_choice: Callable[[str, str | None, bool], dict],
                      choice: Callable[[int, str, str], dict]) -> Any:
        """The OpenAI response to `job`: a stream of `chunk_kind` chunks, or one `kind` object
        with a choice per stream; `chunk_choice` (text, finish reason, first chunk?) and `choice`
        (stream index, text, finish reason) shape a choice."""
        rid, created = f"{prefix}-{uuid.uuid4().hex[:24]}", int(time.time())
        loop = asyncio.get_running_loop()
        if not stream:
            done = asyncio.Event()
            job.on_done = lambda: loop.call_soon_threadsafe(done.set)
            submit(job)
            watcher = asyncio.create_task(watch_disconnect(request, job))
            try:
                await done.wait()
            finally:
                watcher.cancel()
            if job.outcome == "cancelled":
                return Response(status_code=499)
            if (err := outcome_error(job)) is not None:
                raise err
            choices = [{"index": k, **choice(k, *text_of(job, k))} for k in range(len(job.streams))]
            return JSONResponse({"id": rid, "object": kind, "created": created, "model": model, "choices": choices,
                                 "usage": usage(job)}, headers=warning_header(job))
        tokens: asyncio.Queue = asyncio.Queue()
        job.on_token = lambda k, t: loop.call_soon_threadsafe(tokens.put_nowait, (k, t))
        job.on_done = lambda: loop.call_soon_threadsafe(tokens.put_nowait, None)
        submit(job)

        def chunk(k: int, text: str, reason: str | None, first: bool = False) -> str:
            body = {"id": rid, "object": chunk_kind, "created": created, "model": model,
                    "choices": [{"index": k, **chunk_choice(text, reason, first)}]}
            return f"data: {json.dumps(body)}\n\n"

        async def events():
            watcher = asyncio.create_task(watch_disconnect(request, job))
            texts = [TextStream(lm.tokenizer, job.stop) for _ in job.streams]
            try:
                for k in range(len(job.streams)):
                    yield chunk(k, "", None, first=True)
                while (item := await tokens.get()) is not None:
                    k, token = item
                    if piece := texts[k].add(token):
                        yield chunk(k, piece, None)
                if job.outcome == "ok":
                    for k in range(len(job.streams)):
                        text, reason = text_of(job, k)
                        yield chunk(k, texts[k].rest(text), reason)
                elif (err := outcome_error(job)) is not None:
                    yield f"data: {json.dumps(error_body(err.message, err.kind, code=err.code))}\n\n"
                yield "data: [DONE]\n\n"
            finally:
                watcher.cancel()
                if job.outcome is None:
                    engine.cancel(job)

        return StreamingResponse(events(), media_type="text/event-stream", headers=warning_header(job))

    @app.get("/health")
    def health() -> Any:
        if not engine.alive:
            return JSONResponse(status_code=503, content={"status": "the engine thread has stopped"})
        return {"status": "ok"}

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    def models() -> dict:
        return {"object": "list", "data": [{"id": n, "object": "model", "created": 0, "owned_by": "juice"}
                                           for n in [name, *aliases]]}

    def logprobs_of(job: Job, k: int, echo: bool) -> dict:
        """OpenAI's legacy `logprobs` object of stream k: the prompt's tokens first if `echo` (the
        first with null), then every new token (EOS included when it ended there, as the text
        is not: a caller that drops the last token, as lm-evaluation-harness does, drops it).
        `text_offset`: see `text_offsets`."""
        piece = lambda t: lm.tokenizer.decode([t])   # noqa: E731
        entries: list[tuple[int, float | None, tuple | None]] = []
        if echo:
            ids = job.prompt_ids[job.streams[k].prompt]
            entries.append((ids[0], None, None))
            entries += [(t, lp, top) for t, (lp, top) in zip(ids[1:], job.prompt_logprobs[job.streams[k].prompt])]
        entries += [(t, lp, top) for t, (lp, top) in zip(job.tokens[k], job.token_logprobs[k])]
        tokens = [piece(t) for t, _, _ in entries]
        offsets = text_offsets(lm.tokenizer, [t for t, _, _ in entries])
        tops = []
        for _, _, top in entries:
            if top is None:
                tops.append(None)
                continue
            best: dict[str, float] = {}
            for t, lp in top:
                best.setdefault(piece(t), lp)   # most probable first: a repeated piece keeps its best
            tops.append(best)
        return {"tokens": tokens, "token_logprobs": [lp for _, lp, _ in entries], "top_logprobs": tops,
                "text_offset": offsets}

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request) -> Any:
        options = check_model(req)
        prompt = req.prompt
        prompts = [prompt] if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)) else list(prompt)
        if not prompts:
            raise ApiError(400, "prompt: give a string, a list of token ids, or a non-empty list of either",
                           param="prompt")
        if len(prompts) > limits.max_prompts:
            raise ApiError(400, f"prompt: at most {limits.max_prompts} prompts per request", param="prompt")
        ids, texts = [], []
        for p in prompts:
            if isinstance(p, str):
                ids.append(token_ids(lm.tokenizer, p))
                texts.append(p)
                continue
            bad = next((t for t in p if not 0 <= t < vocab), None)
            if bad is not None:
                raise ApiError(400, f"prompt: token id {bad} is out of range (the vocabulary has {vocab})",
                               param="prompt")
            ids.append(list(p))
            texts.append(lm.tokenizer.decode(p, skip_special_tokens=True))
        job = job_of(req, options, ids, req.max_tokens, req.logprobs, req.echo)

        def choice(k: int, text: str, reason: str) -> dict:
            head = texts[job.streams[k].prompt] if req.echo else ""
            lps = logprobs_of(job, k, req.echo) if req.logprobs is not None or req.echo else None
            return {"text": head + text, "finish_reason": reason, "logprobs": lps}

        return await respond(job, request, req.stream, req.model or name, "cmpl", "text_completion",
                             "text_completion",
                             lambda text, reason, first: {"text": text, "logprobs": None, "finish_reason": reason},
                             choice)

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest, request: Request) -> Any:
        options = check_model(req)
        tok = lm.tokenizer
        if not getattr(tok, "chat_template", None):
            raise ApiError(400, f"{name}'s tokenizer has no chat template; use /v1/completions")
        try:
            prompt = chat_prompt(tok, [{"role": m.role, "content": m.text()} for m in req.messages], name)
        except Exception as err:   # the template's own refusals (roles out of order, ...)
            raise ApiError(400, f"messages: {type(err).__name__}: {err}", param="messages") from None
        ids = [token_ids(tok, prompt)]
        return await respond(job_of(req, options, ids, req.max_completion_tokens or req.max_tokens), request,
                             req.stream, req.model or name, "chatcmpl",
                             "chat.completion", "chat.completion.chunk",
                             lambda text, reason, first: {"delta": ({"role": "assistant", "content": text} if first
                                                                    else {"content": text} if text else {}),
                                                          "finish_reason": reason},
                             lambda k, text, reason: {"message": {"role": "assistant", "content": text},
                                                      "finish_reason": reason})

    return app


__all__ = ["ApiError", "MAX_ABS_BETA", "ServerLimits", "WARNING_HEADER", "create_app", "parse_alias",
           "parse_spec"]
