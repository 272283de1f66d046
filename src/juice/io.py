"""Files that survive interruptions: atomic JSON writes, per-unit checkpoints of long sweeps,
and stage files keyed on everything a stage depends on (used by Stage 1, PH3 and both pipelines)."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def read_jsonl(path: str | Path) -> list[Any]:
    """The rows of a JSON-lines file, blank lines skipped.

    Raises:
        ValueError: a line that is not JSON (`<path>:<line>: not JSON (<why>)`).
    """
    rows = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{n}: not JSON ({err.msg})") from None
    return rows


def json_text(data: Any) -> str:
    """`data` as :func:`write_json_atomic` writes it (indent 1, UTF-8 kept, anything else by its `str`)."""
    return json.dumps(data, indent=1, ensure_ascii=False, default=str)


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Write JSON to a temporary file beside `path`, then rename it into place."""
    write_text_atomic(path, json_text(data))


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write text to a temporary file beside `path`, then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class StageFiles:
    """Stage files under `<out>/state/`, each tagged with the key of the settings it depends on."""

    def __init__(self, folder: Path):
        self.folder = folder

    def load(self, name: str, key: str) -> Any | None:
        path = self.folder / f"{name}.json"
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            return None  # a torn file from an interrupted write of an older version: recompute
        return data["value"] if data.get("key") == key else None

    def save(self, name: str, key: str, value: Any) -> None:
        write_json_atomic(self.folder / f"{name}.json", {"key": key, "value": value})


def settings_key(values: dict) -> str:
    """A stage's key: the first 16 hex digits of the SHA-256 of `values` as sorted JSON (anything
    not JSON-serializable by its `str`)."""
    return hashlib.sha256(json.dumps(values, default=str, sort_keys=True).encode()).hexdigest()[:16]


class UnitCheckpoint:
    """Results of a long sweep, one entry per unit of work (a prompt), so an interrupted sweep
    resumes where it stopped.

    The file holds `{"scope": ..., "units": {unit id: value}}` and is rewritten atomically after
    every unit (:func:`write_json_atomic`). Unit ids hash everything the value depends on (prompt,
    target, interventions); `scope` (e.g. the model fingerprint) guards against another model:
    a file with another scope is ignored and overwritten.
    """

    def __init__(self, path: str | Path, scope: Any):
        self.path = Path(path)
        self.scope = json.loads(json.dumps(scope, default=str))
        self.units: dict[str, Any] = {}
        if self.path.is_file():
            try:
                data = json.loads(self.path.read_text(encoding="utf-8"))
            except json.JSONDecodeError:
                data = {}
            if data.get("scope") == self.scope:
                self.units = data.get("units", {})

    @staticmethod
    def unit_id(*parts: Any) -> str:
        return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:24]

    def get(self, unit: str) -> Any | None:
        return self.units.get(unit)

    def put(self, unit: str, value: Any) -> None:
        self.units[unit] = value
        write_json_atomic(self.path, {"scope": self.scope, "units": self.units})


__all__ = ["StageFiles", "UnitCheckpoint", "json_text", "settings_key", "write_json_atomic", "write_text_atomic"]
