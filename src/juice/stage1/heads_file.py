"""The heads file: Stage 1's selection with the model fingerprint, D, the alphas and the
per-type scores (format `juice-heads/1`), and `juice tune`'s chosen settings.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from juice.data.records import ConflictExample, ContextualExample, Direction
from juice.architectures import HeadGeometry
from juice.interventions import Head, HeadSelection, check_heads
from juice.io import write_json_atomic
from juice.models import LoadedModel, fingerprint_mismatch
from juice.tuned import TunedSettings
from juice.stage1.scoring import HeadScores



class HeadsFileMismatchError(ValueError):
    """A heads file made for another model."""


class HeadOutOfRangeError(ValueError):
    """A heads file naming a head (`L<layer>H<head>`, from 0) that the model does not have."""


@dataclass
class HeadsArtifact:
    """What Stage 1 saves: the selection and everything needed to judge and reproduce it."""

    model: dict[str, Any]
    direction: str
    k: int
    alphas_positive: list[float]
    alphas_negative: list[float]
    selection: HeadSelection
    head_set: list[dict] = field(default_factory=list)
    scores: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)   # where D came from (file, digest, rows)
    tuned: TunedSettings = field(default_factory=TunedSettings)   # `juice tune`'s settings (juice.tuned)

    def __post_init__(self) -> None:
        self.tuned = TunedSettings.of(self.tuned)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": "juice-heads/1",
            "model": self.model,
            "direction": self.direction,
            "k": self.k,
            "alphas_positive": self.alphas_positive,
            "alphas_negative": self.alphas_negative,
            "positive_heads": [str(h) for h in self.selection.positive],
            "negative_heads": [str(h) for h in self.selection.negative],
            "head_set": self.head_set,
            "scores": self.scores,
            "data": self.data,
            **({"tuned": self.tuned.to_json()} if self.tuned else {}),
        }


def make_artifact(
    lm: LoadedModel, scores: HeadScores, selection: HeadSelection, k: int, direction: str,
    head_set: Sequence[ConflictExample] | Sequence[ContextualExample],
) -> HeadsArtifact:
    """Bundle a selection with the model fingerprint, D, the alphas and the per-type scores."""
    per_head = {}
    g = lm.geometry
    for sign in "+-":
        pt = scores.per_type(sign)
        per_head[sign] = {
            str(Head(l, h)): {t: round(float(pt[j, l, h]), 6) for j, t in enumerate(scores.conflict_types)}
            for l in range(g.n_layers) for h in range(g.n_heads)
        }
    return HeadsArtifact(
        model=lm.fingerprint(),
        direction=direction,
        k=k,
        alphas_positive=list(scores.alphas[: scores.n_positive]),
        alphas_negative=list(scores.alphas[scores.n_positive:]),
        selection=selection,
        head_set=[ex.to_json() for ex in head_set],
        scores={
            "positive": per_head["+"],
            "negative": per_head["-"],
            "clean_probs": {t: scores.clean_probs[j].tolist() for j, t in enumerate(scores.conflict_types)},
        },
    )


def save_heads(artifact: HeadsArtifact, path: str | Path) -> None:
    """Save a heads artifact as JSON (atomically)."""
    write_json_atomic(path, artifact.to_json())


def heads_from_json(data: Any, path: str | Path) -> HeadsArtifact:
    """A heads file's parsed JSON as a :class:`HeadsArtifact`, without a model: the one reader of
    the format, behind :func:`load_heads` and vLLM's plugin (:func:`juice.vllm.options.heads_document`),
    so both refuse the same files with the same lines.

    Raises:
        ValueError: not a juice heads file (another format, no model fingerprint, a missing field,
            a head name that does not parse, a direction that does not, a "tuned" that is not an
            object or is malformed, :mod:`juice.tuned`); one line naming `path`.
        HeadOutOfRangeError: a head outside the geometry of the file's own model fingerprint.
    """
    if not isinstance(data, dict) or data.get("format") != "juice-heads/1":
        raise ValueError(f"{path} is not a juice heads file (no 'format': 'juice-heads/1')")
    if not isinstance(data.get("model"), dict):
        raise ValueError(f"{path}: a juice heads file without its model fingerprint")
    try:
        direction = Direction.parse(data.get("direction", ""))
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
    tuned = data.get("tuned", {})
    if not isinstance(tuned, dict):
        raise ValueError(f"{path}: 'tuned' must be an object (method -> setting)")
    try:
        tuned = TunedSettings(tuned)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
    try:
        selection = HeadSelection(
            tuple(Head.parse(h) for h in data["positive_heads"]), tuple(Head.parse(h) for h in data["negative_heads"])
        )
        artifact = HeadsArtifact(
            data["model"], direction, data["k"], data["alphas_positive"], data["alphas_negative"],
            selection, data.get("head_set", []), data.get("scores", {}), data.get("data", {}), tuned,
        )
    except KeyError as missing:
        raise ValueError(f"{path}: a juice heads file without the field {missing}") from None
    except (TypeError, AttributeError, ValueError):
        raise ValueError(f"{path}: heads must be lists of names like 'L6H3'") from None
    _check_heads_in_fingerprint(selection, data["model"], path)
    return artifact


def _check_heads_in_fingerprint(selection: HeadSelection, model: dict[str, Any], path: str | Path) -> None:
    """Refuse a selection with a head outside the geometry its own model fingerprint states
    (`n_layers` x `n_heads`, where both are integers): such a file cannot be served by the model
    it names, whatever engine reads it.

    Raises:
        HeadOutOfRangeError: one line naming `path`, the head and the fingerprint's shape.
    """
    layers, heads = model.get("n_layers"), model.get("n_heads")
    if isinstance(layers, int) and isinstance(heads, int):
        try:
            check_heads([*selection.positive, *selection.negative], HeadGeometry(layers, heads, 0))
        except IndexError as err:
            raise HeadOutOfRangeError(f"{path}: {err} (its model fingerprint's shape)") from None


def check_selection_fits(selection: HeadSelection, geometry: HeadGeometry, path: str | Path,
                         model: str = "the served model") -> None:
    """Refuse a heads file's selection with a head outside `geometry`, the model that will steer
    with it (juice's engine, `juice serve`, the vLLM plugin at start: one rule for all).

    Raises:
        HeadOutOfRangeError: one line naming `path`, the head and `model`'s shape.
    """
    for head in (*selection.positive, *selection.negative):
        if not (0 <= head.layer < geometry.n_layers and 0 <= head.head < geometry.n_heads):
            raise HeadOutOfRangeError(f"{path}: head {head} is outside {model}, which has {geometry.n_layers} layers "
                                      f"x {geometry.n_heads} heads (L0H0 to L{geometry.n_layers - 1}H"
                                      f"{geometry.n_heads - 1})")


def read_heads_json(path: str | Path) -> Any:
    """A heads file's JSON.

    Raises:
        ValueError: unreadable, not UTF-8 text, or not JSON (one line naming `path`).
    """
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise ValueError(f"{path}: cannot read the heads file ({err.strerror})") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not a juice heads file: not UTF-8 text") from None
    except (json.JSONDecodeError, RecursionError) as err:
        raise ValueError(f"{path} is not a juice heads file: not JSON ({type(err).__name__})") from None


def load_heads(path: str | Path, lm: LoadedModel | None = None) -> HeadsArtifact:
    """Read a heads file (:func:`heads_from_json`); with `lm`, check that it was made for this model.

    Raises:
        HeadsFileMismatchError: the file's model fingerprint differs from `lm`'s.
        ValueError: not a juice heads file (:func:`read_heads_json`, :func:`heads_from_json`);
            with `lm`, a head outside the model.
    """
    artifact = heads_from_json(read_heads_json(path), path)
    if lm is not None:
        mismatch = fingerprint_mismatch(artifact.model, lm.fingerprint())
        if mismatch is not None:
            raise HeadsFileMismatchError(f"{path} {mismatch}")
        check_selection_fits(artifact.selection, lm.geometry, path, f"model {lm.name!r}")
    return artifact


