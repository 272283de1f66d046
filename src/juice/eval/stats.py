"""Statistics for result tables: the percentile bootstrap of a mean, and of a paired difference.

Each table cell is an accuracy over n items (each correct or not); its 95% interval is the
percentile bootstrap over items (Efron and Tibshirani 1993, ch. 13): draw n items with
replacement `resamples` times, take the 2.5th and 97.5th percentiles of the resampled means.
Comparing two methods on the same items, the paired bootstrap resamples items and takes the
mean of the per-item differences, so item difficulty cancels. Seeded: the same seed gives the
same interval. An average over strata (domains) resamples within each stratum
(:func:`stratified_interval`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MIN_RESAMPLES = 1000


@dataclass(frozen=True)
class Interval:
    """A mean with its bootstrap interval, in the unit of the data (a fraction for accuracy).

    Attributes:
        mean: the sample mean (NaN when n = 0).
        low, high: the interval's bounds (NaN when n = 0).
        n: the number of items.
    """

    mean: float
    low: float
    high: float
    n: int

    def to_json(self) -> dict:
        def clean(v: float) -> float | None:
            return None if math.isnan(v) else v

        return {"mean": clean(self.mean), "low": clean(self.low), "high": clean(self.high), "n": self.n}

    @classmethod
    def from_json(cls, data: dict) -> "Interval":
        """The interval :meth:`to_json` wrote (None: NaN)."""
        def value(v: float | None) -> float:
            return math.nan if v is None else float(v)

        return cls(value(data["mean"]), value(data["low"]), value(data["high"]), int(data["n"]))

    @property
    def half_width(self) -> float:
        """The larger distance from the mean to a bound (the interval may be asymmetric)."""
        return max(self.mean - self.low, self.high - self.mean)

    def format(self, scale: float = 100.0, digits: int = 1) -> str:
        """E.g. "47.6 ±4.1" (mean and half-width, times `scale`); "–" when n = 0."""
        if self.n == 0 or math.isnan(self.mean):
            return "–"
        return f"{self.mean * scale:.{digits}f} ±{self.half_width * scale:.{digits}f}"


def _check(resamples: int, confidence: float) -> None:
    if resamples < MIN_RESAMPLES:
        raise ValueError(f"the bootstrap needs at least 1,000 resamples, got {resamples}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie strictly between 0 and 1, got {confidence}")


def _vector(values, name: str) -> np.ndarray:
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional (one value per item), got shape {x.shape}")
    return x


def _percentile_interval(values: np.ndarray, resamples: int, confidence: float, seed: int) -> Interval:
    n = len(values)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, n, size=(resamples, n))].mean(axis=1)
    tail = (1 - confidence) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return Interval(float(values.mean()), float(low), float(high), n)


def bootstrap_interval(
    values: Sequence[bool] | Sequence[float], *, resamples: int = 2000, confidence: float = 0.95, seed: int = 0
) -> Interval:
    """Percentile bootstrap interval of the mean of `values` (`[n]`, bools or floats).

    Memory: a `[resamples, n]` index matrix and its values (32 MB for 2,000 resamples of 1,000
    items).

    Returns:
        The sample mean and the interval's bounds, in the unit of `values`; all NaN when n = 0.

    Raises:
        ValueError: fewer than 1,000 resamples, a confidence outside (0, 1), or `values` not 1-D.
    """
    _check(resamples, confidence)
    return _percentile_interval(_vector(values, "values"), resamples, confidence, seed)


def paired_difference_interval(
    a: Sequence[bool] | Sequence[float], b: Sequence[bool] | Sequence[float], *,
    resamples: int = 2000, confidence: float = 0.95, seed: int = 0,
) -> Interval:
    """Paired bootstrap interval of mean(a - b): `a[i]` and `b[i]` (`[n]` each) are two methods'
    outcomes on the same item i; items are resampled together (one index draw for both).

    Returns:
        The mean difference (equal to mean(a) - mean(b)) and its interval; all NaN when n = 0.

    Raises:
        ValueError: `a` and `b` differ in length or are not 1-D; bad resamples or confidence.
    """
    _check(resamples, confidence)
    x, y = _vector(a, "a"), _vector(b, "b")
    if len(x) != len(y):
        raise ValueError(f"paired samples differ in length: {len(x)} and {len(y)}")
    return _percentile_interval(x - y, resamples, confidence, seed)


def stratified_interval(
    strata: Sequence[Sequence[bool] | Sequence[float]], *, resamples: int = 2000, confidence: float = 0.95,
    seed: int = 0,
) -> Interval:
    """Percentile bootstrap interval of the mean of the strata's means (e.g. a table's "Average"
    over domains: the paper averages per-domain accuracies). Each stratum (`[n_s]`) is resampled
    within itself, with its own size; empty strata are left out. For a paired difference, pass
    each stratum's per-item differences `a - b`.

    Returns:
        The mean of the non-empty strata's means, its interval, and n = the items over all strata;
        all NaN when every stratum is empty.

    Raises:
        ValueError: bad resamples or confidence; a stratum that is not 1-D.
    """
    _check(resamples, confidence)
    parts = [x for x in (_vector(v, "stratum") for v in strata) if len(x)]
    if not parts:
        return Interval(math.nan, math.nan, math.nan, 0)
    rng = np.random.default_rng(seed)
    means = np.mean([x[rng.integers(0, len(x), size=(resamples, len(x)))].mean(axis=1) for x in parts], axis=0)
    tail = (1 - confidence) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return Interval(float(np.mean([x.mean() for x in parts])), float(low), float(high), sum(len(x) for x in parts))
