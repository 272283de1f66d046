"""A study's outcomes: per context item, every decoded method's verdicts and the first step's
signals, all that routing a policy offline needs (issue 77, "decode once, route offline"; juice's
measurement, not the paper's).

The study (:mod:`juice.when_to_steer.study`) decodes every method once on both halves and writes
them here (`outcomes.json`); the pre-registered analysis (:mod:`juice.when_to_steer.preregistered`),
the do-no-harm table and the risk-coverage curves (:mod:`juice.when_to_steer.harm`) read them
without a model: a policy's output on an item is its chosen candidate's, so any policy, fold,
left-out source or other dataset's fit is scored in seconds. Each half is also written alone, with
what decoded it (:func:`half_to_json`), so a study too long for one run is decoded a half per run
and joined (:func:`read_outcomes`) only where the same code, model and settings decoded both.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from juice.data.context_types import ContextItem
from juice.eval.runner import ItemResult
from juice.io import json_text
from juice.methods import row_key, row_title
from juice.when_to_steer.evaluation import QUESTION_ONLY, result_id

VERDICTS = ("use", "true", "copies", "degenerate")
"""What :class:`Outcomes` holds per method and item: the use-relevant-context verdict, the
trust-memory verdict (the output states the true answer), whether it states the passage's
answer, whether it is degenerate (:class:`juice.eval.runner.ItemResult`'s `correct`,
`follows_parametric`, `follows_context`, `degenerate`)."""


@dataclass
class Outcomes:
    """Per item (one context item of one question; every list in item order): where it is from,
    what each method decoded scored, and its first-step signals.

    Attributes:
        half: "validation" or "test" (:func:`juice.data.context_types.split_of`).
        source: its source (NQ-Swap's label, a ParaConflict domain); question: its question's uid
            within the source; item: its result id (:func:`juice.when_to_steer.evaluation.result_id`);
            context_type: gold, conflicting, irrelevant, distractor or none.
        passage: it has a passage (:func:`juice.when_to_steer.signals.has_passage`).
        signal: the first-step JSD (bits, :data:`juice.when_to_steer.signals.SIGNAL`).
        gates: gate signal name (:data:`juice.when_to_steer.signals.GATE_SIGNALS`) -> values.
        verdicts: kind (:data:`VERDICTS`) -> method (its row key, :class:`juice.methods.Row`) -> per item.
        candidates: auto's candidate name -> the row key of the method that decodes it.
        static: the static methods' row keys (the best static method is chosen among them).
        betas: auto's steered candidates' betas.

    In memory every method is its row key; :meth:`to_json` writes titles ("JuICE/2-ctx", the
    files' and the pre-registered records' format) and :meth:`from_json` keys them again.
    """

    half: list[str]
    source: list[str]
    question: list[str]
    item: list[str]
    context_type: list[str]
    passage: list[bool]
    signal: list[float]
    gates: dict[str, list[float]]
    verdicts: dict[str, dict[str, list[bool]]]
    candidates: dict[str, str] = field(default_factory=dict)
    static: list[str] = field(default_factory=list)
    betas: dict[str, tuple[float, float]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.item)

    @property
    def methods(self) -> list[str]:
        """Every decoded method's row key (and Question-only)."""
        return list(self.verdicts["use"])

    def questions(self) -> list[tuple[str, str]]:
        """Per item, its question's key (source, uid): the unit every interval resamples."""
        return list(zip(self.source, self.question))

    def known(self) -> list[bool]:
        """Per item, whether the model knows its question's answer closed-book: Question-only
        (the unmodified model on the question alone) states the true answer. False for a
        question without a none item."""
        alone = {q: v for q, t, v in zip(self.questions(), self.context_type, self.verdicts["true"][QUESTION_ONLY])
                 if t == "none"}
        return [bool(alone.get(q, False)) for q in self.questions()]

    def select(self, keep: Sequence[bool]) -> "Outcomes":
        """The items where `keep` is true, in order."""
        idx = [k for k, x in enumerate(keep) if x]
        pick = lambda seq: [seq[k] for k in idx]   # noqa: E731
        return Outcomes(pick(self.half), pick(self.source), pick(self.question), pick(self.item),
                        pick(self.context_type), pick(self.passage), pick(self.signal),
                        {n: pick(v) for n, v in self.gates.items()},
                        {kind: {m: pick(v) for m, v in per.items()} for kind, per in self.verdicts.items()},
                        dict(self.candidates), list(self.static), dict(self.betas))

    def where(self, **values: str) -> "Outcomes":
        """The items whose attributes equal `values` (e.g. `half="test"`)."""
        return self.select([all(getattr(self, k)[i] == v for k, v in values.items()) for i in range(len(self))])

    def with_method(self, name: str, verdicts: Mapping[str, Sequence[bool]]) -> "Outcomes":
        """A copy with one more method `name` whose verdicts per kind are `verdicts` (a routed
        policy's, e.g. :func:`juice.when_to_steer.preregistered.routed`).

        Raises:
            ValueError: a kind missing, or not one verdict per item.
        """
        if set(verdicts) != set(self.verdicts) or any(len(v) != len(self) for v in verdicts.values()):
            raise ValueError(f"{name}: one verdict per item for each of {', '.join(self.verdicts)}")
        return Outcomes(list(self.half), list(self.source), list(self.question), list(self.item),
                        list(self.context_type), list(self.passage), list(self.signal), dict(self.gates),
                        {kind: {**per, name: [bool(x) for x in verdicts[kind]]} for kind, per in self.verdicts.items()},
                        dict(self.candidates), list(self.static), dict(self.betas))

    def results(self, kind: str, methods: Sequence[str], values: Mapping[str, Sequence[bool]] | None = None
                ) -> list[ItemResult]:
        """:class:`juice.eval.runner.ItemResult` rows whose `correct` is `kind`'s verdict (or, per
        method, `values[method]`), for :func:`juice.when_to_steer.evaluation.question_bootstrap`."""
        rows = []
        for m in methods:
            v = values[m] if values is not None and m in values else self.verdicts[kind][m]
            for k in range(len(self)):
                rows.append(ItemResult(domain=self.source[k], subject=self.question[k],
                                       conflict_type=self.context_type[k], method=m, output="", correct=bool(v[k]),
                                       follows_context=False, p_parametric=0.0, p_context=0.0, item=self.item[k]))
        return rows

    def to_json(self) -> dict[str, Any]:
        return {"half": self.half, "source": self.source, "question": self.question, "item": self.item,
                "context_type": self.context_type, "passage": self.passage,
                "signal": [round(x, 7) for x in self.signal],
                "gates": {n: [round(x, 7) for x in v] for n, v in self.gates.items()},
                "verdicts": {kind: {row_title(m): "".join("1" if x else "0" for x in v) for m, v in per.items()}
                             for kind, per in self.verdicts.items()},
                "candidates": {c: row_title(m) for c, m in self.candidates.items()},
                "static": [row_title(m) for m in self.static],
                "betas": {c: list(b) for c, b in self.betas.items()}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Outcomes":
        return cls(list(data["half"]), list(data["source"]), list(data["question"]), list(data["item"]),
                   list(data["context_type"]), [bool(x) for x in data["passage"]], [float(x) for x in data["signal"]],
                   {n: [float(x) for x in v] for n, v in data["gates"].items()},
                   {kind: {row_key(m): [c == "1" for c in v] for m, v in per.items()}
                    for kind, per in data["verdicts"].items()},
                   {c: row_key(m) for c, m in data.get("candidates", {}).items()},
                   [row_key(m) for m in data.get("static", [])],
                   {c: (float(b[0]), float(b[1])) for c, b in data.get("betas", {}).items()})

    @classmethod
    def concatenate(cls, parts: Sequence["Outcomes"]) -> "Outcomes":
        """The items of every part, in order (the same methods in each)."""
        first = parts[0]
        join = lambda name: [x for p in parts for x in getattr(p, name)]   # noqa: E731
        return cls(join("half"), join("source"), join("question"), join("item"), join("context_type"),
                   join("passage"), join("signal"), {n: [x for p in parts for x in p.gates[n]] for n in first.gates},
                   {kind: {m: [x for p in parts for x in p.verdicts[kind][m]] for m in per}
                    for kind, per in first.verdicts.items()},
                   dict(first.candidates), list(first.static), dict(first.betas))


def outcomes_of(items: Sequence[ContextItem], results: Sequence[ItemResult], methods: Sequence[str],
                features: tuple[list[float], dict[str, list[float]], list[bool]], half: str, *,
                candidates: Mapping[str, str] | None = None, static: Sequence[str] = (),
                betas: Mapping[str, tuple[float, float]] | None = None) -> Outcomes:
    """The :class:`Outcomes` of one half from its decoded results (`methods`: row keys in
    `results`) and its first-step features (:func:`juice.when_to_steer.study.features_cached`).

    Raises:
        KeyError: a method without a result for some item.
    """
    by = {(r.domain, r.item, r.conflict_type, r.method): r for r in results}
    verdicts: dict[str, dict[str, list[bool]]] = {kind: {} for kind in VERDICTS}
    for m in methods:
        rows = [by[i.source, result_id(i), i.context_type, m] for i in items]
        verdicts["use"][m] = [bool(r.correct) for r in rows]
        verdicts["true"][m] = [bool(r.follows_parametric) for r in rows]
        verdicts["copies"][m] = [bool(r.follows_context) for r in rows]
        verdicts["degenerate"][m] = [bool(r.degenerate) for r in rows]
    signal, gates, passage = features
    return Outcomes([half] * len(items), [i.source for i in items], [i.uid for i in items],
                    [result_id(i) for i in items], [i.context_type for i in items], list(passage), list(signal),
                    {n: list(v) for n, v in gates.items()}, verdicts, dict(candidates or {}), list(static),
                    dict(betas or {}))


HALVES = ("validation", "test")
"""The halves of a study, in the order its `outcomes.json` holds them."""

HALF_FORMAT = "juice-outcomes-half/1"
"""The format of one half's outcomes file (:func:`half_to_json`)."""


def outcomes_text(o: Outcomes) -> str:
    """`o` as the study writes `outcomes.json` (:func:`juice.io.write_json_atomic`): the text whose
    SHA-256 a pre-registered record holds (:func:`outcomes_sha256`)."""
    return json_text(o.to_json())


def outcomes_sha256(o: Outcomes) -> str:
    """The SHA-256 (hex) of :func:`outcomes_text`: the same whether `o` was read from one
    `outcomes.json` or joined from its two halves (:func:`read_outcomes`)."""
    return hashlib.sha256(outcomes_text(o).encode("utf-8")).hexdigest()


def half_to_json(o: Outcomes, decoding: Mapping[str, Any]) -> dict[str, Any]:
    """One half's outcomes file: `o` (every item of one half) and how it was decoded (`decoding`:
    the keys of the decoding code, the first-step signals' code, the model's fingerprint and the
    methods' settings, :func:`juice.when_to_steer.study.run_study`), so two
    halves decoded apart, in different runs or on different machines, are joined only when the
    same code decoded the same model with the same settings (:func:`read_outcomes`).

    Raises:
        ValueError: `o` holds items of both halves, or none.
    """
    halves = set(o.half)
    if len(halves) != 1:
        raise ValueError(f"a half's outcomes hold the items of one half, not {sorted(halves) or 'none'}")
    return {"format": HALF_FORMAT, "half": o.half[0], "decoding": dict(decoding), "outcomes": o.to_json()}


def read_outcomes(folder: str | Path) -> Outcomes:
    """A decoded study's outcomes from `folder`: its `outcomes.json`, or else its two halves'
    files (`outcomes-validation.json`, `outcomes-test.json`, :func:`half_to_json`) joined in
    that order, which is what `outcomes.json` holds when one run decodes both.

    Raises:
        FileNotFoundError: neither `outcomes.json` nor both halves' files.
        ValueError: a half's file holds another half, or the halves were decoded by different
            code, models or settings (the key that differs is named).
    """
    folder = Path(folder)
    whole = folder / "outcomes.json"
    if whole.is_file():
        return Outcomes.from_json(json.loads(whole.read_text(encoding="utf-8")))
    paths = [folder / f"outcomes-{half}.json" for half in HALVES]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"{folder}: no outcomes.json, and no {' or '.join(missing)} to join")
    parts = [json.loads(p.read_text(encoding="utf-8")) for p in paths]
    for half, part in zip(HALVES, parts):
        if part.get("format") != HALF_FORMAT or part.get("half") != half:
            raise ValueError(f"{folder / f'outcomes-{half}.json'}: not the {half} half's outcomes ({HALF_FORMAT})")
    first, second = (p["decoding"] for p in parts)
    for key in sorted(set(first) | set(second)):
        if first.get(key) != second.get(key):
            raise ValueError(f"{folder}: the halves were decoded with different {key} "
                             f"({first.get(key)!r} and {second.get(key)!r}); decode both with the same code")
    return Outcomes.concatenate([Outcomes.from_json(p["outcomes"]) for p in parts])


__all__ = ["HALF_FORMAT", "HALVES", "Outcomes", "VERDICTS", "half_to_json", "outcomes_of", "outcomes_sha256",
           "outcomes_text", "read_outcomes"]
