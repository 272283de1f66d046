"""One object to steer with: a model, its heads and a method, with the generation options users
know from Hugging Face (greedy or sampled, stop strings, EOS, chat templates, streaming).

    steerer = juice.Steerer(lm, "heads.json", method="juice",
                            beta_plus=2, beta_minus=0)
    steerer.generate(["..."], max_new_tokens=64, temperature=0.7,
                     top_p=0.9, seed=0, stop=["\\n\\n"])
    steerer.chat([{"role": "user", "content": "..."}])
    for piece in steerer.stream("..."):
        print(piece, end="")
    # method="auto" after `juice tune --methods auto`
    auto = juice.Steerer(lm, "heads.json", method="auto")
    auto.generate(["Context: ... Question: ...? Answer:"],
                  questions=["Question: ...? Answer:"])

Decoding is :func:`juice.engine.generate` (batched, left-padded, KV-cached; JuICE is the
paper's dual run, Alg. 1; JuNE the single run, Alg. 4). Generation runs up to `max_new_tokens`
steps, stopping once every prompt of the batch has produced EOS; the text is cut at the first
EOS token, then before the first stop string.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

from juice.baselines.prompt import instructed_request
from juice.completion_text import TextStream, chat_prompt, final_text
from juice.engine import DecodingSession, Stream, generate
from juice.engine.sampling import Sampling
from juice.interventions import HeadSelection
from juice.data.records import Direction
from juice.stage1 import HeadsArtifact, load_heads
from juice.stage1.shipped import shipped_heads
from juice.models import LoadedModel
from juice.methods import MethodInputs, build, lookup, names
from juice.steering import Steering
from juice.tokens import PromptTooLongError, context_length, token_ids


class Steerer:
    """A loaded model steered by one method on one set of heads.

    Args:
        lm: the model (:func:`juice.load_model`).
        heads: a :class:`HeadSelection`, a heads artifact, or the path of a heads file (checked
            against `lm`); None: with method "original" none, else the heads juice ships for an
            embedded model toward `direction` (:func:`juice.stage1.shipped.shipped_heads`, one
            INFO line on the `juice` logger says which).
        method: "juice" (dual run), "june" (single run), "original" (steering off) or "auto"
            (:mod:`juice.when_to_steer.auto`: per prompt, Original or a JuICE / JuNE strength, chosen at the
            first step from how much the context moves the model's prediction; needs a heads
            file tuned with `juice tune --methods auto` and each prompt's question, the prompt
            without its context: `generate(..., questions=...)`).
        beta_plus: beta+, the strength added to (JuICE) or scaling (JuNE) the heads that help
            when scaled up (S+); None: the heads file's tuned value for the method (`juice
            tune`), else 2 with an :class:`~juice.steering.UntunedBetasWarning` (defaults can
            break a small model's text). Not for "auto" (its policy holds its own).
        beta_minus: beta-, the same for the heads that help when scaled down (S-); None: the
            tuned value, else 0.
        direction: with `heads` None, which shipped heads: "parametric" (toward memory, the
            default) or "contextual" (toward the context); with a heads file or artifact, it
            must be the file's direction.

    Raises:
        ValueError: an unknown method or direction, auto without a tuned policy or with betas,
            a direction that is not the heads file's.
        juice.stage1.shipped.NoShippedHeadsError: no heads given and none ships for this model
            (the line says how to make them).
        juice.stage1.HeadsFileMismatchError: the heads file was made for another model.
    """

    def __init__(self, lm: LoadedModel, heads: HeadSelection | HeadsArtifact | str | Path | None = None, *,
                 method: str = "juice", beta_plus: float | None = None, beta_minus: float | None = None,
                 direction: str | None = None):
        spec = lookup(method, names(steerer=True))
        if heads is None and spec.heads:
            heads = shipped_heads(lm, direction or "parametric")
        elif isinstance(heads, (str, Path)):
            heads = load_heads(heads, lm)
        tuned: dict = {}
        if isinstance(heads, HeadsArtifact):
            if direction is not None and Direction.parse(direction) != Direction.parse(heads.direction):
                raise ValueError(f"the heads are {heads.direction} and direction={direction!r}: "
                                 "pass the other heads file, or leave direction out")
            tuned = heads.tuned
            heads = heads.selection
        built = build(spec.name, MethodInputs(lm, heads, tuned, beta_plus, beta_minus))
        self.lm, self.heads, self.method = lm, heads, spec.name
        self.steering: Steering = built.method.steering
        self.choice = built.method.choice
        self.beta_plus: float | None = built.settings.get("beta_plus")
        self.beta_minus: float | None = built.settings.get("beta_minus")

    # ------------------------------------------------------------------ generation

    def _streams(self, n: int, do_sample: bool | None, temperature: float | None, top_k: int, top_p: float,
                 seed: int, repetition_penalty: float = 1.0) -> list[Stream]:
        """Stream i decodes prompt i; with auto, its question is prompt n + i and its instructed
        prompt (where auto may decode it) prompt 2n + i."""
        sample = do_sample if do_sample is not None else (temperature is not None and temperature > 0)
        t = 1.0 if temperature is None else temperature
        instructed = self.choice is not None and self.choice.needs_instruction
        return [Stream(i, self.steering, Sampling(t, top_k, top_p, seed + i) if sample else None, repetition_penalty,
                       choice=None if self.choice is None else
                       replace(self.choice, question=n + i, instructed=2 * n + i if instructed else None))
                for i in range(n)]

    def _instructed(self, prompts: Sequence[str], questions: Sequence[str],
                    given: Sequence[str] | None = None) -> list[str]:
        """With auto whose policy may pick "prompt-mem", each prompt with the Prompt baseline's
        instruction toward memory: `given`, or :func:`juice.baselines.prompt.instructed_request`;
        else [].

        Raises:
            ValueError: `given` without auto, or not one per prompt.
        """
        if given is not None:
            if self.choice is None:
                raise ValueError("instructions are for method auto")
            if len(given) != len(prompts):
                raise ValueError(f"auto: {len(prompts)} prompts, {len(given)} instructions")
        if self.choice is None or not self.choice.needs_instruction:
            return []
        if given is not None:
            return list(given)
        return [instructed_request(p, q, self.lm.config.model_type) for p, q in zip(prompts, questions)]

    def _questions(self, n: int, questions: str | Sequence[str] | None) -> list[str]:
        if self.choice is None:
            if questions is not None:
                raise ValueError("questions are for method auto")
            return []
        questions = [questions] if isinstance(questions, str) else list(questions or [])
        if len(questions) != n or not all(q.strip() for q in questions):
            raise ValueError(f"auto needs each prompt's question, the prompt without its context "
                             f"(questions=...): {n} prompts, {len(questions)} questions")
        return questions

    def _finish(self, tokens: Sequence[int], stop: Sequence[str]) -> str:
        return final_text(self.lm.tokenizer, tokens, stop)

    def generate(self, prompts: str | Sequence[str], max_new_tokens: int = 64, *, do_sample: bool | None = None,
                 temperature: float | None = None, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
                 stop: Sequence[str] = (), repetition_penalty: float = 1.0, max_rows: int | str = 64,
                 questions: str | Sequence[str] | None = None,
                 instructions: Sequence[str] | None = None) -> list[str]:
        """Continue every prompt (batched, left-padded).

        Args:
            prompts: one prompt or several (BOS is added).
            questions: with method "auto", per prompt its question: the prompt without its
                context, formatted alike (e.g. "Question: ...? Answer:").
            instructions: with method "auto" whose policy may pick "prompt-mem", per prompt its
                form with the Prompt baseline's instruction toward memory; None: each prompt's
                :func:`juice.baselines.prompt.instructed_request` (:meth:`chat` instructs the
                last user message instead).
            do_sample: sample instead of greedy decoding; by default, sample iff a temperature > 0
                is given (Hugging Face's options; prompt i is seeded with `seed + i`).
            temperature, top_k, top_p: see :class:`juice.engine.sampling.Sampling`.
            stop: strings; each text is cut before the first one found.
            repetition_penalty: Hugging Face's (:class:`juice.engine.Stream`); 1 is off.

        Decoding of a batch stops once every prompt has produced EOS.

        Returns:
            One continuation per prompt, cut at EOS and at the first stop string.

        Raises:
            PromptTooLongError: a prompt does not fit the context with `max_new_tokens`.
            ValueError: bad sampling settings, max_new_tokens < 1; auto without a question per
                prompt, or questions (instructions) without auto.
        """
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        extra = self._questions(len(prompts), questions)
        instructed = self._instructed(prompts, extra, instructions)
        streams = self._streams(len(prompts), do_sample, temperature, top_k, top_p, seed, repetition_penalty)
        gen = generate(self.lm, prompts + extra + instructed, streams, max_new_tokens, max_rows=max_rows,
                       stop_at_eos=True)
        return [self._finish(row, stop) for row in gen.tokens.tolist()]

    def chat_prompt(self, messages: Sequence[dict[str, str]]) -> str:
        """The prompt the tokenizer's chat template makes of `messages`, ready for the assistant's
        turn (:func:`juice.completion_text.chat_prompt`, as `juice serve` makes it).

        Raises:
            ValueError: the tokenizer has no chat template.
        """
        return chat_prompt(self.lm.tokenizer, messages, self.lm.name)

    def chat(self, messages: Sequence[dict[str, str]], max_new_tokens: int = 256, *, question: str | None = None,
             **options) -> str:
        """The assistant's reply to `messages` (see :meth:`chat_prompt`; options as in :meth:`generate`).

        Args:
            question: with method "auto", the last user message without its context: the
                question's prompt is `messages` with that message's content replaced by it
                (:func:`juice.completion_text.question_messages`, as `juice serve` does).
        """
        from juice.completion_text import instructed_messages, question_messages

        questions = None if question is None else [self.chat_prompt(question_messages(messages, question))]
        instructions = None   # auto's instructed prompt instructs the last user message, not the template
        if question is not None and self.choice is not None and self.choice.needs_instruction:
            instructions = [self.chat_prompt(instructed_messages(messages, question, self.lm.config.model_type))]
        return self.generate([self.chat_prompt(messages)], max_new_tokens, questions=questions,
                             instructions=instructions, **options)[0]

    def stream(self, prompt: str, max_new_tokens: int = 64, *, do_sample: bool | None = None,
               temperature: float | None = None, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
               stop: Sequence[str] = (), repetition_penalty: float = 1.0, question: str | None = None) -> Iterator[str]:
        """Yield the continuation of `prompt` piece by piece as it is decoded; the pieces join to
        what :meth:`generate` returns for the same arguments (EOS and stop strings end it).

        It drives the engine's session (:class:`juice.engine.DecodingSession`) one step per
        token in the caller's thread; closing the iterator early ends the decoding. `question`:
        with method "auto", the prompt without its context.

        Raises:
            As :meth:`generate` (raised from the iterator).
        """
        lm = self.lm
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        ids = token_ids(lm.tokenizer, prompt)
        limit = context_length(lm)
        if limit is not None and len(ids) > limit - max_new_tokens:
            raise PromptTooLongError(f"a prompt has {len(ids)} tokens; the model's context holds "
                                     f"{limit - max_new_tokens} with {max_new_tokens} new tokens")
        extra = self._questions(1, question)
        session = DecodingSession(lm)
        instructed = self._instructed([prompt], extra)
        session.add(0, ids, self._streams(1, do_sample, temperature, top_k, top_p, seed, repetition_penalty)[0],
                    max_new_tokens, question_ids=token_ids(lm.tokenizer, extra[0]) if extra else None,
                    instructed_ids=token_ids(lm.tokenizer, instructed[0]) if instructed else None)
        text = TextStream(lm.tokenizer, stop)
        while not session.idle and not text.ended:
            for token in session.step():
                if piece := text.add(token.token):
                    yield piece
        if rest := text.rest():
            yield rest


def __getattr__(name: str):
    """`METHODS`: the methods a Steerer runs, read from :data:`juice.methods.REGISTRY` (entries with
    `steerer=True`) when asked, so an entry added later is one of them (no copy at import)."""
    if name == "METHODS":
        return names(steerer=True)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["METHODS", "Steerer"]   # noqa: F822 (METHODS is read lazily by __getattr__)
