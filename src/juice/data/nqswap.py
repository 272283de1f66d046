"""NQ-Swap (Longpre et al. 2021): Natural Questions passages whose answer entity was substituted
(paper Sec. 2.2). The contextual answer is `sub_answer` (the entity now in `sub_context`); the
parametric answer is `org_answer`.

Prompt (issue 6): `Context: {sub_context}\\nQuestion: {question}?\\nAnswer:`. The passages carry
Natural Questions' HTML markup (`<P>`, `</P>`, `<Table>`, `<Th colspan="2">`, `<Li>`, ...): every tag is
removed and white space collapsed. The question-only prompt (CAD's no-context branch) is
`Question: {question}?\\nAnswer:`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

from juice.data.records import ContextualExample

HUB_ID = "pminervini/NQ-Swap"
_TAG = re.compile(r"</?[A-Za-z][^<>]*>")


def strip_markup(text: str) -> str:
    """Remove HTML-like tags and collapse white space.

    >>> strip_markup('<P> The season contained 775 episodes . </P> <Th colspan="2"> x')
    'The season contained 775 episodes . x'
    """
    return " ".join(_TAG.sub(" ", text).split())


def question_prompt(question: str) -> str:
    return f"Question: {question.strip().rstrip('?')}?\nAnswer:"


def context_prompt(context: str, question: str) -> str:
    return f"Context: {strip_markup(context)}\n{question_prompt(question)}"


def parse_record(index: int, record: dict) -> ContextualExample:
    """One NQ-Swap record as a :class:`ContextualExample`.

    Raises:
        ValueError: a field is missing or an answer list is empty.
    """
    try:
        if not isinstance(record, dict):
            raise TypeError(f"a row must be a JSON object, got {type(record).__name__}")
        question, context = record["question"], record["sub_context"]
        sub, org = record["sub_answer"], record["org_answer"]
        sub = [sub] if isinstance(sub, str) else list(sub)
        org = [org] if isinstance(org, str) else list(org)
        if not all(isinstance(t, str) for t in (question, context, *sub, *org)):
            raise TypeError("question, context and answers must be text")
        return ContextualExample(
            dataset="nqswap", uid=str(index), prompt=context_prompt(context, question),
            question=question_prompt(question), context_answers=tuple(sub), parametric_answers=tuple(org),
            kind="qa", metric="nqswap",
        )
    except KeyError as err:
        raise ValueError(f"NQ-Swap row {index}: missing field {err}") from None
    except (TypeError, ValueError) as err:
        raise ValueError(f"NQ-Swap row {index}: {err}") from None


def _records(source: str | Path) -> Iterable[dict]:
    path = Path(source)
    if path.is_dir():
        path = path / "nqswap.jsonl"
    if path.is_file():
        with path.open(encoding="utf-8", errors="strict") as f:
            try:
                for n, line in enumerate(f, 1):
                    if line.strip():
                        try:
                            yield json.loads(line)
                        except (json.JSONDecodeError, RecursionError) as err:
                            raise ValueError(f"NQ-Swap {path} line {n}: not JSON ({err})") from None
            except UnicodeDecodeError:
                raise ValueError(f"NQ-Swap {path}: not UTF-8 text") from None
        return
    if "/" in str(source) and not path.parent.exists():
        try:
            from datasets import load_dataset
        except ImportError as err:  # pragma: no cover - needs a network and `datasets`
            raise ImportError(f"loading {source!r} from the hub needs `pip install datasets`") from err
        yield from load_dataset(str(source), split="dev")
        return
    raise FileNotFoundError(f"NQ-Swap file not found: {path}")


def read_records(source: str | Path = HUB_ID) -> list[dict]:
    """NQ-Swap's raw rows (`question`, `org_context`, `org_answer`, `sub_context`, `sub_answer`),
    from the sources :func:`load_nqswap` reads (the context types of
    :mod:`juice.data.context_types` need the original passage too).

    Raises:
        As :func:`load_nqswap` for a missing file or a line that is not JSON.
    """
    return list(_records(source))


def load_nqswap(source: str | Path = HUB_ID) -> list[ContextualExample]:
    """Every NQ-Swap row.

    Args:
        source: a JSONL file, a folder holding `nqswap.jsonl` (e.g. `../shared/data/nqswap`), or a
            Hugging Face dataset id (default `pminervini/NQ-Swap`, split "dev"; needs a network and
            the `datasets` package).

    Raises:
        FileNotFoundError: no such file or folder (and not a hub id).
        ValueError: a line that is not JSON, a row that misses a field or holds a field that is
            not text, an empty answer (the message names the row).
    """
    return [parse_record(i, r) for i, r in enumerate(_records(source))]
