"""The record every parametric-direction dataset is turned into."""

from __future__ import annotations

from dataclasses import dataclass, field

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
    """

    domain: str
    subject: str
    answers: tuple[str, ...]
    context_answer: str
    prompts: dict[str, str] = field(hash=False)

    def __post_init__(self) -> None:
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
        return {
            "domain": self.domain,
            "subject": self.subject,
            "answers": list(self.answers),
            "context_answer": self.context_answer,
            "prompts": dict(self.prompts),
        }
