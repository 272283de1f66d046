"""Bootstrap intervals: coverage of a known Bernoulli mean, pairing, determinism, errors, the
printed form. The figure is tested in test_plots.py."""

from __future__ import annotations

import math

import numpy as np
import pytest

from juice.eval.stats import Interval, bootstrap_interval, paired_difference_interval, stratified_interval


def test_bootstrap_intervals_cover_a_known_bernoulli_mean_at_about_the_stated_rate():
    """300 seeded samples of n = 60 from Bernoulli(0.3): the 95% percentile interval covers 0.3
    in 95.3% of them when this was written (the percentile bootstrap can undercover a little at
    small n); the bounds allow for that, not for a broken interval."""
    rng = np.random.default_rng(123)
    covered = 0
    for i in range(300):
        sample = rng.random(60) < 0.3
        iv = bootstrap_interval(sample, resamples=1000, seed=i)
        covered += iv.low <= 0.3 <= iv.high
    assert 0.90 <= covered / 300 <= 0.985


def test_the_interval_holds_the_sample_mean_and_is_seeded():
    values = np.random.default_rng(0).random(50).tolist()
    a, b = bootstrap_interval(values, seed=1), bootstrap_interval(values, seed=1)
    assert a == b and a.n == 50 and a.mean == pytest.approx(np.mean(values))
    assert a.low <= a.mean <= a.high
    assert bootstrap_interval(values, seed=2) != a


def test_paired_differences():
    same = [1, 0, 1, 1, 0]
    iv = paired_difference_interval(same, same)
    assert (iv.mean, iv.low, iv.high) == (0.0, 0.0, 0.0)
    a, b = [1, 1, 0, 1, 0, 1], [0, 1, 0, 0, 0, 1]
    d = paired_difference_interval(a, b)
    assert d.mean == pytest.approx(np.mean(a) - np.mean(b)) and d.low <= d.mean <= d.high
    # always better on every item that differs: the interval never goes below 0
    assert d.low >= 0.0
    with pytest.raises(ValueError, match="6 and 5"):
        paired_difference_interval(a, b[:5])


def test_the_stratified_average_is_the_mean_of_the_strata_means():
    """The paper's "Avg" is the mean of per-domain accuracies: a domain of 4 items all correct and
    one of a single wrong item average to 0.5, not to the pooled 0.8; n counts every item."""
    iv = stratified_interval([[1, 1, 1, 1], [0], []])
    assert (iv.mean, iv.n) == (0.5, 5)
    assert (iv.low, iv.high) == (0.5, 0.5)   # each stratum is constant: no resample moves the mean
    rng = np.random.default_rng(4)
    strata = [(rng.random(n) < p).tolist() for n, p in ((30, 0.2), (50, 0.7), (20, 0.5))]
    iv = stratified_interval(strata, seed=3)
    assert iv.mean == pytest.approx(np.mean([np.mean(s) for s in strata])) and iv.low < iv.mean < iv.high
    assert iv == stratified_interval(strata, seed=3)
    # one stratum: the plain bootstrap of that stratum, same seed, same draws
    assert stratified_interval([strata[0]], seed=3) == bootstrap_interval(strata[0], seed=3)


def test_stratified_intervals_cover_the_mean_of_the_strata_means():
    """200 seeded draws of three strata (n = 20, 40, 60; p = 0.2, 0.5, 0.8): the interval covers
    the true mean of means (0.5) at about 95%, as the plain bootstrap does."""
    rng = np.random.default_rng(7)
    covered = 0
    for i in range(200):
        strata = [rng.random(n) < p for n, p in ((20, 0.2), (40, 0.5), (60, 0.8))]
        iv = stratified_interval(strata, resamples=1000, seed=i)
        covered += iv.low <= 0.5 <= iv.high
    assert 0.88 <= covered / 200 <= 0.99


def test_errors_and_empty_cells():
    with pytest.raises(ValueError, match="1,000 resamples"):
        bootstrap_interval([1, 0], resamples=999)
    with pytest.raises(ValueError, match="1,000 resamples"):
        paired_difference_interval([1, 0], [0, 1], resamples=10)
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_interval([1, 0], confidence=1.0)
    with pytest.raises(ValueError, match="one-dimensional"):
        bootstrap_interval([[1, 0], [0, 1]])
    empty = bootstrap_interval([])
    assert empty.n == 0 and math.isnan(empty.mean) and empty.format() == "–"
    assert empty.to_json() == {"mean": None, "low": None, "high": None, "n": 0}
    assert paired_difference_interval([], []).n == 0
    assert stratified_interval([[], []]).n == 0
    with pytest.raises(ValueError, match="1,000 resamples"):
        stratified_interval([[1, 0]], resamples=10)


def test_format_prints_percent_and_the_larger_half_width():
    assert Interval(0.476, 0.435, 0.51, 40).format() == "47.6 ±4.1"
    assert Interval(0.5, 0.45, 0.6, 10).format(digits=0) == "50 ±10"
    assert Interval(0.25, 0.2, 0.3, 8).format(scale=1.0, digits=2) == "0.25 ±0.05"
    assert Interval(0.0, 0.0, 0.0, 5).format() == "0.0 ±0.0"
    assert Interval(0.5, 0.4, 0.6, 0).format() == "–"
    assert Interval(0.5, 0.4, 0.6, 10).to_json() == {"mean": 0.5, "low": 0.4, "high": 0.6, "n": 10}
