"""Heads files shipped in the package for the embedded models, so that a newcomer steers without
making one: Gemma 3 270M (`gemma-3-270m`) and SmolLM2-135M (`smollm2-135m`), each toward memory
(`parametric`) and toward the context (`contextual`).

Each file is the heads file of the main job (`juice reproduce`, the paper's protocol: exact
Stage 1 on D, Alg. 2) with the betas that job tuned for D's own domain as its tuned settings:
World Capital's for the parametric heads (Table 1), NQ-Swap's for the contextual heads (Table 2,
as the when-to-steer study uses them). Its "provenance" object records the commands, the commit,
the ids of D and of the validation items, the tuned betas with their validation accuracy and
degeneration, and the model's fingerprint is the file's "model" as in every heads file.
`scripts/ship-heads.sh` remakes them (:mod:`juice.experiments.shipped_heads`).

A shipped file is chosen by the loaded model's fingerprint (:func:`juice.models.fingerprint_mismatch`),
so the same weights loaded from their `.gguf` path find it too.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from juice.data.records import Direction
from juice.models import EMBEDDED_MODELS, LoadedModel, fingerprint_mismatch
from juice.stage1.heads_file import HeadsArtifact, heads_from_json

SHIPPED_DIR = Path(__file__).with_name("shipped")
"""The folder of the shipped heads files, `<model alias>.<direction>.json`."""

log = logging.getLogger("juice")


class NoShippedHeadsError(ValueError):
    """No heads file ships for this model: the message says how to make one."""


def shipped_path(model: str, direction: str | Direction = "parametric") -> Path:
    """The path of the shipped heads file for an embedded alias and a direction (it may not exist)."""
    return SHIPPED_DIR / f"{model}.{Direction.parse(direction).value}.json"


def how_to_make(name: str, direction: Direction) -> str:
    """The line that says no heads ship for `name` and how to make them."""
    flag, made = ("", "heads.json") if direction is Direction.PARAMETRIC else (" --direction contextual",
                                                                            "heads_contextual.json")
    return (f"no {direction.value} heads file ships for {name!r} (juice ships them for "
            f"{' and '.join(m for m in EMBEDDED_MODELS if shipped_path(m, direction).is_file())}): make one with `juice reproduce --model {name}{flag}` "
            f"(juice-output/{made}) or, on your rows, `juice identify --model {name} --data rows.jsonl{flag} "
            f"--out heads.json` and `juice tune --heads heads.json --data validation.jsonl`; then pass it")


def shipped_files(lm: LoadedModel) -> dict[Direction, Path]:
    """The shipped heads files that fit `lm` (by fingerprint and tokenizer), per direction; empty
    for a model juice ships none for."""
    mine = lm.fingerprint()
    found = {}
    for direction in Direction:
        for path in sorted(SHIPPED_DIR.glob(f"*.{direction.value}.json")):
            model = json.loads(path.read_text(encoding="utf-8"))["model"]
            if fingerprint_mismatch(model, mine) is None \
                    and model.get("tokenizer_sha256_16") == mine.get("tokenizer_sha256_16"):
                found[direction] = path
                break
    return found


def shipped_heads(lm: LoadedModel, direction: str | Direction = "parametric") -> HeadsArtifact:
    """The shipped heads of `lm` toward `direction`, found by the model's fingerprint
    (:func:`shipped_files`); logs one INFO line on the `juice` logger (:func:`describe`).

    Args:
        lm: a loaded model (:func:`juice.load_model`).
        direction: "parametric" (toward memory) or "contextual" (toward the context); the
            aliases :meth:`juice.data.records.Direction.parse` reads.

    Returns:
        The heads artifact, with its tuned betas (JuICE's and JuNE's).

    Raises:
        NoShippedHeadsError: no shipped file fits the model (one line saying how to make one).
        ValueError: an unknown direction.
    """
    direction = Direction.parse(direction)
    path = shipped_files(lm).get(direction)
    if path is None:
        raise NoShippedHeadsError(how_to_make(lm.name, direction))
    log.info(describe(path))
    return heads_from_json(json.loads(path.read_text(encoding="utf-8")), path)


def describe(path: Path) -> str:
    """One line on a shipped heads file: which, for which direction, from which command, and its
    tuned betas."""
    data = json.loads(path.read_text(encoding="utf-8"))
    prov = data.get("provenance", {})
    betas = ", ".join(f"{m} ({b['beta_plus']:g}, {b['beta_minus']:g})" for m, b in data.get("tuned", {}).items()
                      if isinstance(b, dict) and "beta_plus" in b)
    return (f"juice: the shipped {data['direction']} heads of {data['model'].get('name')} "
            f"({path.name}: `{prov.get('command', '?')}` at {prov.get('commit', '?')}; tuned {betas})")


__all__ = ["NoShippedHeadsError", "SHIPPED_DIR", "describe", "how_to_make", "shipped_files", "shipped_heads",
           "shipped_path"]
