"""A first-step signal as a classifier (juice.when_to_steer.classifier): the AUROC equals the
pairwise count, its interval resamples whole questions, the reliability bins, the table's cells."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from juice.data.context_types import ContextItem
from juice.when_to_steer.classifier import (POOLED, auroc_interval, auroc_table, reliability, reliability_curves,
                                           weighted_auroc, wrong_types)

pytestmark = pytest.mark.unit


def _pairwise(values, positive):
    """The AUROC by its definition: over every (positive, negative) pair, 1 if the positive
    scores higher, 1/2 on a tie."""
    pos = [v for v, p in zip(values, positive) if p]
    neg = [v for v, p in zip(values, positive) if not p]
    return sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in pos for b in neg) / (len(pos) * len(neg))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]), st.booleans()), min_size=2, max_size=30)
       .filter(lambda xs: 0 < sum(p for _, p in xs) < len(xs)))
def test_the_auroc_is_the_share_of_pairs_a_positive_wins_ties_half(cases):
    values, positive = [v for v, _ in cases], [p for _, p in cases]
    iv = auroc_interval(values, positive, [not p for p in positive], list(range(len(cases))), resamples=1000)
    assert iv.mean == pytest.approx(_pairwise(values, positive))
    assert iv.low - 1e-12 <= iv.high and 0.0 <= iv.low and iv.high <= 1.0
    assert iv.n == len(cases)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.0, 0.5, 1.0, 2.0]), st.booleans(), st.integers(0, 3)),
                min_size=2, max_size=25)
       .filter(lambda xs: sum(w for _, p, w in xs if p) > 0 and sum(w for _, p, w in xs if not p) > 0))
def test_the_bootstraps_weighted_auroc_is_scikit_learns(cases):
    """The interval's resamples use :func:`weighted_auroc` (all of them in one pass) in place of
    one `roc_auc_score` call each: the same number, ties and zero weights included."""
    from sklearn.metrics import roc_auc_score

    x = np.array([v for v, _, _ in cases])
    pos = np.array([p for _, p, _ in cases])
    w = np.array([[float(k) for _, _, k in cases], [1.0] * len(cases)])
    got = weighted_auroc(x, pos, w)
    assert got[0] == pytest.approx(roc_auc_score(pos.astype(int), x, sample_weight=w[0]), abs=1e-12)
    assert got[1] == pytest.approx(_pairwise(x.tolist(), pos.tolist()), abs=1e-12)


def test_separation_gives_one_its_reverse_zero_and_items_on_neither_side_take_no_part():
    x = [0.9, 0.8, 0.7, 0.2, 0.1, 5.0]
    pos = [True, True, True, False, False, False]
    neg = [False, False, False, True, True, False]   # the last item is on neither side
    assert auroc_interval(x, pos, neg, range(6), resamples=1000).mean == 1.0
    assert auroc_interval([-v for v in x], pos, neg, range(6), resamples=1000).mean == 0.0
    empty = auroc_interval(x, [False] * 6, neg, range(6), resamples=1000)
    assert math.isnan(empty.mean) and math.isnan(empty.low)


def test_the_interval_resamples_whole_questions():
    """Each question's items are drawn together: a question whose positive and negative tie gives
    0.5 in every resample, and n counts questions, not items."""
    x = [0.3, 0.3, 0.6, 0.6, 0.9, 0.9]
    pos = [True, False] * 3
    iv = auroc_interval(x, pos, [not p for p in pos], [0, 0, 1, 1, 2, 2], resamples=1000)
    assert (iv.mean, iv.n) == (pytest.approx(0.5 * 3 / 9 + 3 / 9), 3)   # ties within questions, wins across
    alone = auroc_interval(x, pos, [not p for p in pos], [0, 0, 0, 0, 0, 0], resamples=1000)
    assert alone.low == alone.high == alone.mean   # one question: every resample is the sample


def test_more_questions_narrow_the_interval():
    rng = np.random.default_rng(0)

    def width(n):
        x = np.concatenate([rng.normal(1, 1, n), rng.normal(0, 1, n)])
        pos = np.arange(2 * n) < n
        iv = auroc_interval(x, pos, ~pos, np.arange(2 * n) % n, resamples=1000)
        return iv.high - iv.low

    assert width(400) < width(25)


def test_reliability_bins_at_quantiles_with_the_share_of_positives():
    x = np.arange(10, dtype=float)
    pos = x >= 5
    bins = reliability(x, pos, bins=2)
    assert [(b.low, b.high, b.n, b.positive_share) for b in bins] == [(0.0, 4.0, 5, 0.0), (5.0, 9.0, 5, 1.0)]
    same = reliability([1.0] * 4, [True, False, True, True], bins=5)   # equal values: one bin
    assert [(b.n, b.positive_share) for b in same] == [(4, 0.75)]
    with pytest.raises(ValueError):
        reliability([1.0], [True, False])


def _item(source, uid, kind, variant=""):
    answers = {"none": (), "distractor": ()}.get(kind, ("Paris",))
    prompt = "Question: capital?" if kind == "none" else f"{kind} passage. Question: capital?"
    return ContextItem(source, uid, kind, prompt, "Question: capital?", ("Paris",), answers, variant=variant)


def test_the_table_has_a_cell_per_signal_source_and_wrong_type_and_a_pooled_one():
    items, lexical = [], []
    for source in ("a", "b"):
        for q in range(6):
            for kind, variant, value in (("gold", "", 1.0), ("conflicting", "", 0.9), ("irrelevant", "", 0.1),
                                         ("distractor", "bm25" if q % 2 else "no_answer", 0.95 if q % 2 else 0.2),
                                         ("none", "", 0.0)):
                items.append(_item(source, str(q), kind, variant))
                lexical.append(value)
    assert wrong_types(items) == ["irrelevant", "distractor", "distractor: bm25", "distractor: no_answer"]
    cells = {(c.signal, c.source, c.wrong): c for c in auroc_table(items, {"lexical": lexical}, resamples=1000)}
    assert {s for _, s, _ in cells} == {"a", "b", POOLED}
    assert cells["lexical", "a", "irrelevant"].auroc.mean == 1.0
    assert cells["lexical", "a", "distractor: no_answer"].auroc.mean == 1.0
    assert cells["lexical", "a", "distractor: bm25"].auroc.mean == 0.5   # beats conflicting, loses to gold
    assert cells["lexical", POOLED, "distractor"].auroc.n == 12           # questions of both sources
    c = cells["lexical", "b", "distractor"]
    assert (c.positives, c.negatives) == (12, 6)
    with pytest.raises(ValueError, match="values for"):
        auroc_table(items, {"lexical": lexical[:-1]}, resamples=1000)
    curves = reliability_curves(items, {"lexical": lexical}, bins=2)["lexical"]
    assert list(curves) == wrong_types(items)
    assert sum(b.n for b in curves["irrelevant"]) == 24 + 12   # gold and conflicting of 12 questions, 12 irrelevant
    assert [b.positive_share for b in curves["irrelevant"]] == [0.0, 1.0]


def test_the_calibration_curves_are_drawn_per_dataset_and_wrong_type(tmp_path):
    pytest.importorskip("matplotlib", reason="the plots extra draws the figure")
    from juice.when_to_steer.classifier import reliability_figure

    x = np.arange(10, dtype=float)
    bins = [b.to_json() for b in reliability(x, x >= 5, bins=2)]
    curves = {"one": {"lexical": {"irrelevant": bins, "distractor": bins}}, "two": {"lexical": {"irrelevant": []}}}
    path = reliability_figure(curves, tmp_path / "calibration.png", "title")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
