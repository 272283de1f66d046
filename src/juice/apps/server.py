"""`juice serve`: an OpenAI-compatible HTTP server (FastAPI + uvicorn) with per-request steering.

Endpoints: `GET /v1/models`, `POST /v1/completions`, `POST /v1/chat/completions` (both with
`"stream": true`, server-sent events in OpenAI's format). Steering per request in an extra body
field (the official `openai` client passes it with `extra_body`):

    "juice": {"direction": "context", "method": "juice", "beta_plus": 2, "beta_minus": 0}

`direction` picks one of the heads files the server was started with (by the file's direction,
"parametric" or "context"/"contextual"); absent: the only heads file, or Original when the
server has none. `method` "juice" | "june" | "original" (absent: "juice" if the server has
heads); betas default to the heads file's tuned values for the method (`juice tune`), else 2
and 0; a beta must be a finite number with |beta| <= 100 (`MAX_ABS_BETA`).

One worker thread owns the model: requests that arrive together (within `batch_window_s`) are
decoded in one batched :func:`juice.decoding.generate` call, whatever their steering; each
stream has its own sampler, so a request's output does not depend on the rest of its batch
(tested: alone and among 15 others, the same greedy tokens). Streaming requests are decoded one
at a time by the same worker. Texts are cut at EOS and before the first stop string.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from juice.data.records import Direction
from juice.decoding import Stream, generate
from juice.sampling import Sampling
from juice.interventions import HeadSelection
from juice.models import LoadedModel
from juice.steerer import cut_at_stop
from juice.steering import ORIGINAL, JuICE, JuNE, Steering

DIRECTIONS = {"parametric": Direction.PARAMETRIC, "memory": Direction.PARAMETRIC, "context": Direction.CONTEXTUAL,
              "contextual": Direction.CONTEXTUAL}
"""The names a request's `juice.direction` may use (:meth:`juice.data.records.Direction.parse`)."""


@dataclass
class _Job:
    prompts: list[str]
    streams: list[Stream]          # prompt indices local to the job
    max_new_tokens: int
    stop: list[str]
    stream: bool = False
    done: threading.Event = field(default_factory=threading.Event)
    result: list[list[int]] | None = None
    error: BaseException | None = None
    tokens: queue.Queue = field(default_factory=queue.Queue)   # streaming: token ids, then None


class Engine:
    """The worker that owns the model and batches the jobs that arrive together."""

    def __init__(self, lm: LoadedModel, batch_window_s: float = 0.01, max_rows: int | str = 64):
        self.lm, self.window, self.max_rows = lm, batch_window_s, max_rows
        self.jobs: queue.Queue[_Job] = queue.Queue()
        self.batch_sizes: list[int] = []   # jobs per batched call, for the record (and tests)
        threading.Thread(target=self._loop, daemon=True).start()

    def submit(self, job: _Job) -> _Job:
        self.jobs.put(job)
        return job

    def _loop(self) -> None:
        while True:
            first = self.jobs.get()
            if first.stream:
                self._run_stream(first)
                continue
            batch, deadline = [first], time.monotonic() + self.window
            while True:
                try:
                    job = self.jobs.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if job.stream:
                    self.jobs.put(job)   # after this batch
                    break
                batch.append(job)
            self._run_batch(batch)

    def _run_batch(self, batch: list[_Job]) -> None:
        self.batch_sizes.append(len(batch))
        prompts: list[str] = []
        streams: list[Stream] = []
        for job in batch:
            base = len(prompts)
            prompts += job.prompts
            streams += [replace(s, prompt=base + s.prompt) for s in job.streams]
        try:
            gen = generate(self.lm, prompts, streams, max(j.max_new_tokens for j in batch), max_rows=self.max_rows,
                           stop_at_eos=True)
            rows = gen.tokens.tolist()
            at = 0
            for job in batch:
                job.result = [r[: job.max_new_tokens] for r in rows[at: at + len(job.streams)]]
                at += len(job.streams)
        except BaseException as err:   # every job of the batch learns why
            for job in batch:
                job.error = err
        for job in batch:
            job.done.set()

    def _run_stream(self, job: _Job) -> None:
        try:
            generate(self.lm, job.prompts, job.streams, job.max_new_tokens, stop_at_eos=True,
                     on_token=lambda rows, tokens: job.tokens.put(int(tokens[0])))
        except BaseException as err:
            job.error = err
        job.tokens.put(None)
        job.done.set()


