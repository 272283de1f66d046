"""A heads file's tuned settings (`juice tune`, :func:`juice.workflow.tune`,
:func:`juice.when_to_steer.auto_tuning.tune_auto`), read and written here only.

On disk (the heads file's "tuned" object, unchanged since it was introduced; older files load):

    {"juice": {"beta_plus": 2.0, "beta_minus": -1.0, "accuracy": ..., "grid": [...], ...},
               # or, for the shipped heads: "beta_range": {"beta_plus": [0, 5], "beta_minus": [-3, 0]}
     "june":  {"beta_plus": ..., "beta_minus": ..., ...},
     "ph3":   {"k": 3, "pruned": ["L1H0", ...], "accuracy": ..., "grid": [...], ...},
     "auto":  {... juice.when_to_steer.auto.AutoPolicy.to_json() ..., "validation": ..., "data": ...},
     "data":  {"file": ..., "digest": ..., "rows": ...}}   # the validation data's provenance

A method's record keeps everything its tuner wrote (accuracies, the grid, the degeneration
guard); this module types the parts the methods run with: the betas (:class:`TunedBetas`),
PH3's k and heads (:class:`TunedPh3`), auto's policy (its JSON, parsed by
:meth:`juice.when_to_steer.auto.AutoPolicy.from_json`), and the provenance.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

PROVENANCE = "data"
"""The key of the validation data's provenance (file, digest, rows) in the "tuned" object."""

DEGENERATION_MARGIN = 10.0
"""Percentage points of degenerate outputs (:mod:`juice.eval.degeneration`) a tuned setting may add
to Original's: `juice tune` (:func:`juice.workflow.tune`) and auto's fit
(:func:`juice.when_to_steer.auto_tuning.fit_policy`) never choose one that adds more."""


class TunedSettingsError(ValueError):
    """A heads file's "tuned" object is malformed (the message names the method and the field)."""


@dataclass(frozen=True)
class TunedBetas:
    """A steering's tuned (beta+, beta-)."""

    beta_plus: float
    beta_minus: float


@dataclass(frozen=True)
class TunedPh3:
    """PH3's tuned k and the heads it prunes (names like "L6H3")."""

    k: int
    pruned: tuple[str, ...]


def _number(method: str, record: Mapping[str, Any], key: str) -> float:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TunedSettingsError(f"tuned.{method}.{key} must be a finite number, not {value!r}")
    return float(value)


def _check(method: str, record: Any) -> None:
    if not isinstance(record, Mapping):
        raise TunedSettingsError(f"tuned.{method} must be an object, not {type(record).__name__}")
    if "beta_plus" in record or "beta_minus" in record:
        _number(method, record, "beta_plus")
        _number(method, record, "beta_minus")
    if "pruned" in record:   # PH3's record: the heads it zeroes and their number
        if not isinstance(record["pruned"], list) or not all(isinstance(h, str) for h in record["pruned"]):
            raise TunedSettingsError(f"tuned.{method}.pruned must be a list of head names like 'L6H3'")
        if not isinstance(record.get("k"), int) or isinstance(record.get("k"), bool):
            raise TunedSettingsError(f"tuned.{method}.k must be an integer, not {record.get('k')!r}")


class TunedSettings(Mapping[str, Mapping[str, Any]]):
    """A heads file's "tuned" object: method -> its record, and the provenance (module docstring).

    Read-only; the writers return a new object (:meth:`with_record`, :meth:`with_provenance`).
    As a mapping it is the file's object, key by key (`"auto" in tuned`, `tuned["juice"]`).

    Raises:
        TunedSettingsError: on construction, a record that is not an object, betas that are not
            finite numbers, PH3 heads that are not names or a k that is not an integer.
    """

    def __init__(self, raw: Mapping[str, Any] | None = None):
        raw = dict(raw or {})
        for method, record in raw.items():
            if method != PROVENANCE:
                _check(method, record)
        self._raw = raw

    @classmethod
    def of(cls, value: "TunedSettings | Mapping[str, Any] | None") -> "TunedSettings":
        """`value` as tuned settings (a plain object is read and checked)."""
        return value if isinstance(value, TunedSettings) else cls(value)

    # the mapping: the file's object
    def __getitem__(self, key: str) -> Mapping[str, Any]:
        return self._raw[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)

    def __repr__(self) -> str:
        return f"TunedSettings({self._raw!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self._raw) == dict(other)

    # typed reads
    def betas(self, method: str) -> TunedBetas | None:
        """`method`'s tuned betas, or None where the file holds none."""
        record = self._raw.get(method)
        if not isinstance(record, Mapping) or "beta_plus" not in record or "beta_minus" not in record:
            return None
        return TunedBetas(float(record["beta_plus"]), float(record["beta_minus"]))

    def beta_range(self, method: str) -> tuple[tuple[float, float], tuple[float, float]] | None:
        """The betas `method` was tuned over, ((lowest, highest) beta+, (lowest, highest) beta-):
        the record's "beta_range" (`{"beta_plus": [lo, hi], "beta_minus": [lo, hi]}`, written
        for the shipped heads from `juice reproduce`'s grid), else the span of its "grid" points
        (`juice tune`); None where the file says neither (a request's betas are then not
        compared with anything)."""
        record = self._raw.get(method)
        if not isinstance(record, Mapping):
            return None
        given = record.get("beta_range")
        if isinstance(given, Mapping) and all(isinstance(given.get(k), list) and len(given[k]) == 2
                                              for k in ("beta_plus", "beta_minus")):
            (a, b), (c, d) = given["beta_plus"], given["beta_minus"]
            return (float(a), float(b)), (float(c), float(d))
        points = [p for p in record.get("grid") or () if isinstance(p, Mapping) and "beta_plus" in p
                  and "beta_minus" in p]
        if not points:
            return None
        plus, minus = [float(p["beta_plus"]) for p in points], [float(p["beta_minus"]) for p in points]
        return (min(plus), max(plus)), (min(minus), max(minus))

    @property
    def ph3(self) -> TunedPh3 | None:
        """PH3's tuned k and heads, or None."""
        record = self._raw.get("ph3")
        if not isinstance(record, Mapping) or "pruned" not in record:
            return None
        return TunedPh3(int(record["k"]), tuple(record["pruned"]))

    @property
    def auto(self) -> Mapping[str, Any] | None:
        """auto's policy as saved (:meth:`juice.when_to_steer.auto.AutoPolicy.from_json` reads it), or None."""
        record = self._raw.get("auto")
        return record if isinstance(record, Mapping) and record else None

    def holds(self, method: str) -> bool:
        """The file holds a record for `method` (a non-empty object)."""
        return bool(self._raw.get(method)) and method != PROVENANCE

    @property
    def provenance(self) -> Mapping[str, Any] | None:
        """The validation data the settings were tuned on (file, digest, rows), or None."""
        return self._raw.get(PROVENANCE)

    # writers
    def with_record(self, method: str, record: Mapping[str, Any]) -> "TunedSettings":
        """A copy with `method`'s record replaced by `record` (checked)."""
        return TunedSettings({**self._raw, method: dict(record)})

    def with_provenance(self, where: Mapping[str, Any]) -> "TunedSettings":
        """A copy with the validation data's provenance replaced."""
        return TunedSettings({**self._raw, PROVENANCE: dict(where)})

    def to_json(self) -> dict[str, Any]:
        """The heads file's "tuned" object."""
        return dict(self._raw)


__all__ = ["PROVENANCE", "TunedBetas", "TunedPh3", "TunedSettings", "TunedSettingsError"]
