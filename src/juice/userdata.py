"""Your own conflict examples for head identification (`juice identify --data FILE`).

Accepted files:

- JSONL or CSV with the columns `prompt`, `target` (the answer to promote), optional `other` (the
  answer to suppress; PH3 and the tables' "follows context" use it), optional `conflict_type` (any
  label, default "all"; Stage 1's consistency filter, paper Alg. 3, keeps heads whose score is
  non-negative for every label present), optional `aliases` (other accepted forms of the target:
  a JSON list, or in CSV a "|"-separated string) and optional `question` (the prompt without its
  context, for CAD and AdaCAD);
- the paper's ParaConflict JSON (a list of items): three rows per item, one per conflict type,
  target the parametric answer with its aliases (direction "parametric") or the context answer
  ("contextual");
- an NQ-Swap JSONL (rows with `sub_answer`) or a MemoTrap CSV (columns `classes`, `answer_index`):
  one row per item, label "context", target the contextual answer ("contextual") or the
  memorised one ("parametric"), with the question-only prompt.

Each row becomes a :class:`juice.stage1.ScoringPrompt` whose target is the first token of
`target` after the prompt.
"""

from __future__ import annotations

import csv
import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from juice.data.records import CONFLICT_TYPES, CONTEXT_TYPE, Direction


@dataclass(frozen=True)
class ConflictRow:
    """One example: `prompt` ends right before the answer; `target` is promoted."""

    prompt: str
    target: str
    other: str | None = None
    conflict_type: str = "all"
    aliases: tuple[str, ...] = ()
    question: str | None = None

    @property
    def answers(self) -> tuple[str, ...]:
        """The accepted answers: the target, then its aliases."""
        return (self.target, *self.aliases)

    def to_json(self) -> dict:
        out = asdict(self)
        out["aliases"] = list(self.aliases)
        return out


def _row(where: str, record: object) -> ConflictRow:
    if not isinstance(record, dict):
        raise ValueError(f"{where}: a row must be an object with prompt and target")
    prompt, target = record.get("prompt"), record.get("target")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError(f"{where}: no prompt")
    if not isinstance(target, str) or not target.strip():
        raise ValueError(f"{where}: no target (the answer to promote)")
    other = record.get("other") or None
    label = record.get("conflict_type") or "all"
    if other is not None and not isinstance(other, str):
        raise ValueError(f"{where}: other must be text")
    aliases = record.get("aliases") or ()
    if isinstance(aliases, str):
        aliases = [a for a in aliases.split("|")]
    if not isinstance(aliases, (list, tuple)) or not all(isinstance(a, str) and a.strip() for a in aliases):
        raise ValueError(f"{where}: aliases must be a list of non-empty texts")
    question = record.get("question") or None
    if question is not None and (not isinstance(question, str) or not question.strip()):
        raise ValueError(f"{where}: question must be text")
    return ConflictRow(prompt, target, other, str(label), tuple(aliases), question)


def load_rows(path: str | Path, direction: str = "parametric") -> list[ConflictRow]:
    """The rows of `path` (module docstring), in file order.

    Raises:
        FileNotFoundError: no such file.
        ValueError: an unknown direction, an unknown format, a malformed or empty file, a row
            without prompt or target (the message names the file and the row).
    """
    direction = Direction.parse(direction)
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no data file at {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text") from None
    rows: list[ConflictRow]
    if path.suffix.lower() == ".csv":
        try:
            records = list(csv.DictReader(text.splitlines()))
        except csv.Error as err:
            raise ValueError(f"{path}: malformed CSV ({err})") from None
        if records and "classes" in records[0] and "answer_index" in records[0]:
            rows = _memotrap_rows(path, records, direction)
        else:
            rows = [_row(f"{path} row {i + 1}", r) for i, r in enumerate(records)]
    elif path.suffix.lower() == ".json":
        from juice.data.paraconflict import load_paraconflict_json

        rows = []
        for ex in load_paraconflict_json(path):
            if direction == "parametric":
                target, other, aliases = ex.answer, ex.context_answer, ex.answers[1:]
            else:
                target, other, aliases = ex.context_answer, ex.answer, ()
            rows += [ConflictRow(ex.prompts[t], target, other, t, tuple(aliases)) for t in CONFLICT_TYPES]
    else:   # JSONL
        records = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except (json.JSONDecodeError, RecursionError) as err:
                    raise ValueError(f"{path} line {n}: not JSON ({type(err).__name__})") from None
        if records and isinstance(records[0], dict) and "sub_answer" in records[0]:
            from juice.data.nqswap import parse_record

            exs = [parse_record(i, r) for i, r in enumerate(records)]
            rows = [_contextual_row(ex, direction) for ex in exs]
        else:
            rows = [_row(f"{path} line {i + 1}", r) for i, r in enumerate(records)]
    if not rows:
        raise ValueError(f"{path}: no rows")
    return rows


def _memotrap_rows(path: Path, records: list[dict], direction: str) -> list[ConflictRow]:
    from juice.data.memotrap import SUBTASKS, MemoTrapFormatError, parse_row

    subtask = next((name for name, file in SUBTASKS.items() if file == path.name), None)
    if subtask is None:
        raise ValueError(f"{path}: a MemoTrap CSV must keep its file name ({', '.join(SUBTASKS.values())})")
    out = []
    for i, r in enumerate(records):
        try:
            ex = parse_row(subtask, i, r)
        except MemoTrapFormatError as err:
            raise ValueError(str(err)) from None
        out.append(_contextual_row(ex, direction))
    return out


def _contextual_row(ex, direction: str) -> ConflictRow:
    """A contextual-dataset item as a row: target the contextual answer ("contextual") or the
    memorised one, the other as `other`, the rest of the target's answers as aliases."""
    if direction == "contextual":
        target, *aliases = ex.context_answers
        other = ex.parametric_answers[0]
    else:
        target, *aliases = ex.parametric_answers
        other = ex.context_answer
    return ConflictRow(ex.prompt, target, other, CONTEXT_TYPE, tuple(aliases), ex.question)


def file_digest(path: str | Path) -> str:
    """The first 16 hex digits of the file's SHA-256 (recorded in the heads file)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


__all__ = ["ConflictRow", "file_digest", "load_rows"]
