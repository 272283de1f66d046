"""The request bodies `juice serve` accepts (OpenAI's completions and chat completions, with
vLLM's `top_k` and `repetition_penalty` and juice's `juice` field), as pydantic models, their
limits, and OpenAI's error shape.

Every value is checked at admission: a wrong type or a value out of range is an HTTP 400 naming
the field; what the server does not implement (`best_of` > 1, presence and frequency penalties,
`logit_bias`, `suffix`, chat `logprobs`, `logprobs` or `echo` with `stream`) is refused with a
400 rather than ignored, vLLM's `use_beam_search` included. vLLM's `vllm_xargs` is read for its
`juice_*` keys, which steer as the `juice` field does (:func:`juice.steering_request.request_fields`).
Other unknown fields are ignored (OpenAI clients send fields of newer API versions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


@dataclass(frozen=True)
class ServerLimits:
    """What `juice serve` admits (docs/serving.md, "Limits"; each a `juice serve` option).

    Attributes:
        max_n: most choices per prompt (`n`; OpenAI allows 128).
        max_prompts: most prompts in one completions request.
        max_rows: most rows in the running batch (a JuICE stream holds two); more streams wait.
        max_queued: most requests waiting to start; past it, HTTP 429 with Retry-After.
        request_timeout_s: a request still running after this long ends with HTTP 504 (a
            stream: an error event); None: no limit.
        max_total_tokens: most prompt + `max_tokens` tokens per prompt; None: the model's context.
        default_max_tokens: `max_tokens` when a request gives none (OpenAI's completions: 16).
        max_request_tokens: most tokens per request: its prompts' tokens plus `n` x `max_tokens`
            for each prompt; None: no limit. `juice serve` sets
            :data:`juice.apps.commands.serve.CPU_MAX_REQUEST_TOKENS` on
            the CPU, where one request of 24k tokens would hold the server for minutes.
    """

    max_n: int = 16
    max_prompts: int = 64
    max_rows: int = 64
    max_queued: int = 256
    request_timeout_s: float | None = 600.0
    max_total_tokens: int | None = None
    default_max_tokens: int = 16
    max_request_tokens: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_n", "max_prompts", "max_rows", "max_queued", "default_max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_request_tokens is not None and self.max_request_tokens < 1:
            raise ValueError(f"max_request_tokens must be at least 1 (None: no limit), got {self.max_request_tokens}")
        if self.request_timeout_s is not None and not self.request_timeout_s > 0:
            raise ValueError(f"request_timeout_s must be > 0, got {self.request_timeout_s}")


MAX_SEED = 2**63 - 1


class _Sampling(BaseModel):
    """The fields both endpoints share."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    n: int = Field(1, ge=1)
    stream: bool = False
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    repetition_penalty: float | None = Field(None, gt=0, le=100)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    juice: Any = None   # checked by juice.steering_request (one message for both servers)
    vllm_xargs: Any = None   # vLLM's extension field: its juice_* keys steer as the `juice` field does
    use_beam_search: Any = None   # vLLM's: refused, not ignored

    def unsupported(self) -> str | None:
        """The first field set to something the server does not implement, as a message."""
        if self.use_beam_search:
            return "use_beam_search is not implemented (juice serve decodes greedily or samples)"
        if self.presence_penalty or self.frequency_penalty:
            return "presence_penalty and frequency_penalty are not implemented (use repetition_penalty)"
        if self.logit_bias:
            return "logit_bias is not implemented"
        return None

    def stops(self) -> list[str]:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return [s for s in stop if s]


class CompletionRequest(_Sampling):
    """POST /v1/completions (OpenAI's legacy completions): a prompt is a string or a list of
    token ids (used as given: no BOS is added), a request holds one or a list of them;
    `max_tokens` 0 only with `echo`; `logprobs` up to 20 (vLLM's limit; OpenAI's is 5)."""

    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(None, ge=0)
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=20)
    best_of: int | None = Field(None, ge=1)
    suffix: str | None = None

    def unsupported(self) -> str | None:
        if self.stream and (self.logprobs is not None or self.echo):
            return "logprobs and echo are not available with stream"
        if self.max_tokens == 0 and not self.echo:
            return "max_tokens: 0 only with echo (the prompt's log-probabilities alone)"
        if self.best_of not in (None, 1):
            return "best_of > 1 is not implemented"
        if self.suffix:
            return "suffix is not implemented"
        return super().unsupported()


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        """The content as text (a list of parts: its text parts joined).

        Raises:
            ValueError: a part that is not text.
        """
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        texts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError(f"message content parts must be text parts, got {str(part)[:80]}")
            texts.append(part["text"])
        return "".join(texts)


class ChatRequest(_Sampling):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)

    def unsupported(self) -> str | None:
        if self.logprobs or self.top_logprobs:
            return "logprobs is not implemented for chat completions (use /v1/completions)"
        return super().unsupported()


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | int | None = None) -> dict:
    """OpenAI's error object: `{"error": {"message", "type", "param", "code"}}`."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def validation_message(errors: list[dict]) -> tuple[str, str | None]:
    """One line (and the field) from pydantic's / FastAPI's validation errors."""
    if not errors:
        return "invalid request", None
    first = errors[0]
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    if first.get("type") == "json_invalid":
        return f"malformed JSON: {first.get('ctx', {}).get('error', first.get('msg'))}", None
    # a union's alternatives are named in loc (e.g. prompt.str); keep the field path
    field = ".".join(x for x in loc if not x[:1].isalpha() or x.split("[")[0] not in
                     ("str", "list", "int", "float", "bool", "dict"))
    if not field:
        return f"the request body must be a JSON object: {first.get('msg')}", None
    return f"{field}: {first.get('msg')}", field.split(".")[0]


__all__ = ["ChatMessage", "ChatRequest", "CompletionRequest", "MAX_SEED", "ServerLimits", "error_body",
           "validation_message"]
