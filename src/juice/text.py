"""Answer normalization and matching, as in the paper's exact-match metric (Sec. 4)."""

from __future__ import annotations

import re
import string
import unicodedata
from collections.abc import Iterable
from functools import lru_cache

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_NON_WORD = re.compile(r"[^\w\s]|_")


@lru_cache(maxsize=1 << 16)
def normalize_answer(text: str) -> str:
    """Lower case, accents folded, punctuation and articles removed, white space collapsed.
    Kept per process for the last 65,536 texts (a pure function: scoring and
    :func:`juice.data.paraconflict.build_domain` ask for the same answers again and again).

    docs/protocol.md ("Exact match") deletes every non-word, non-space character after NFD and keeps
    articles. Ours, by choice: NFKD (also folds compatibility forms such as full-width letters);
    such characters become a space, so "Hague's" keeps the word "hague" for the word-boundary
    match of :func:`contains_answer`; "a", "an", "the" are removed, so "The Hague" matches
    "Hague".

    >>> normalize_answer("  The Hague's Palace, São Tomé! ")
    'hague s palace sao tome'
    """
    text = unicodedata.normalize("NFKD", text)
    text = "".join(c for c in text if not unicodedata.combining(c)).lower()
    text = _NON_WORD.sub(" ", text)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def first_words(text: str, n: int = 5) -> str:
    """The first `n` white-space separated words of `text`."""
    return " ".join(text.split()[:n])


def first_words_final(text: str, n: int = 5, margin: int = 1) -> bool:
    """Whether no text appended to `text` can change :func:`first_words` (text, n): it holds at
    least `n` + `margin` white-space separated words (the first `n` then end in white space, and
    appending changes only the last word) and no U+FFFD (a character whose bytes are split over
    tokens decodes to it, and may come out as white space once whole).

    Decoding must append: the text of a token sequence's prefix is a prefix of its text. A
    tokenizer that cleans up spaces (`clean_up_tokenization_spaces`: " n't" -> "n't") can join
    the last two words; use `margin` 2 there.

    >>> first_words_final(" Paris, the capital of France, is")   # a sixth word: the first five are final
    True
    >>> first_words_final(" Paris, the capital of France")   # "France" may still grow ("Frances")
    False
    """
    return "\ufffd" not in text and len(text.split()) >= n + margin


def contains_answer(prediction: str, answers: Iterable[str]) -> bool:
    """True if any normalized answer occurs in the normalized prediction, on word boundaries.

    Word boundaries keep a short alias from matching inside another word ("eco" in "second").
    An answer that normalizes to nothing never matches.
    """
    padded = f" {normalize_answer(prediction)} "
    for answer in answers:
        norm = normalize_answer(answer)
        if norm and f" {norm} " in padded:
            return True
    return False


def overlaps(a: str, b: str) -> bool:
    """True if either normalized string contains the other on word boundaries."""
    return contains_answer(a, [b]) or contains_answer(b, [a])

_PUNCTUATION = frozenset(string.punctuation)
_SQUAD_ARTICLES = re.compile(r"\b(a|an|the)\b")


def squad_normalize(text: str) -> str:
    """SQuAD's answer normalization (Rajpurkar et al. 2016's evaluation script), as TriState-Bench's
    evaluation and screening use it (:mod:`juice.data.tristate`): lower case, ASCII punctuation
    removed (not replaced: "Payne-Gaposchkin" -> "paynegaposchkin"), the articles a, an, the
    removed, white space collapsed. Unlike :func:`normalize_answer`, accents are kept.

    >>> squad_normalize("The Payne-Gaposchkin, Cecilia!")
    'paynegaposchkin cecilia'
    """
    text = "".join(c for c in text.lower() if c not in _PUNCTUATION)
    return " ".join(_SQUAD_ARTICLES.sub(" ", text).split())


def first_line(output: str) -> str:
    """The output's first line, stripped (what TriState-Bench's metric reads)."""
    return output.strip().split("\n")[0].strip()


def first_line_match(output: str, answers: Iterable[str]) -> bool:
    """TriState-Bench's exact match: the output's first line, normalized as SQuAD does
    (:func:`squad_normalize`), equals a normalized answer.

    >>> first_line_match(" Paris.", ["Paris"]), first_line_match("It is Paris.", ["Paris"])
    (True, False)
    """
    line = squad_normalize(first_line(output))
    return any(line == squad_normalize(a) for a in answers)


def first_line_contains(output: str, answers: Iterable[str]) -> bool:
    """TriState-Bench's substring exact match: a normalized answer occurs in the output's
    normalized first line (a substring, not on word boundaries)."""
    line = squad_normalize(first_line(output))
    return any(squad_normalize(a) in line for a in answers)
