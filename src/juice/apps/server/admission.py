"""A request admitted by `juice serve`: its model name (or alias), its prompt, its steering
(:mod:`juice.steering_request`) and its sampling checked, and its :class:`juice.apps.server.worker.Job`
built; every refusal an :class:`ApiError` in OpenAI's shape."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from juice.apps.server.worker import Job
from juice.apps.openai_schema import MAX_SEED, ServerLimits
from juice.baselines.prompt import instructed_request
from juice.completion_text import chat_prompt, instructed_messages, question_messages
from juice.engine import Choice, Stream
from juice.models import LoadedModel
from juice.engine.sampling import Sampling
from juice.methods import TUNED_STEERINGS
from juice.steering import DEFAULT_BETAS, Steering
from juice.steering_request import (ServedHeads, SteeringAsk, SteeringRequestError, juice_fields, parse_spec,
                                    request_fields, steering_ask)
from juice.tokens import context_length, token_ids


class ApiError(Exception):
    """An HTTP error in OpenAI's shape."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                 code: str | int | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code
        self.headers = headers


def parse_alias(text: str) -> tuple[str, dict[str, Any]]:
    """`NAME=SPEC` (`juice serve --alias`), SPEC as :func:`juice.steering_request.parse_spec`
    reads it, e.g. `gemma+juice=direction:contextual,method:juice,beta_plus:2` -> ("gemma+juice",
    {"direction": "contextual", "method": "juice", "beta_plus": 2.0}).

    Raises:
        ValueError: no `=`, an empty name, or a pair without `:` (the message quotes it).
    """
    name, sep, spec = text.partition("=")
    if not sep or not name.strip():
        raise ValueError(f"--alias {text!r}: write NAME=key:value,key:value")
    return name.strip(), parse_spec(spec, f"--alias {text!r}")


