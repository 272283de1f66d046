"""The degeneration measure (juice.eval.degeneration) against outputs labelled by hand (issue 49):
benchmarks/labels/degeneration.jsonl, a stratified sample of `juice reproduce` outputs (methods x
datasets x flagged / not flagged) that a person read and called fluent or degenerate."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from degeneration_labels import LABELS, agreement, read_labels  # noqa: E402

from juice.eval.degeneration import correct_not_degenerate, is_degenerate  # noqa: E402


def test_the_labels_are_a_stratified_sample_of_at_least_200_outputs():
    rows = read_labels(LABELS)
    assert len(rows) >= 200 and len({r["output"] for r in rows}) == len(rows)
    assert Counter(r["label"] for r in rows).keys() == {"fluent", "degenerate"}
    assert len({r["method"] for r in rows}) >= 6 and len({(r["direction"], r["domain"]) for r in rows}) >= 5
    assert Counter(r["flagged"] for r in rows)[True] >= 50   # both sides of the rule, as sampled


def test_the_measure_agrees_with_the_hand_labels():
    """Precision and recall of the rule on the committed labels (degenerate = positive); the
    floors sit just under what the rule scores today (benchmarks/degeneration_labels.py score
    prints the figures and the disagreements), so a change that makes it worse fails here."""
    a = agreement(read_labels(LABELS))
    assert a["precision"] >= 0.95 and a["recall"] >= 0.88, a   # today: 0.970 and 0.903


def test_correct_and_not_degenerate_needs_both():
    class R:
        def __init__(self, correct, output):
            self.correct, self.output = correct, output

        @property
        def degenerate(self):
            return is_degenerate(self.output)

    assert correct_not_degenerate(R(True, " Paris."))
    assert not correct_not_degenerate(R(True, " Richie Cunningham , Richie Cunningham , Richie Cunningham ,"))
    assert not correct_not_degenerate(R(False, " Lyon."))


def test_a_label_outside_the_classes_is_refused(tmp_path):
    bad = tmp_path / "l.jsonl"
    bad.write_text('{"output": "x", "label": "meh"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="l.jsonl:1: label must be one of"):
        read_labels(bad)