MAX_ABS_BETA = 100.0
"""Largest |beta| a request may ask for (the paper's grids stay within 5); far beyond, head
outputs swamp the residual stream and the output is noise."""


def _heads_direction(artifact) -> str:
    return DIRECTIONS.get(str(artifact.direction), str(artifact.direction))


def create_app(lm: LoadedModel, heads: Sequence[Any] = (), *, model_name: str | None = None,
               batch_window_s: float = 0.01, max_rows: int | str = 64):
    """The FastAPI app (module docstring).

    Args:
        lm: the model.
        heads: heads artifacts (:func:`juice.load_heads`), at most one per direction.

    Raises:
        ValueError: two heads files for the same direction.
    """
    from fastapi import FastAPI, HTTPException
    from fastapi.responses import StreamingResponse

    by_direction: dict[str, HeadSelection] = {}
    tuned: dict[str, dict] = {}
    for artifact in heads:
        d = _heads_direction(artifact)
        if d in by_direction:
            raise ValueError(f"two heads files for the {d} direction")
        by_direction[d] = artifact.selection
        tuned[d] = dict(getattr(artifact, "tuned", {}) or {})
    name = model_name or lm.name
    engine = Engine(lm, batch_window_s, max_rows)
    app = FastAPI(title="juice", description="OpenAI-compatible completions with per-request head steering")
    app.state.engine = engine

    @app.exception_handler(HTTPException)
    async def openai_error(request, exc: HTTPException):   # the shape OpenAI clients read
        from fastapi.responses import JSONResponse

        return JSONResponse(status_code=exc.status_code, content={"error": {
            "message": str(exc.detail), "type": "invalid_request_error", "param": None, "code": None}})

    def steering_of(options: dict | None) -> Steering:
        options = dict(options or {})
        method = options.get("method", "juice" if by_direction else "original")
        if method == "original":
            return ORIGINAL
        if method not in ("juice", "june"):
            raise HTTPException(400, f"juice.method must be juice, june or original, not {method!r}")
        direction = options.get("direction")
        if direction is None:
            if len(by_direction) != 1:
                raise HTTPException(400, f"say juice.direction: this server has heads for {sorted(by_direction) or 'none'}")
            d = next(iter(by_direction))
        else:
            d = DIRECTIONS.get(str(direction))
            if d not in by_direction:
                raise HTTPException(400, f"no heads for direction {direction!r}; this server has {sorted(by_direction)}")
        selection, defaults = by_direction[d], tuned[d].get(method, {})
        try:
            bp = float(options.get("beta_plus", defaults.get("beta_plus", 2.0)))
            bm = float(options.get("beta_minus", defaults.get("beta_minus", 0.0)))
        except (TypeError, ValueError):
            raise HTTPException(400, "juice.beta_plus and juice.beta_minus must be numbers") from None
        if not (abs(bp) <= MAX_ABS_BETA and abs(bm) <= MAX_ABS_BETA):   # also refuses NaN and infinities
            raise HTTPException(400, f"juice.beta_plus and juice.beta_minus must be finite with |beta| <= {MAX_ABS_BETA:g}")
        return (JuICE if method == "juice" else JuNE)(lm, selection, bp, bm)

    def sampling_of(body: dict, index: int) -> Sampling | None:
        temperature = body.get("temperature", 1.0)
        if temperature is None or float(temperature) <= 0:
            return None
        seed = body.get("seed")
        seed = int.from_bytes(os.urandom(4), "little") if seed is None else int(seed)
        try:
            return Sampling(float(temperature), int(body.get("top_k", 0) or 0), float(body.get("top_p", 1.0) or 1.0),
                            seed + index)
        except ValueError as err:
            raise HTTPException(400, str(err)) from None

    def job_of(body: dict, prompts: list[str]) -> _Job:
        steering = steering_of(body.get("juice"))
        n = int(body.get("n", 1) or 1)
        try:
            penalty = float(body.get("repetition_penalty", 1.0) or 1.0)
            streams = [Stream(i, steering, sampling_of(body, k), penalty) for i in range(len(prompts)) for k in range(n)]
        except (TypeError, ValueError) as err:
            raise HTTPException(400, f"repetition_penalty: {err}") from None
        stop = body.get("stop") or []
        stop = [stop] if isinstance(stop, str) else list(stop)
        max_new = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        if max_new < 1:
            raise HTTPException(400, "max_tokens must be at least 1")
        return _Job(prompts, streams, max_new, stop, stream=bool(body.get("stream")))

    def text_of(tokens: list[int], stop: list[str]) -> tuple[str, str]:
        eos = lm.tokenizer.eos_token_id
        reason = "length"
        if eos is not None and eos in tokens:
            tokens, reason = tokens[: tokens.index(eos)], "stop"
        text = lm.tokenizer.decode(tokens, skip_special_tokens=True)
        cut = cut_at_stop(text, stop)
        return cut, ("stop" if cut != text else reason)

    async def finished(job: _Job) -> _Job:
        await asyncio.to_thread(job.done.wait)
        if job.error is not None:
            raise HTTPException(400, f"{type(job.error).__name__}: {job.error}")
        return job

    def sse(job: _Job, make_chunk):
        async def events():
            ids: list[int] = []
            shown = ""
            eos = lm.tokenizer.eos_token_id
            while True:
                token = await asyncio.to_thread(job.tokens.get)
                if token is None or token == eos:
                    break
                ids.append(token)
                text = cut_at_stop(lm.tokenizer.decode(ids, skip_special_tokens=True), job.stop)
                if len(text) > len(shown) and not text.endswith("\ufffd"):
                    yield f"data: {json.dumps(make_chunk(text[len(shown):], None))}\n\n"
                    shown = text
            await asyncio.to_thread(job.done.wait)
            if job.error is not None:
                yield f"data: {json.dumps({'error': {'message': str(job.error)}})}\n\n"
            yield f"data: {json.dumps(make_chunk('', 'stop' if token is not None else 'length'))}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def respond(job: Any, prefix: str, kind: str, chunk_kind: str,
                      chunk_choice: Callable[[str, str | None], dict], choice: Callable[[str, str], dict]) -> Any:
        """The OpenAI response to `job`: a stream of `chunk_kind` chunks (one prompt, n = 1), or
        one `kind` object with a choice per stream; `chunk_choice` / `choice` shape a choice from
        its text and finish reason."""
        rid, created = f"{prefix}-{uuid.uuid4().hex[:24]}", int(time.time())
        if job.stream:
            if len(job.streams) != 1:
                raise HTTPException(400, "stream: one prompt and n = 1")
            engine.submit(job)
            return sse(job, lambda text, reason: {"id": rid, "object": chunk_kind, "created": created, "model": name,
                                                  "choices": [{"index": 0, **chunk_choice(text, reason)}]})
        job = await finished(engine.submit(job))
        choices = [{"index": i, **choice(*text_of(tokens, job.stop))} for i, tokens in enumerate(job.result)]
        return {"id": rid, "object": kind, "created": created, "model": name, "choices": choices}

    @app.get("/v1/models")
    def models() -> dict:
        return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "juice"}]}

    @app.post("/v1/completions")
    async def completions(body: dict) -> Any:
        prompt = body.get("prompt")
        prompts = [prompt] if isinstance(prompt, str) else list(prompt or [])
        if not prompts or not all(isinstance(p, str) for p in prompts):
            raise HTTPException(400, "prompt must be a string or a list of strings")
        return await respond(job_of(body, prompts), "cmpl", "text_completion", "text_completion",
                             lambda text, reason: {"text": text, "finish_reason": reason},
                             lambda text, reason: {"text": text, "finish_reason": reason, "logprobs": None})

    @app.post("/v1/chat/completions")
    async def chat(body: dict) -> Any:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise HTTPException(400, "messages must be a non-empty list")
        tok = lm.tokenizer
        if not getattr(tok, "chat_template", None):
            raise HTTPException(400, f"{name}'s tokenizer has no chat template; use /v1/completions")
        prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        if tok.bos_token and prompt.startswith(tok.bos_token):
            prompt = prompt[len(tok.bos_token):]   # the tokenizer adds its own
        return await respond(job_of(body, [prompt]), "chatcmpl", "chat.completion", "chat.completion.chunk",
                             lambda text, reason: {"delta": {"content": text} if text else {}, "finish_reason": reason},
                             lambda text, reason: {"message": {"role": "assistant", "content": text},
                                                   "finish_reason": reason})

    return app


__all__ = ["DIRECTIONS", "Engine", "create_app"]
