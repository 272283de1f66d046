"""The tiny heads and NQ-Swap rows that the tests of `auto` and the when-to-steer study share."""

from __future__ import annotations

import json

from juice.interventions import Head, HeadSelection


def auto_selection(lm):
    """Two positive heads (the last layer's head 0, L0H1) and one negative (L1H1) of `lm`."""
    last = lm.heads.geometry.n_layers - 1
    return HeadSelection((Head(last, 0), Head(0, 1)), (Head(1, 1),))


def tiny_heads(lm, tuned=None):
    """A contextual heads file for `lm` (:func:`auto_selection`), tuned JuICE at 2, -1 unless `tuned`."""
    from juice.stage1.heads_file import HeadsArtifact

    return HeadsArtifact(lm.fingerprint(), "contextual", 1, [1.0], [-1.0], auto_selection(lm),
                         tuned=dict(tuned or {"juice": {"beta_plus": 2.0, "beta_minus": -1.0}}))


def tiny_model_and_heads(tmp_path):
    """A tiny Llama saved as a model folder, and a contextual heads file for it (`tiny_heads`),
    for the command-line tests: (folder, heads path)."""
    from conftest import build_tiny
    from juice.stage1.heads_file import save_heads

    lm = build_tiny("llama")
    folder = tmp_path / "model"
    lm.model.save_pretrained(folder)
    lm.tokenizer.save_pretrained(folder)
    heads = tmp_path / "heads.json"
    save_heads(tiny_heads(lm), heads)
    return folder, heads


def nqswap_file(path, rows):
    """Write `rows` to `path` as NQ-Swap's JSON lines; return `path`."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def book_rows(n: int) -> list[dict]:
    """`n` NQ-Swap rows "who wrote book i", over 16 authors (the substitute is 5 authors on)."""
    authors = ["Tolstoy", "Austen", "Homer", "Dante", "Goethe", "Kafka", "Orwell", "Virgil", "Dickens", "Zola",
               "Camus", "Joyce", "Woolf", "Proust", "Cervantes", "Ibsen"]
    return [{"question": f"who wrote book {i}", "org_context": f"<P> Book {i} was written by {authors[i % 16]} . </P>",
             "org_answer": [authors[i % 16]], "sub_context": f"<P> Book {i} was written by {authors[(i + 5) % 16]} . </P>",
             "sub_answer": [authors[(i + 5) % 16]]} for i in range(n)]


def word_rows(n: int, seed: int = 0) -> list[dict]:
    """`n` NQ-Swap rows of the tiny tokenizer's own words (w0..w92: every token known), passages of
    seeded random lengths: rows whose first steps differ (in `book_rows` most words are unknown
    to the tiny tokenizer, so every request's first step is nearly the same)."""
    import random

    rng = random.Random(seed)
    word = lambda: f"w{rng.randrange(93)}"   # noqa: E731
    rows = []
    for i in range(n):
        answer, other = word(), word()
        filler = " ".join(word() for _ in range(rng.randrange(2, 12)))
        q = f"who is w{i} {word()}"
        rows.append({"question": q, "org_context": f"<P> {filler} w{i} is {answer} . </P>", "org_answer": [answer],
                     "sub_context": f"<P> {filler} w{i} is {other} . </P>", "sub_answer": [other]})
    return rows
