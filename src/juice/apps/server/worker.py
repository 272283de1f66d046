"""The worker behind `juice serve`: one thread owns the model and runs a
:class:`juice.engine.DecodingSession`, so requests join the running batch at the next
decoding step and leave it the step they finish (iteration-level scheduling).

A :class:`Job` is one HTTP request: one stream per (prompt, choice). The HTTP layer submits
jobs and cancels them (a closed connection, a timeout); the worker, between two steps, adds the
new jobs' streams, drops the cancelled ones, runs one step, and hands each token to its job
(`on_token`, for streaming) and each finished job to `on_done`. A stream ends at EOS, at
`max_new_tokens`, or the step its text holds a stop string.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from juice.engine import DecodingSession
from juice.engine import Stream
from juice.models import LoadedModel
from juice.completion_text import cut_at_stop


class QueueFull(Exception):
    """The worker already holds `max_queued` requests that have not started (HTTP 429)."""


@dataclass
class Job:
    """One request: `streams[k]` decodes `prompt_ids[streams[k].prompt]`.

    Attributes:
        tokens: per stream, its new token ids (EOS included when it ended there).
        reasons: per stream, why it ended: "stop" (EOS or a stop string), "length", or None.
        outcome: None while running; "ok", "cancelled", "timeout" or "error" (then `error` says why).
        on_token: called from the worker with (stream index, token id) after every step.
        on_done: called from the worker once, when the job has an outcome.
        logprobs: per new token, its log-probability and the `logprobs` most probable tokens'
            (`token_logprobs[k]`: (log-probability, ((token id, log-probability), ...)) per
            token of stream k; :class:`juice.engine.StepToken`); None: none.
        echo: fill `prompt_logprobs[i]`, prompt i's teacher-forced log-probabilities under the
            job's steering, from the engine's own prefill (:attr:`juice.engine.StepToken.prompt_logprobs`);
            with `max_new_tokens` 0 the job ends at the prefill, its first token dropped.
        warning: a line for the client about the job's steering (untuned betas), or None.
    """

    prompt_ids: list[list[int]]
    streams: list[Stream]
    max_new_tokens: int
    stop: list[str] = field(default_factory=list)
    timeout_s: float | None = None
    on_token: Callable[[int, int], None] | None = None
    on_done: Callable[[], None] | None = None
    logprobs: int | None = None
    echo: bool = False
    warning: str | None = None
    id: int = 0
    tokens: list[list[int]] = field(default_factory=list)
    token_logprobs: list[list[tuple[float, tuple]]] = field(default_factory=list)
    prompt_logprobs: list[list[tuple[float, tuple]]] = field(default_factory=list)
    reasons: list[str | None] = field(default_factory=list)
    outcome: str | None = None
    error: str | None = None
    submitted: float = 0.0
    first_token: float | None = None
    finished: float | None = None
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def started(self) -> bool:
        return self.first_token is not None


class Worker:
    """The worker thread (module docstring).

    Args:
        lm: the model.
        max_rows: most rows in the running batch (a JuICE stream holds two); streams that do not
            fit wait, in order of arrival.
        max_queued: most requests submitted but not started; past it :meth:`submit` raises
            :class:`QueueFull`.
        on_step: called after every step with the number of tokens it produced (metrics).
        on_finish: called with every job that got its outcome (metrics).
    """

    def __init__(self, lm: LoadedModel, max_rows: int = 64, max_queued: int = 256,
                 on_step: Callable[[int], None] | None = None, on_finish: Callable[[Job], None] | None = None):
        self.lm, self.max_rows, self.max_queued = lm, max_rows, max_queued
        self.on_step, self.on_finish = on_step, on_finish
        self.session = DecodingSession(lm)
        self._cond = threading.Condition()
        self._inbox: list[Job] = []
        self._cancels: list[tuple[Job, str, str | None]] = []
        self._jobs: dict[int, Job] = {}
        self._next_id = 0
        self._recent: deque[tuple[float, int]] = deque()   # (time, tokens) of the last steps
        self.peak_streams = 0                              # most streams in one step (tests, benchmarks)
        self.steps = 0
        self._thread = threading.Thread(target=self._loop, daemon=True, name="juice-worker")
        self._thread.start()

    # -- the HTTP layer's side (any thread) ---------------------------------------------------

    def submit(self, job: Job) -> Job:
        """Queue `job` for the next step.

        Raises:
            QueueFull: `max_queued` requests are waiting already.
        """
        with self._cond:
            if self.waiting >= self.max_queued:
                raise QueueFull(f"{self.waiting} requests are waiting (the limit is {self.max_queued})")
            self._next_id += 1
            job.id, job.submitted = self._next_id, time.monotonic()
            job.tokens = [[] for _ in job.streams]
            job.token_logprobs = [[] for _ in job.streams]
            job.reasons = [None] * len(job.streams)
            self._inbox.append(job)
            self._cond.notify()
        return job

    def cancel(self, job: Job, outcome: str = "cancelled", error: str | None = None) -> None:
        """Remove `job`'s streams from the batch at the next step (no-op once it finished)."""
        with self._cond:
            if job.outcome is None:
                self._cancels.append((job, outcome, error))
                self._cond.notify()

    @property
    def waiting(self) -> int:
        """Requests submitted and not started (no token yet)."""
        with self._cond:
            return len(self._inbox) + sum(not j.started for j in self._jobs.values())

    @property
    def running(self) -> int:
        """Requests with at least one token and no outcome yet."""
        with self._cond:
            return sum(j.started for j in self._jobs.values())

    def tokens_per_second(self, window_s: float = 10.0) -> float:
        """Tokens produced per second over the last `window_s` seconds."""
        now = time.monotonic()
        recent = [(t, n) for t, n in list(self._recent) if now - t <= window_s]
        return sum(n for _, n in recent) / window_s

    @property
    def alive(self) -> bool:
        """Whether the worker thread runs."""
        return self._thread.is_alive()

    def reset_peak(self) -> None:
        self.peak_streams = 0

    # -- the worker ---------------------------------------------------------------------------

    def _finish(self, job: Job, outcome: str, error: str | None = None) -> None:
        with self._cond:
            self._jobs.pop(job.id, None)
        job.outcome, job.error, job.finished = outcome, error, time.monotonic()
        if self.on_finish:
            self.on_finish(job)
        job.done.set()
        if job.on_done:
            job.on_done()

    def _stop_rule(self, job: Job) -> Callable[[list[int]], bool] | None:
        if not job.stop:
            return None
        decode = self.lm.tokenizer.decode

        def hit(tokens: list[int]) -> bool:
            text = decode(tokens, skip_special_tokens=True)
            return cut_at_stop(text, job.stop) != text

        return hit

    def _admit(self, job: Job) -> None:
        with self._cond:
            self._jobs[job.id] = job
        rule = self._stop_rule(job)
        try:
            if job.echo:   # read from each stream's prefill, with its first token
                job.prompt_logprobs = [[] for _ in job.prompt_ids]
            for k, stream in enumerate(job.streams):   # max_new_tokens 0 (echo only): the prefill's token is dropped
                self.session.add((job.id, k), job.prompt_ids[stream.prompt], stream, max(1, job.max_new_tokens),
                                 rule, job.logprobs, question_ids=None if stream.question is None
                                 else job.prompt_ids[stream.question],
                                 instructed_ids=None if stream.instructed is None
                                 else job.prompt_ids[stream.instructed],
                                 prompt_logprobs=(job.logprobs or 0) if job.echo else None)
        except Exception as err:   # the job learns why; the worker goes on
            for k in range(len(job.streams)):
                self.session.cancel((job.id, k))
            self._finish(job, "error", f"{type(err).__name__}: {err}")

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._inbox and not self._cancels and self.session.idle:
                    self._cond.wait()
                inbox, self._inbox = self._inbox, []
                cancels, self._cancels = self._cancels, []
            for job in inbox:
                self._admit(job)
            now = time.monotonic()
            cancels += [(j, "timeout", f"the request took longer than {j.timeout_s:g} s")
                        for j in self._jobs.values() if j.timeout_s is not None and now - j.submitted > j.timeout_s]
            for job, outcome, error in cancels:
                if job.outcome is None and job.id in self._jobs:
                    for k in range(len(job.streams)):
                        self.session.cancel((job.id, k))
                    self._finish(job, outcome, error)
            if self.session.idle:
                continue
            try:
                events = self.session.step(self.max_rows)
            except Exception as err:   # every job in the batch learns why; the worker goes on
                for job in list(self._jobs.values()):
                    self._finish(job, "error", f"{type(err).__name__}: {err}")
                self.session = DecodingSession(self.lm)
                continue
            self.steps += 1
            self.peak_streams = max(self.peak_streams, len(events))
            now = time.monotonic()
            self._recent.append((now, len(events)))
            while self._recent and now - self._recent[0][0] > 60:
                self._recent.popleft()
            if self.on_step:
                self.on_step(len(events))
            for event in events:
                job_id, k = event.key
                job = self._jobs.get(job_id)
                if job is None:
                    continue
                if job.first_token is None:
                    job.first_token = now
                if event.prompt_logprobs is not None:
                    job.prompt_logprobs[job.streams[k].prompt] = list(event.prompt_logprobs)
                if job.max_new_tokens == 0:   # echo only: the prompt's log-probabilities were all it asked for
                    job.reasons[k] = "length"
                    if all(r is not None for r in job.reasons):
                        self._finish(job, "ok")
                    continue
                job.tokens[k].append(event.token)
                if event.logprob is not None:
                    job.token_logprobs[k].append((event.logprob, event.top))
                if job.on_token:
                    job.on_token(k, event.token)
                if event.finished:
                    job.reasons[k] = "length" if event.finished == "length" else "stop"
                    if all(r is not None for r in job.reasons):
                        self._finish(job, "ok")


__all__ = ["Job", "QueueFull", "Worker"]
