"""`juice serve`'s Prometheus metrics (`GET /metrics`): tokens, requests by outcome, latency,
time to first token, and the worker's queue and batch as gauges."""

from __future__ import annotations

from juice.apps.server.worker import Job, Worker

LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640)
"""Seconds: the buckets of the latency and time-to-first-token histograms."""


class ServerMetrics:
    """One registry per app (tests run several apps in one process)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = registry = CollectorRegistry()
        self.tokens = Counter("juice_generation_tokens", "Tokens generated", registry=registry)
        self.prompt_tokens = Counter("juice_prompt_tokens", "Prompt tokens admitted", registry=registry)
        self.requests = Counter("juice_requests", "Requests ended, by outcome (ok, cancelled, timeout, error, "
                                "rejected_400, rejected_404, rejected_429)", ["outcome"], registry=registry)
        self.latency = Histogram("juice_request_latency_seconds", "Seconds from admission to the last token of "
                                 "requests that ended ok", buckets=LATENCY_BUCKETS, registry=registry)
        self.ttft = Histogram("juice_time_to_first_token_seconds", "Seconds from admission to the first token",
                              buckets=LATENCY_BUCKETS, registry=registry)

    def watch(self, worker: Worker) -> None:
        """Gauges read from `worker` at each scrape."""
        from prometheus_client import Gauge

        r = self.registry
        Gauge("juice_requests_running", "Requests decoding", registry=r).set_function(lambda: worker.running)
        Gauge("juice_requests_waiting", "Requests admitted and not started", registry=r).set_function(
            lambda: worker.waiting)
        Gauge("juice_batch_rows", "Rows of the running batch (a JuICE stream holds two)",
              registry=r).set_function(lambda: worker.session.rows)
        Gauge("juice_generation_tokens_per_second", "Tokens generated per second over the last 10 s",
              registry=r).set_function(worker.tokens_per_second)

    def finished(self, job: Job) -> None:
        """Count a job that has its outcome (the worker's `on_finish`)."""
        self.requests.labels(job.outcome).inc()
        if job.outcome == "ok":
            self.latency.observe(job.finished - job.submitted)
        if job.first_token is not None:
            self.ttft.observe(job.first_token - job.submitted)

    def rejected(self, status: int) -> None:
        """Count a request refused with HTTP `status` (400, 404 and 429 are counted)."""
        if status in (400, 404, 429):
            self.requests.labels(f"rejected_{status}").inc()

    def exposition(self) -> tuple[bytes, str]:
        """(the text format, its content type)."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


__all__ = ["LATENCY_BUCKETS", "ServerMetrics"]
