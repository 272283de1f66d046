"""The recipe one row of a table, or one request, is decoded with: a head steering, or a
contrastive decoding rule (CAD, AdaCAD, CK-PLUG, CoCoA, COIECD, GRD), or the Prompt baseline's instruction, or auto's
per-request choice (:class:`Method`). The method registry (:mod:`juice.methods`) builds one per
method; the evaluation (:mod:`juice.eval.runner`), the context-type study and auto run them.
"""

from __future__ import annotations

from dataclasses import dataclass

from juice.engine import Choice, ContrastRule
from juice.steering import ORIGINAL, Steering


@dataclass(frozen=True)
class Method:
    """How one row of a table is produced.

    How it decodes is one of three runs (:attr:`decoding`): its head steering's single or dual run
    (:class:`~juice.steering.Steering`: Original, JuNE, PH3's pruning run once, JuICE twice), a
    contrastive stream (`contrast`: CAD, AdaCAD, CK-PLUG, CoCoA, COIECD, GRD), or auto's per-request choice (`choice`).

    Attributes:
        steering: head steering during decoding (Original, JuNE, JuICE, PH3 pruning).
        contrast: decode the unsteered model's contrastive stream with this rule instead
            (:data:`juice.engine.ContrastRule`, from the prompt's and the question's logits:
            :class:`juice.baselines.cad.CadPolicy` at CAD's alpha or AdaCAD's
            :func:`~juice.baselines.cad.jsd_alpha`, :class:`juice.baselines.ckplug.CkPlugPolicy`;
            contextual direction only).
        instructed: prepend the Prompt baseline's instruction (paper App. D.1).
        instruction: which Prompt instruction an instructed method uses where the evaluation
            does not say: "parametric" or "contextual" (the context-type evaluation,
            :mod:`juice.when_to_steer.evaluation`); None: the evaluation's direction.
        choice: decode with a per-request choice among steerings instead (juice's `auto`,
            :data:`juice.methods.REGISTRY`'s `auto`): an :class:`~juice.engine.Choice` whose `question`
            is ignored (each request's own question is used).

    Raises:
        ValueError: a contrast with a steering; a choice with either; an unknown instruction.
    """

    steering: Steering = ORIGINAL
    contrast: ContrastRule | None = None
    instructed: bool = False
    instruction: str | None = None
    choice: Choice | None = None

    def __post_init__(self) -> None:
        if self.instruction not in (None, "parametric", "contextual"):
            raise ValueError(f"instruction must be parametric or contextual, not {self.instruction!r}")
        if self.contrast is not None and self.steering.steers:
            raise ValueError("a contrastive method (CAD, AdaCAD, CK-PLUG, CoCoA, COIECD, GRD) decodes the unsteered "
                             "model; the steering would be ignored")
        if self.choice is not None and (self.contrast is not None or self.steering.steers):
            raise ValueError("a choosing method (auto) takes no steering and no contrast of its own")

    @property
    def decoding(self) -> str:
        """How it decodes: "choice" (auto), "contrastive stream" (CAD and the other contrastive methods), "dual run"
        (JuICE, Alg. 1) or "single run" (Original, Prompt, JuNE, PH3's pruning)."""
        if self.choice is not None:
            return "choice"
        if self.contrast is not None:
            return "contrastive stream"
        return "dual run" if self.steering.dual_run else "single run"


def as_method(value: "Method | Steering") -> Method:
    return value if isinstance(value, Method) else Method(steering=value)


__all__ = ["Method", "as_method"]
