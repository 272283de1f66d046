"""OpenAI's response shapes for `juice serve`: one response object or a stream of server-sent
event chunks per job, finish reasons, `usage`, the legacy `logprobs` object with its text
offsets, and the error of a job that timed out or failed."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

from juice.apps.server.worker import Job, QueueFull, Worker
from juice.apps.openai_schema import error_body
from juice.apps.server.admission import ApiError
from juice.completion_text import TextStream, final_text
from juice.steering_request import WARNING_HEADER


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


def usage(job: Job) -> dict:
    """OpenAI's `usage` of a finished job."""
    prompt = sum(map(len, job.prompt_ids))
    completion = sum(map(len, job.tokens))
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def outcome_error(job: Job) -> ApiError | None:
    """The HTTP error of a job that timed out (504) or failed (500), else None."""
    if job.outcome == "timeout":
        return ApiError(504, job.error or "timeout", "timeout_error", code="timeout")
    if job.outcome == "error":
        return ApiError(500, job.error or "error", "server_error")
    return None


def warning_header(job: Job) -> dict[str, str]:
    """The job's steering warning as a response header (:data:`juice.steering_request.WARNING_HEADER`)."""
    return {} if job.warning is None else {WARNING_HEADER: job.warning}


class Responder:
    """Submits jobs to the worker and answers them in OpenAI's shapes.

    Args:
        tokenizer: decodes the tokens.
        worker: the worker (:class:`juice.apps.server.worker.Worker`).
    """

    def __init__(self, tokenizer, worker: Worker):
        self.tokenizer, self.worker = tokenizer, worker

    def text_of(self, job: Job, k: int) -> tuple[str, str]:
        """Stream k's final text (:func:`juice.completion_text.final_text`) and finish reason."""
        return final_text(self.tokenizer, job.tokens[k], job.stop), job.reasons[k] or "length"

    def logprobs_of(self, job: Job, k: int, echo: bool) -> dict:
        """OpenAI's legacy `logprobs` object of stream k: the prompt's tokens first if `echo` (the
        first with null), then every new token (EOS included when it ended there, as the text
        is not: a caller that drops the last token, as lm-evaluation-harness does, drops it).
        `text_offset`: see :func:`text_offsets`."""
        piece = lambda t: self.tokenizer.decode([t])   # noqa: E731
        entries: list[tuple[int, float | None, tuple | None]] = []
        if echo:
            ids = job.prompt_ids[job.streams[k].prompt]
            entries.append((ids[0], None, None))
            entries += [(t, lp, top) for t, (lp, top) in zip(ids[1:], job.prompt_logprobs[job.streams[k].prompt])]
        entries += [(t, lp, top) for t, (lp, top) in zip(job.tokens[k], job.token_logprobs[k])]
        tokens = [piece(t) for t, _, _ in entries]
        offsets = text_offsets(self.tokenizer, [t for t, _, _ in entries])
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

    def submit(self, job: Job) -> None:
        """Queue `job`.

        Raises:
            ApiError: 429 with Retry-After when the queue is full.
        """
        try:
            self.worker.submit(job)
        except QueueFull as err:
            raise ApiError(429, f"the server is busy: {err}; retry later", "rate_limit_error", None,
                           "rate_limit_exceeded", {"Retry-After": "1"}) from None

    async def watch_disconnect(self, request, job: Job) -> None:
        """Cancel `job` when the client closes the connection."""
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                self.worker.cancel(job)
                return

    async def respond(self, job: Job, request, stream: bool, model: str, prefix: str, kind: str,
                      chunk_kind: str, chunk_choice: Callable[[str, str | None, bool], dict],
                      choice: Callable[[int, str, str], dict]) -> Any:
        """The OpenAI response to `job`: a stream of `chunk_kind` chunks, or one `kind` object
        with a choice per stream; `chunk_choice` (text, finish reason, first chunk?) and `choice`
        (stream index, text, finish reason) shape a choice. A closed connection cancels the job
        (HTTP 499 without a stream)."""
        from fastapi.responses import JSONResponse, Response, StreamingResponse

        rid, created = f"{prefix}-{uuid.uuid4().hex[:24]}", int(time.time())
        loop = asyncio.get_running_loop()
        if not stream:
            done = asyncio.Event()
            job.on_done = lambda: loop.call_soon_threadsafe(done.set)
            self.submit(job)
            watcher = asyncio.create_task(self.watch_disconnect(request, job))
            try:
                await done.wait()
            finally:
                watcher.cancel()
            if job.outcome == "cancelled":
                return Response(status_code=499)
            if (err := outcome_error(job)) is not None:
                raise err
            choices = [{"index": k, **choice(k, *self.text_of(job, k))} for k in range(len(job.streams))]
            return JSONResponse({"id": rid, "object": kind, "created": created, "model": model, "choices": choices,
                                 "usage": usage(job)}, headers=warning_header(job))
        tokens: asyncio.Queue = asyncio.Queue()
        job.on_token = lambda k, t: loop.call_soon_threadsafe(tokens.put_nowait, (k, t))
        job.on_done = lambda: loop.call_soon_threadsafe(tokens.put_nowait, None)
        self.submit(job)

        def chunk(k: int, text: str, reason: str | None, first: bool = False) -> str:
            body = {"id": rid, "object": chunk_kind, "created": created, "model": model,
                    "choices": [{"index": k, **chunk_choice(text, reason, first)}]}
            return f"data: {json.dumps(body)}\n\n"

        async def events():
            watcher = asyncio.create_task(self.watch_disconnect(request, job))
            texts = [TextStream(self.tokenizer, job.stop) for _ in job.streams]
            try:
                for k in range(len(job.streams)):
                    yield chunk(k, "", None, first=True)
                while (item := await tokens.get()) is not None:
                    k, token = item
                    if piece := texts[k].add(token):
                        yield chunk(k, piece, None)
                if job.outcome == "ok":
                    for k in range(len(job.streams)):
                        text, reason = self.text_of(job, k)
                        yield chunk(k, texts[k].rest(text), reason)
                elif (err := outcome_error(job)) is not None:
                    yield f"data: {json.dumps(error_body(err.message, err.kind, code=err.code))}\n\n"
                yield "data: [DONE]\n\n"
            finally:
                watcher.cancel()
                if job.outcome is None:
                    self.worker.cancel(job)

        return StreamingResponse(events(), media_type="text/event-stream", headers=warning_header(job))


__all__ = ["Responder", "outcome_error", "text_offsets", "usage", "warning_header"]
