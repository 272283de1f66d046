"""`juice serve`: an OpenAI-compatible HTTP server (FastAPI + uvicorn) with per-request steering.

Endpoints: `GET /v1/models`, `POST /v1/completions`, `POST /v1/chat/completions` (both with
`"stream": true`, server-sent events in OpenAI's format), `GET /health`, `GET /metrics`
(Prometheus text format). Steering per request in an extra body field (the official `openai`
client passes it with `extra_body`):

    "juice": {"direction": "context", "method": "juice", "beta_plus": 2, "beta_minus": 0}

The fields, their defaults and their errors are juice's one request protocol
(:mod:`juice.steering_request`, docs/serving.md, "The juice request field"), shared with vLLM's plugin: a
body gets the same status and message from `juice serve` and `juice serve --engine vllm`.
`method` "juice" | "june" | "original" | "prune" (with `heads`); betas default to the heads
file's tuned values for the method (`juice tune`), else 2 and 0 with a warning in the
`X-Juice-Warning` response header (untuned betas can break a small model's text). A request
without a `juice` field gets the operator's default (`juice serve --default SPEC`), else the
tuned steering of the only heads file where that file holds tuned betas, else Original: an
untuned heads file never steers a request that did not ask (issue 38).

Scheduling: one worker thread owns the model (:class:`juice.apps.server.worker.Worker`) and decodes
every running request in one batch, one token per step; a request joins the batch at the next
step and leaves it the step it ends (EOS, a stop string, `max_tokens`), and is answered then
(iteration-level scheduling, :mod:`juice.engine.session`). A request's tokens do not depend on the
others in the batch (tested: joining mid-flight, greedy and seeded sampling, every steering). A
closed connection or an abandoned stream leaves the batch at the next step.

The rooms: :mod:`~juice.apps.server.app` (the routes), :mod:`~juice.apps.server.admission`
(a request's fields, prompt and steering checked, and its :class:`juice.apps.server.worker.Job`),
:mod:`~juice.apps.server.responses` (OpenAI's response and stream shapes, logprobs, text
offsets), :mod:`~juice.apps.server.metrics` (Prometheus); the request bodies are
:mod:`juice.apps.openai_schema`, the worker :mod:`juice.apps.server.worker`.

Admission (:class:`juice.apps.openai_schema.ServerLimits`, docs/serving.md, "Limits"): every field is
checked before a request is queued; errors come in OpenAI's shape
(`{"error": {"message", "type", "param", "code"}}`): 400 for a bad value or what is not
implemented (`logprobs`, `echo`, ...), 404 for a `model` the server does not serve, 429 with
Retry-After past the queue, 504 past the request timeout.
"""

from juice.apps.openai_schema import ServerLimits
from juice.apps.server.admission import ApiError, parse_alias
from juice.apps.server.app import create_app
from juice.apps.server.responses import text_offsets
from juice.steering_request import MAX_ABS_BETA, WARNING_HEADER, parse_spec

__all__ = ["ApiError", "MAX_ABS_BETA", "ServerLimits", "WARNING_HEADER", "create_app", "parse_alias", "parse_spec",
           "text_offsets"]
