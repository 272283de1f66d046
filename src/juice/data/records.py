"""The record every parametric-direction dataset is turned into."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from enum import Enum

from juice.data.metrics import CONTEXTUAL, metric_named


class Direction(str, Enum):
    """Which answer steering promotes when context and memory conflict (paper Sec. 2): the
    parametric (memorised) answer, or the contextual one. A `str`, so it compares equal to, and
    serializes as, "parametric" / "contextual"."""

    PARAMETRIC = "parametric"
    CONTEXTUAL = "contextual"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @classmethod
    def parse(cls, value: "str | Direction") -> "Direction":
        """A direction from its name: "parametric" (also "memory") or "contextual" (also "context").

        Raises:
            ValueError: any other value.
        """
        key = str(value).strip().lower()
        found = {"parametric": cls.PARAMETRIC, "memory": cls.PARAMETRIC,
                 "contextual": cls.CONTEXTUAL, "context": cls.CONTEXTUAL}.get(key)
        if found is None:
            raise ValueError(f"direction must be parametric (memory) or contextual (context), not {value!r}")
        return found

CONFLICT_TYPES: tuple[str, ...] = ("clean", "substitution", "coherent")
"""The paper's three conflict types (Sec. 2.1), in the order of its tables (1, 2, 3)."""


@dataclass(frozen=True)
class ConflictExample:
    """One fact under the three conflict types (paper Sec. 2.1, App. C).

    Attributes:
        domain: e.g. "world_capital".
        subject: e.g. "France".
        answers: accepted parametric answers, the canonical one first, then aliases.
        context_answer: the conflicting answer the context asserts; never an accepted answer.
        prompts: conflict type -> prompt text ending right before the answer (no trailing space).
        uid: the item's id, unique within its domain, that results, tables and stage keys use:
            where it comes from, `<file stem>#<position>` for a ParaConflict file (e.g.
            "unfiltered_test#8") and `facts#<row>` for a built-in table; if not given, a hash of
            the item's content. A subject may repeat (the paper's Official Language test split
            holds Australia twice, with two distractors): two items, two ids.
    """

    domain: str
    subject: str
    answers: tuple[str, ...]
    context_answer: str
    prompts: dict[str, str] = field(hash=False)
    uid: str = ""

    def __post_init__(self) -> None:
        if not self.uid:
            digest = hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode("utf-8")).hexdigest()
            object.__setattr__(self, "uid", f"sha256:{digest[:12]}")
        if not self.answers or not all(a.strip() for a in self.answers):
            raise ValueError(f"{self.domain}/{self.subject}: every accepted answer must be non-empty")
        if not self.context_answer.strip():
            raise ValueError(f"{self.domain}/{self.subject}: the context answer is empty")
        missing = [t for t in CONFLICT_TYPES if not self.prompts.get(t, "").strip()]
        if missing:
            raise ValueError(f"{self.domain}/{self.subject}: no prompt for {missing}")

    @property
    def answer(self) -> str:
        """The canonical parametric answer."""
        return self.answers[0]

    def to_json(self) -> dict:
        """The item's content (the id is not in it: stage keys list the items in order)."""
        return {
            "domain": self.domain,
            "subject": self.subject,
            "answers": list(self.answers),
            "context_answer": self.context_answer,
            "prompts": dict(self.prompts),
        }


CONTEXT_TYPE = "context"
"""The single "conflict type" of the contextual datasets (the prompt with its context)."""


@dataclass(frozen=True)
class ContextualExample:
    """One item of a contextual-direction dataset (paper Sec. 2.2): the target is the answer the
    context (or the instruction in the prompt) calls for; the other one is the memorised answer.

    Attributes:
        dataset: e.g. "nqswap", "proverb_ending".
        uid: a stable identifier within the dataset (row number in the source file).
        prompt: the full prompt, context included, ending right before the answer.
        question: the same prompt with the context removed (CAD's second branch).
        context_answers: accepted contextual answers (the target).
        parametric_answers: the memorised answers (what the context overrides).
        kind: "completion" (sentence completion) or "qa" (question answering); picks the
            instruction of the Prompt baseline (paper App. D.1).
        metric: a metric of :data:`juice.data.metrics.METRICS` for these records: "memotrap" (exact
            match of the continuation's words) or "nqswap" (normalized substring match).
    """

    dataset: str
    uid: str
    prompt: str
    question: str
    context_answers: tuple[str, ...]
    parametric_answers: tuple[str, ...]
    kind: str
    metric: str

    def __post_init__(self) -> None:
        if not self.context_answers or not all(a.strip() for a in self.context_answers):
            raise ValueError(f"{self.dataset}/{self.uid}: every contextual answer must be non-empty")
        if not self.parametric_answers or not all(a.strip() for a in self.parametric_answers):
            raise ValueError(f"{self.dataset}/{self.uid}: every parametric answer must be non-empty")
        if not self.prompt.strip() or not self.question.strip():
            raise ValueError(f"{self.dataset}/{self.uid}: empty prompt or question")
        if self.kind not in ("completion", "qa"):
            raise ValueError(f"{self.dataset}/{self.uid}: kind must be 'completion' or 'qa', not {self.kind!r}")
        try:
            metric_named(self.metric, CONTEXTUAL)
        except ValueError as err:
            raise ValueError(f"{self.dataset}/{self.uid}: {err}") from None

    @property
    def context_answer(self) -> str:
        return self.context_answers[0]

    @property
    def parametric_answer(self) -> str:
        return self.parametric_answers[0]

    def to_json(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()}
