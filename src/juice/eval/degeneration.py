"""Degenerate output: text that repeats itself (issue 38), measured beside accuracy.

Steering with betas that do not suit a model can break its text ("Urone vs Urone vs Urone...",
a question echoed over and over) while exact match, which reads five words, barely notices.
juice's measure (not the paper's; the paper reports accuracy only) is the share of a text's
character 6-grams that already occurred earlier in it, white space collapsed and case ignored
(:func:`repeated_share` of the lower-cased text); a text is *degenerate* when that share is at
least :data:`DEGENERATE_AT`, or when one word follows itself :data:`WORD_RUN` times in a row
(:func:`word_run`: "pay pay pay", "element element element", short texts whose 6-grams are too
few to repeat). It reads the characters, so it needs no tokenizer, works on any stored output,
and catches repetition inside words ("vsroneronerone"). It is calibrated on these examples (the
doctests of :func:`is_degenerate`): fluent answers, a base model's echo of its prompt and a
sentence of 40 words score below 0.1; a phrase or a word repeated three times scores 0.37 and
more.

Checked against 258 outputs of `juice reproduce --direction contextual` labelled by hand as
fluent or degenerate (`benchmarks/labels/degeneration.jsonl`, a stratified sample over the eight
methods, the five datasets and both sides of the rule; `python benchmarks/degeneration_labels.py
score`): precision 0.970 and recall 0.903 (degenerate = positive; 65 of 72 found, 2 false
alarms). The 6-gram share alone, case-sensitive (the rule before that check), scored precision
0.984 and recall 0.847: it missed runs of one word ("Was was was was", "pay pay pay pay") and short
loops, so the case-folding and the word run were added. What it still misses is word salad
without repetition (a table's cells copied in a row, "the 2016-2017 with the 2017-2").

It reads what a table holds: evaluation outputs are 10 new tokens at most, and stop once exact
match's five words are final (:func:`juice.text.first_words_final`), so it sees the breakage that
shows within the first words; a repetition that starts later shows in longer texts (a chat
reply, a served completion).

Tables report the share of degenerate outputs per method with n and a 95% bootstrap interval
(:func:`juice.eval.tables.interval_table` with `value=is_degenerate`), and beside accuracy a
second score, **correct and not degenerate** (:func:`correct_not_degenerate`: exact match on an
output that is not degenerate), with its paired differences: exact match reads the first five
words, so " Richie Cunningham , Richie Cunningham , Richie Cunningham" counts as correct there
and not here. `juice tune` never chooses a setting whose share on the tuning rows exceeds
Original's by more than :data:`juice.tuned.DEGENERATION_MARGIN` percentage points (:func:`juice.workflow.tune`);
`juice reproduce --degeneration-margin P` applies the same rule to the paper's per-domain grids
(:func:`juice.eval.tuning.tune_per_domain`), an option: the paper's protocol reads accuracy only.
"""

from __future__ import annotations

import re

from juice.tuned import DEGENERATION_MARGIN  # noqa: F401  (re-exported: the margin this rule is applied with)

NGRAM = 6
"""Characters per n-gram of :func:`repeated_share`."""
DEGENERATE_AT = 0.3
"""A text whose repeated share is at least this is degenerate."""
WORD_RUN = 3
"""A text in which one word (case ignored) follows itself this many times in a row is degenerate."""

_SPACE = re.compile(r"\s+")
_WORD = re.compile(r"[\w']+")


def repeated_share(text: str, n: int = NGRAM) -> float:
    """The share of `text`'s character n-grams (white space collapsed, ends stripped) that
    already occurred earlier in it; 0 for a text shorter than n characters.

    >>> repeated_share("abcabcabc", 3)   # 7 trigrams, the last 4 seen before
    0.5714285714285714
    >>> repeated_share(" Paris. It is located in the French")
    0.0
    """
    text = _SPACE.sub(" ", text).strip()
    grams = [text[i: i + n] for i in range(len(text) - n + 1)]
    if not grams:
        return 0.0
    seen: set[str] = set()
    repeated = 0
    for gram in grams:
        repeated += gram in seen
        seen.add(gram)
    return repeated / len(grams)


def correct_not_degenerate(result) -> bool:
    """The second score beside accuracy (module docstring): an item result (any object with
    `correct` and `degenerate`, e.g. :class:`juice.eval.runner.ItemResult`) that is correct and
    whose output is not degenerate."""
    return bool(result.correct) and not bool(result.degenerate)


def word_run(text: str) -> int:
    """The longest run of one word repeated back to back (words: letters, digits and
    apostrophes; case ignored); 0 for a text without words.

    >>> word_run(" pay you back. Pay back pay pay pay pay")
    4
    >>> word_run(" Paris is the capital of France.")
    1
    """
    words = [w.lower() for w in _WORD.findall(text)]
    best = run = min(1, len(words))
    for a, b in zip(words, words[1:]):
        run = run + 1 if a == b else 1
        best = max(best, run)
    return best


def is_degenerate(text: str) -> bool:
    """Whether `text` repeats itself (module docstring): :func:`repeated_share` of the lower-cased
    text >= :data:`DEGENERATE_AT`, or a :func:`word_run` of at least :data:`WORD_RUN`.

    >>> is_degenerate(" Urone vs Urone vs Urone. Urone")
    True
    >>> is_degenerate(" Question: What is the capital of France?\\n Question: What is the capital of France?\\n Question:")
    True
    >>> is_degenerate(" Paris, Paris, Paris, Paris")
    True
    >>> is_degenerate(" is. - Socrates Quote: Was was was was")
    True
    >>> is_degenerate(" The answer to the question is: Lyon.")
    False
    >>> is_degenerate(" Beijing. The name of the capital city of France is Beijing.")   # an echo of the prompt
    False
    >>> is_degenerate(" Paris is the capital and most populous city of France. It is located on the Seine river, "
    ...               "in the north of the country, and is known for its museums and architecture.")
    False
    """
    return repeated_share(text.lower()) >= DEGENERATE_AT or word_run(text) >= WORD_RUN
