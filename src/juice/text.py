"""Answer normalization and matching, as in the paper's exact-match metric (Sec. 4)."""

from __future__ import annotations

import re
import string
import unicodedata
from collections.abc import Iterable

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans({c: " " for c in string.punctuation + "‘’“”–—"})


def normalize_answer(text: str) -> str:
    """Lower case, accents folded, punctuation and articles removed, white space collapsed.

    >>> normalize_answer("  The Hague's Palace, São Tomé! ")
    'hague s palace sao tome'
    """
    text = unicodedata.normalize("NFKD", text)
    text = "".join(c for c in text if not unicodedata.combining(c)).lower()
    text = text.translate(_PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def first_words(text: str, n: int = 5) -> str:
    """The first `n` white-space separated words of `text`."""
    return " ".join(text.split()[:n])


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
