"""From tokens to the text a caller sees, written once for :class:`juice.Steerer` and `juice serve`:
the chat prompt, the cut at EOS and at stop strings, and the pieces of a streamed text.

The rules (OpenAI's and Hugging Face's): a continuation ends at the tokenizer's EOS (not part of
the text); the text is cut before the first occurrence of any stop string; while streaming, the
characters that could still become a stop string, and an incomplete UTF-8 character (decoded as
U+FFFD), are held back until the next token decides them, so the pieces join to the final text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from transformers import PreTrainedTokenizerBase

from juice.baselines.prompt import instructed_request


def cut_at_stop(text: str, stop: Sequence[str]) -> str:
    """`text` up to (not including) the earliest occurrence of any stop string.

    >>> cut_at_stop("Paris.\\nQuestion: ...", ["\\n", "Q:"])
    'Paris.'
    """
    cut = min((i for i in (text.find(s) for s in stop if s) if i >= 0), default=len(text))
    return text[:cut]


def stop_prefix_length(text: str, stop: Sequence[str]) -> int:
    """How many characters at the end of `text` could be the start of a stop string.

    >>> stop_prefix_length("Paris. Que", ["Question"])
    3
    """
    best = 0
    for s in stop:
        for k in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:k]):
                best = max(best, k)
                break
    return best


def final_text(tokenizer: PreTrainedTokenizerBase, tokens: Sequence[int], stop: Sequence[str] = ()) -> str:
    """The text of a continuation's new `tokens`: up to its first EOS, special tokens skipped,
    cut at the first stop string."""
    ids = list(tokens)
    eos = tokenizer.eos_token_id
    if eos is not None and eos in ids:
        ids = ids[: ids.index(eos)]
    return cut_at_stop(tokenizer.decode(ids, skip_special_tokens=True), stop)


def chat_prompt(tokenizer: PreTrainedTokenizerBase, messages: Sequence[Mapping[str, str]], name: str = "the model"
                ) -> str:
    """The prompt the tokenizer's chat template makes of `messages`, ready for the assistant's
    turn. A BOS the template writes is dropped where the tokenizer adds its own (juice's prompts
    are tokenized with special tokens, :func:`juice.tokens.token_ids`), so the prompt holds one.

    Raises:
        ValueError: the tokenizer has no chat template, or the template gives no text.
        Exception: the template's own refusals (roles out of order, ...), unchanged.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"{name}'s tokenizer has no chat template; use a plain prompt (completions)")
    text = tokenizer.apply_chat_template([dict(m) for m in messages], tokenize=False, add_generation_prompt=True)
    if not isinstance(text, str):
        raise ValueError("the chat template did not give a text prompt")
    bos = tokenizer.bos_token
    if bos and text.startswith(bos) and tokenizer("x", add_special_tokens=True)["input_ids"][:1] == [
            tokenizer.bos_token_id]:
        text = text[len(bos):]
    return text


def question_messages(messages: Sequence[Mapping[str, str]], question: str) -> list[dict[str, str]]:
    """`messages` with the last user message's content replaced by `question`: the chat whose
    prompt is `auto`'s question-only branch (the same conversation, without the context).

    Raises:
        ValueError: no user message, or an empty question.
    """
    if not question.strip():
        raise ValueError("the question is empty")
    out = [dict(m) for m in messages]
    last = max((i for i, m in enumerate(out) if m.get("role") == "user"), default=None)
    if last is None:
        raise ValueError("auto's question replaces the last user message; there is none")
    out[last]["content"] = question
    return out


def instructed_messages(messages: Sequence[Mapping[str, str]], question: str, model_type: str | None = None
                        ) -> list[dict[str, str]]:
    """`messages` with the last user message's content given the Prompt baseline's instruction
    toward memory (:func:`juice.baselines.prompt.instructed_request` of that content and
    `question`): the chat whose prompt is `auto`'s "prompt-mem" candidate
    (:data:`juice.engine.INSTRUCTED`).

    Raises:
        ValueError: no user message.
    """
    last = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=None)
    if last is None:
        raise ValueError("auto's instructed prompt instructs the last user message; there is none")
    out = [dict(m) for m in messages]
    out[last]["content"] = instructed_request(str(out[last].get("content", "")), question, model_type)
    return out


class TextStream:
    """The pieces of one continuation's text, token by token (module docstring): the pieces
    :meth:`add` returns, then :meth:`rest` of the final text, join to :func:`final_text`.

    Args:
        tokenizer: decodes the tokens.
        stop: stop strings.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop: Sequence[str] = ()):
        self.tokenizer, self.stop = tokenizer, list(stop)
        self.ids: list[int] = []
        self.shown = ""
        self.ended = False   # EOS or a stop string was reached: later tokens add nothing

    def add(self, token: int) -> str:
        """The new visible piece after `token` ("" when nothing can be shown yet)."""
        if self.ended:
            return ""
        if token == self.tokenizer.eos_token_id:
            self.ended = True
            return ""
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        cut = cut_at_stop(text, self.stop)
        if cut != text:
            self.ended = True
            visible = cut
        else:
            visible = cut[: len(cut) - stop_prefix_length(cut, self.stop)]
        if len(visible) > len(self.shown) and not visible.endswith("\ufffd"):
            piece, self.shown = visible[len(self.shown):], visible
            return piece
        return ""

    def rest(self, final: str | None = None) -> str:
        """What `final` (default: :func:`final_text` of the tokens added) holds beyond the pieces shown."""
        final = final_text(self.tokenizer, self.ids, self.stop) if final is None else final
        return final[len(self.shown):]


__all__ = ["TextStream", "chat_prompt", "cut_at_stop", "final_text", "question_messages", "stop_prefix_length"]
