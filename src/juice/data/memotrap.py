"""MemoTrap (Liu and Liu 2023, Inverse Scaling Prize; MIT license): four subtasks that ask for a
continuation deviating from a memorised saying (paper Sec. 2.2, App. D.1).

Source format: one CSV per subtask with columns `prompt`, `classes` (a Python-literal list of two
continuations, parsed with :func:`ast.literal_eval`) and `answer_index` (the continuation that
obeys the instruction: the contextual answer; the other class is the memorised one). Prompts may
span several lines (quoted CSV fields).

The question-only prompt (CAD's no-context branch) drops the part of the prompt that carries the
instruction; choices made here, per subtask:

- Proverb Ending, Hate Speech Ending: everything up to the instruction's colon (the first ": ")
  is the context; the saying after it is the question.
- Proverb Translation: the instruction and the foreign sentence are the context; the English
  beginning after the last line break is the question.
- History of Science QA: the first line (the question about the event) is the context; the two
  options and "Answer:" are the question.
"""

from __future__ import annotations

import ast
import csv
import re
from pathlib import Path

from juice.data.records import ContextualExample

SUBTASKS: dict[str, str] = {
    "proverb_ending": "1-proverb-ending.csv",
    "proverb_translation": "2-proverb-translation.csv",
    "hate_speech_ending": "3-hate-speech-ending.csv",
    "history_of_science_qa": "4-history-of-science-qa.csv",
}
TITLES: dict[str, str] = {
    "proverb_ending": "Proverb Ending",
    "proverb_translation": "Proverb Translation",
    "hate_speech_ending": "Hate Speech Ending",
    "history_of_science_qa": "History of Science QA",
}
KIND = {"proverb_ending": "completion", "proverb_translation": "completion",
        "hate_speech_ending": "completion", "history_of_science_qa": "qa"}

_INSTRUCTION = re.compile(r"^[^\n]*?:\s", re.DOTALL)


class MemoTrapFormatError(ValueError):
    """A MemoTrap row that does not parse (bad classes, answer index or prompt layout)."""


def question_part(subtask: str, prompt: str) -> str:
    """The prompt without its instruction/context (see the module docstring for the rule).

    Raises:
        MemoTrapFormatError: the prompt does not have the subtask's layout.
    """
    if subtask in ("proverb_ending", "hate_speech_ending"):
        match = _INSTRUCTION.match(prompt)
        rest = prompt[match.end():] if match else ""
    elif subtask == "proverb_translation":
        rest = prompt.rsplit("\n", 1)[-1] if "\n" in prompt else ""
    elif subtask == "history_of_science_qa":
        rest = prompt.split("\n", 1)[1] if "\n" in prompt else ""
    else:
        raise ValueError(f"unknown MemoTrap subtask {subtask!r}; choose from {sorted(SUBTASKS)}")
    if not rest.strip() or rest == prompt:
        raise MemoTrapFormatError(f"{subtask}: cannot find the instruction in prompt {prompt[:80]!r}")
    return rest


def parse_row(subtask: str, index: int, row: dict[str, str]) -> ContextualExample:
    """One CSV row as a :class:`ContextualExample`.

    Raises:
        MemoTrapFormatError: malformed classes or answer index, or an unexpected prompt layout.
    """
    try:
        if row.get("classes") is None or row.get("answer_index") is None or row.get("prompt") is None:
            raise KeyError("prompt, classes and answer_index")
        classes = ast.literal_eval(row["classes"])
        answer_index = int(row["answer_index"])
    except (ValueError, SyntaxError, KeyError, TypeError, MemoryError, RecursionError) as err:
        raise MemoTrapFormatError(f"{subtask} row {index}: {type(err).__name__}: {err}") from None
    if (not isinstance(classes, (list, tuple)) or len(classes) != 2 or answer_index not in (0, 1)
            or not all(isinstance(c, str) for c in classes)):
        raise MemoTrapFormatError(f"{subtask} row {index}: expected two text classes and an index 0/1, got "
                                  f"{classes!r}, {answer_index}")
    prompt = row["prompt"]
    try:
        return ContextualExample(
            dataset=subtask, uid=str(index), prompt=prompt, question=question_part(subtask, prompt),
            context_answers=(classes[answer_index],), parametric_answers=(classes[1 - answer_index],),
            kind=KIND[subtask], metric="memotrap",
        )
    except MemoTrapFormatError:
        raise
    except ValueError as err:   # an empty answer or prompt
        raise MemoTrapFormatError(f"{subtask} row {index}: {err}") from None


def load_memotrap(source: str | Path, subtask: str) -> list[ContextualExample]:
    """Every row of one MemoTrap subtask.

    Args:
        source: a folder holding the CSV files (e.g. `../shared/data/memotrap`), one CSV file, or
            a Hugging Face dataset id whose repository holds the original CSV files (downloaded
            with `huggingface_hub`; needs a network).
        subtask: one of :data:`SUBTASKS`.

    Raises:
        ValueError: unknown subtask.
        FileNotFoundError: no such file or folder (and not a hub id).
        MemoTrapFormatError: the file is not UTF-8 CSV, or a row does not parse (the message
            names the subtask and the row).
    """
    if subtask not in SUBTASKS:
        raise ValueError(f"unknown MemoTrap subtask {subtask!r}; choose from {sorted(SUBTASKS)}")
    path = Path(source)
    if path.is_dir():
        path = path / SUBTASKS[subtask]
    elif not path.is_file() and "/" in str(source) and not path.parent.exists():
        from huggingface_hub import hf_hub_download

        path = Path(hf_hub_download(str(source), SUBTASKS[subtask], repo_type="dataset"))
    if not path.is_file():
        raise FileNotFoundError(f"MemoTrap file not found: {path}")
    try:
        with path.open(encoding="utf-8", newline="") as f:
            return [parse_row(subtask, i, row) for i, row in enumerate(csv.DictReader(f))]
    except UnicodeDecodeError:
        raise MemoTrapFormatError(f"{subtask}: {path} is not UTF-8 text") from None
    except csv.Error as err:
        raise MemoTrapFormatError(f"{subtask}: {path}: malformed CSV ({err})") from None
