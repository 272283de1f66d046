"""Synthetic study outcomes (:class:`juice.when_to_steer.outcomes.Outcomes`) for the tests of the
offline analyses: no model, every verdict chosen by the test."""

from __future__ import annotations

import random

TYPES = ("gold", "conflicting", "irrelevant", "distractor", "none")
CANDIDATES = {"original": "original", "question": "Question-only", "juice": "juice-ctx"}
STATIC = ["original", "prompt-mem", "juice-ctx", "Question-only"]
"""Methods by row key, as :class:`juice.when_to_steer.outcomes.Outcomes` holds them in memory
(its files: by title)."""


def synthetic(sources=("a", "b"), questions: int = 12, seed: int = 0, right=None, half_of=None):
    """Outcomes of `questions` questions per source, one item per context type each. `right(method,
    source, q, type)` gives the use-relevant verdict (default: seeded coin flips); trust memory is
    right on irrelevant, distractor and none; a passage's answer is copied where a conflicting
    item is right. The lexical gate signal is 1 on gold and conflicting, 0.2 elsewhere; the JSD is
    seeded noise. Half: `half_of(q)` (default: even questions validation)."""
    from juice.when_to_steer.outcomes import Outcomes

    rng = random.Random(seed)
    right = right or (lambda m, s, q, t: rng.random() < 0.5)
    half_of = half_of or (lambda q: "validation" if q % 2 == 0 else "test")
    rows = [(s, q, t) for s in sources for q in range(questions) for t in TYPES]
    methods = [*STATIC, "juice/2-ctx"]
    use = {m: [bool(right(m, s, q, t)) for s, q, t in rows] for m in methods}
    true = {m: [u if t in ("irrelevant", "distractor", "none") else False for u, (s, q, t) in zip(use[m], rows)]
            for m in methods}
    copies = {m: [u if t == "conflicting" else (not u and t in ("irrelevant", "distractor"))
                  for u, (s, q, t) in zip(use[m], rows)] for m in methods}
    return Outcomes([half_of(q) for s, q, t in rows], [s for s, q, t in rows], [str(q) for s, q, t in rows],
                    [str(q) for s, q, t in rows], [t for s, q, t in rows], [t != "none" for s, q, t in rows],
                    [rng.random() if t != "none" else 0.0 for s, q, t in rows],
                    {"question_words_in_passage": [1.0 if t in ("gold", "conflicting") else 0.2 for s, q, t in rows],
                     "confidence_gain": [rng.random() for _ in rows], "context_peakedness": [rng.random() for _ in rows]},
                    {"use": use, "true": true, "copies": copies, "degenerate": {m: [False] * len(rows) for m in methods}},
                    {**CANDIDATES, "juice/2": "juice/2-ctx"}, list(STATIC),
                    {"juice": (1.0, -1.0), "juice/2": (0.5, -0.5)})