class Admission:
    """What `juice serve` admits (module docstring).

    Args:
        lm: the model.
        served: the heads files and the operator's default.
        limits: the server's limits.
        name: the served model's name.
        aliases: more model names, each with the `juice` options its requests get.
        on_prompt_tokens: called with the prompt tokens of each admitted job (metrics).

    Raises:
        ValueError: an alias that is the model's name, or an alias or default whose options the
            server cannot honour (the message says which and why).
    """

    def __init__(self, lm: LoadedModel, served: ServedHeads, limits: ServerLimits, name: str,
                 aliases: Mapping[str, Mapping[str, Any]], on_prompt_tokens: Callable[[int], None] = lambda n: None):
        self.lm, self.served, self.limits, self.name = lm, served, limits, name
        self.on_prompt_tokens = on_prompt_tokens
        if name in aliases:
            raise ValueError(f"alias {name!r} is the served model's own name")
        self.context = limits.max_total_tokens or context_length(lm)
        self.vocab = lm.model.get_output_embeddings().weight.shape[0]
        self.aliases: dict[str, dict[str, Any]] = {}
        given = [*aliases.items(), *([("--default", served.default)] if served.default is not None else [])]
        for alias, options in given:   # read and checked once, at start: a request merges them unread
            label = alias if alias == "--default" else f"alias {alias!r}"
            try:
                fields = juice_fields(options)
                self.steering(fields or {"method": "original"})
            except SteeringRequestError as err:
                raise ValueError(f"{label}: {err}") from None
            except ApiError as err:
                raise ValueError(f"{label}: {err.message}") from None
            if alias != "--default":
                self.aliases[alias] = fields

    @property
    def model_names(self) -> list[str]:
        return [self.name, *self.aliases]

    def heads_view(self) -> dict[str, Any]:
        """What `GET /v1/models` adds to each model under `juice` (an extra field OpenAI's clients
        ignore; the playground at `/` draws it): the model's head grid and, per direction a heads
        file serves, the heads JuNE and JuICE steer and the betas they were tuned to.

        Returns:
            `{"layers": n_layers, "heads_per_layer": n_heads, "default_betas": {"beta_plus": 2.0,
            "beta_minus": 0.0}, "directions": {direction: {"positive": ["L6H3", ...], "negative":
            [...], "tuned": {method: {"beta_plus": b, "beta_minus": b}}}}}`; directions
            "parametric" | "contextual"; `positive` heads get beta+, `negative` beta- (paper Alg.
            1); `tuned` holds only the methods ("juice", "june") the file has tuned betas for
            (:class:`juice.tuned.TunedSettings`); `default_betas` are what a request asking for
            one of them without betas gets elsewhere (:data:`juice.steering.DEFAULT_BETAS`).
        """
        geometry = self.lm.geometry
        directions = {}
        for direction, selection in sorted(self.served.selections.items()):
            tuned = self.served.tuned_of(direction)
            directions[direction] = {
                "positive": [str(h) for h in selection.positive], "negative": [str(h) for h in selection.negative],
                "tuned": {m: {"beta_plus": b.beta_plus, "beta_minus": b.beta_minus}
                          for m in TUNED_STEERINGS if (b := tuned.betas(m)) is not None}}
        plus, minus = DEFAULT_BETAS
        return {"layers": geometry.n_layers, "heads_per_layer": geometry.n_heads,
                "default_betas": {"beta_plus": plus, "beta_minus": minus}, "directions": directions}

    def steering(self, options: Mapping[str, Any] | None) -> tuple[Steering, Choice | None, SteeringAsk]:
        """The steering a request's `juice` options (:meth:`options`: fields already read, `{}` or
        None for none) ask for (:func:`juice.steering_request.steering_ask`), auto's choice (None
        otherwise; a malformed policy is refused here), and the checked request (its warning,
        auto's question), each made once: the job takes them as they are.

        Raises:
            ApiError: 400 with the protocol's one-line message.
        """
        try:
            ask = steering_ask(options or {}, self.served)
            recipe = ask.build(self.lm.geometry, self.served).method   # the registry builds it (juice.methods)
            return recipe.steering, recipe.choice, ask
        except SteeringRequestError as err:
            raise ApiError(400, str(err), param="juice") from None

    def options(self, req) -> dict:
        """The request's `juice` options: its model's (an alias's) overridden key by key by its own field.

        Raises:
            ApiError: 404 for a model the server does not serve; 400 for a field it does not
                implement, a `juice` value that is not an object of known fields, or an unknown
                `juice_*` key in `vllm_xargs` (whose `juice_*` keys override the `juice` field's,
                as in vLLM).
        """
        if req.model is not None and req.model != self.name and req.model not in self.aliases:
            raise ApiError(404, f"The model `{req.model}` does not exist. This server serves "
                                f"{', '.join(self.model_names)} (GET /v1/models).", "invalid_request_error", "model",
                           "model_not_found")
        if message := req.unsupported():
            raise ApiError(400, message)
        if req.vllm_xargs is not None and not isinstance(req.vllm_xargs, dict):
            raise ApiError(400, "vllm_xargs must be an object", param="vllm_xargs")
        extra = {k: v for k, v in (req.vllm_xargs or {}).items() if k.startswith("juice_")}
        if req.juice is not None:
            extra["juice"] = req.juice
        try:
            own = request_fields(extra) or {}   # the object, its keys overridden by the flat ones
        except SteeringRequestError as err:
            raise ApiError(400, str(err), param="juice") from None
        return {**self.aliases.get(req.model, {}), **own}

    def completion_prompts(self, req) -> tuple[list[list[int]], list[str]]:
        """A completions request's prompts as token ids (BOS added to text) and as text.

        Raises:
            ApiError: 400 for no prompt, too many, or a token id outside the vocabulary.
        """
        prompt = req.prompt
        prompts = [prompt] if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)) else list(prompt)
        if not prompts:
            raise ApiError(400, "prompt: give a string, a list of token ids, or a non-empty list of either",
                           param="prompt")
        if len(prompts) > self.limits.max_prompts:
            raise ApiError(400, f"prompt: at most {self.limits.max_prompts} prompts per request", param="prompt")
        ids, texts = [], []
        for p in prompts:
            if isinstance(p, str):
                ids.append(token_ids(self.lm.tokenizer, p))
                texts.append(p)
                continue
            bad = next((t for t in p if not 0 <= t < self.vocab), None)
            if bad is not None:
                raise ApiError(400, f"prompt: token id {bad} is out of range (the vocabulary has {self.vocab})",
                               param="prompt")
            ids.append(list(p))
            texts.append(self.lm.tokenizer.decode(p, skip_special_tokens=True))
        return ids, texts

    def chat_ids(self, req) -> list[int]:
        """A chat request's prompt (:func:`juice.completion_text.chat_prompt`) as token ids.

        Raises:
            ApiError: 400 for a tokenizer without a chat template, or the template's refusal.
        """
        tok = self.lm.tokenizer
        if not getattr(tok, "chat_template", None):
            raise ApiError(400, f"{self.name}'s tokenizer has no chat template; use /v1/completions")
        try:
            prompt = chat_prompt(tok, [{"role": m.role, "content": m.text()} for m in req.messages], self.name)
        except Exception as err:   # the template's own refusals (roles out of order, ...)
            raise ApiError(400, f"messages: {type(err).__name__}: {err}", param="messages") from None
        return token_ids(tok, prompt)

    def question_ids(self, req, question: str) -> list[int]:
        """auto's question-only prompt: for a chat request, the chat template applied to its
        messages with the last user message's content replaced by `question`
        (:func:`juice.completion_text.question_messages`); for a completion, `question` itself.

        Raises:
            ApiError: 400 for a chat without a user message or a template's refusal.
        """
        if getattr(req, "messages", None) is None:
            return token_ids(self.lm.tokenizer, question)
        try:
            messages = question_messages([{"role": m.role, "content": m.text()} for m in req.messages], question)
            return token_ids(self.lm.tokenizer, chat_prompt(self.lm.tokenizer, messages, self.name))
        except Exception as err:
            raise ApiError(400, f"juice.question: {type(err).__name__}: {err}", param="juice") from None

    def instructed_ids(self, req, row: list[int], question: str) -> list[int]:
        """auto's instructed prompt (its "prompt-mem" candidate, :data:`juice.engine.INSTRUCTED`):
        for a chat request, the chat template applied to its messages with the last user
        message given the Prompt baseline's instruction toward memory
        (:func:`juice.completion_text.instructed_messages`); for a completion, the prompt's text
        (its tokens `row` decoded) in the Prompt baseline's form
        (:func:`juice.baselines.prompt.instructed_request`).

        Raises:
            ApiError: 400 for a chat without a user message or a template's refusal.
        """
        tok, model_type = self.lm.tokenizer, self.lm.config.model_type
        if getattr(req, "messages", None) is None:
            return token_ids(tok, instructed_request(tok.decode(row, skip_special_tokens=True), question, model_type))
        try:
            messages = instructed_messages([{"role": m.role, "content": m.text()} for m in req.messages], question,
                                           model_type)
            return token_ids(tok, chat_prompt(tok, messages, self.name))
        except Exception as err:
            raise ApiError(400, f"juice.question: {type(err).__name__}: {err}", param="juice") from None

    def job(self, req, options: dict, ids: list[list[int]], max_tokens: int | None, logprobs: int | None = None,
            echo: bool = False) -> Job:
        """The job of a request: one stream per (prompt, choice), each seeded `seed + choice`;
        with auto, every stream's question is the request's (:meth:`question_ids`), held after
        the request's prompts, and where auto may decode it each prompt's instructed form
        (:meth:`instructed_ids`) after the question.

        Raises:
            ApiError: 400 for too many choices or stop strings, an empty prompt, a prompt and
                completion longer than the context, a request's tokens (every prompt's, and
                n x max_tokens per prompt) over the server's `max_request_tokens`, a steering the protocol refuses, or auto
                with echo.
        """
        limits = self.limits
        if req.n > limits.max_n:
            raise ApiError(400, f"n must be at most {limits.max_n} (this server's --max-n)", param="n")
        if len(req.stops()) > 4:
            raise ApiError(400, "stop: at most 4 stop strings", param="stop")
        steering, choice, ask = self.steering(options)
        if choice is not None and echo:
            raise ApiError(400, "echo is not supported with juice.method auto (its steering is chosen after the prompt)",
                           param="echo")
        max_new = limits.default_max_tokens if max_tokens is None else max_tokens
        if limits.max_request_tokens is not None:   # before any row is made: one huge request never waits in the batch
            prompt_tokens, generated = sum(map(len, ids)), len(ids) * req.n * max_new
            if prompt_tokens + generated > limits.max_request_tokens:
                raise ApiError(400, f"This request has {prompt_tokens + generated} tokens ({prompt_tokens} in its "
                                    f"prompts, {generated} to generate: {len(ids)} prompt(s) x n={req.n} x "
                                    f"max_tokens={max_new}); this server admits at most "
                                    f"{limits.max_request_tokens} per request (its --max-request-tokens).",
                               param="prompt", code="request_too_large")
        for row in ids:
            if not row:
                raise ApiError(400, "prompt is empty (no tokens)", param="prompt")
            if self.context is not None and len(row) + max_new > self.context:
                raise ApiError(400, f"This model's maximum context length is {self.context} tokens. However, you "
                                    f"requested {len(row) + max_new} tokens ({len(row)} in the prompt, {max_new} "
                                    "for the completion).", param="max_tokens")
        temperature = 1.0 if req.temperature is None else req.temperature
        seed = int.from_bytes(os.urandom(4), "little") if req.seed is None else req.seed
        streams = []
        instructed = choice is not None and choice.needs_instruction
        for i in range(len(ids)):
            for k in range(req.n):
                sampling = None if temperature == 0 else Sampling(
                    temperature, max(0, req.top_k or 0), 1.0 if req.top_p is None else req.top_p, (seed + k) % MAX_SEED)
                streams.append(Stream(i, steering, sampling, req.repetition_penalty or 1.0,
                                      choice=None if choice is None else replace(
                                          choice, question=len(ids),
                                          instructed=len(ids) + 1 + i if instructed else None)))
        if choice is not None:   # the question-only prompt, after the request's prompts, then the instructed ones
            ids = [*ids, self.question_ids(req, ask.question),
                   *([self.instructed_ids(req, row, ask.question) for row in ids] if instructed else [])]
        self.on_prompt_tokens(sum(map(len, ids)))
        return Job(ids, streams, max_new, req.stops(), limits.request_timeout_s, logprobs=logprobs, echo=echo,
                   warning=ask.warning)


__all__ = ["Admission", "ApiError", "parse_alias"]
