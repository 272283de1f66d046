"""The recipe one row of a table, or one request, is decoded with: a head steering, or a
contrastive decoding rule (CAD, AdaCAD, CK-PLUG), or the Prompt baseline's instruction, or auto's
per-request choice (:class:`Method`). The method registry (:mod:`juice.methods`) builds one per
method; the evaluation (:mod:`juice.eval.runner`), the context-type study and auto run them.
"""

from __future__ import annotations

from dataclasses import dataclass

from juice.baselines.cad import AlphaRule, CadPolicy, jsd_alpha
from juice.baselines.ckplug import CkPlugPolicy
from juice.engine import Choice, ContrastRule
from juice.steering import ORIGINAL, Steering


@dataclass(frozen=True)
class Method:
    """How one row of a table is produced.

    Attributes:
        steering: head steering during decoding (Original, JuNE, JuICE, PH3 pruning).
        instructed: prepend the Prompt baseline's instruction (paper App. D.1).
        cad_alpha: decode with CAD at this alpha instead (contextual direction only).
        adacad: decode with AdaCAD instead: CAD whose alpha is, per item and step, the
            Jensen-Shannon divergence in bits of the two branches' next-token distributions
            (:func:`juice.baselines.cad.jsd_alpha`; contextual direction only).
        ckplug: decode with CK-PLUG's adaptive rule instead (:mod:`juice.baselines.ckplug`;
            contextual direction only).
        instruction: which Prompt instruction an instructed method uses where the evaluation
            does not say: "parametric" or "contextual" (the context-type evaluation,
            :mod:`juice.when_to_steer.evaluation`); None: the evaluation's direction.
        choice: decode with a per-request choice among steerings instead (juice's `auto`,
            :data:`juice.methods.REGISTRY`'s `auto`): an :class:`~juice.engine.Choice` whose `question`
            is ignored (each request's own question is used).

    Raises:
        ValueError: two of `cad_alpha`, `adacad` and `ckplug`; a contrastive method with a
            steering; a choice with either; an unknown instruction.
    """

    steering: Steering = ORIGINAL
    instructed: bool = False
    cad_alpha: float | None = None
    adacad: bool = False
    instruction: str | None = None
    choice: Choice | None = None
    ckplug: bool = False

    def __post_init__(self) -> None:
        if self.instruction not in (None, "parametric", "contextual"):
            raise ValueError(f"instruction must be parametric or contextual, not {self.instruction!r}")
        if self.adacad + (self.cad_alpha is not None) + self.ckplug > 1:
            raise ValueError("a method is CAD (cad_alpha), AdaCAD (adacad) or CK-PLUG (ckplug), not two of them")
        if self.contrastive is not None and self.steering.steers:
            raise ValueError("CAD, AdaCAD and CK-PLUG decode the unsteered model; the steering would be ignored")
        if self.choice is not None and (self.contrastive is not None or self.steering.steers):
            raise ValueError("a choosing method (auto) takes no steering and no contrast of its own")

    @property
    def contrastive(self) -> "float | AlphaRule | CkPlugPolicy | None":
        """CAD's alpha, AdaCAD's alpha rule (:func:`juice.baselines.cad.jsd_alpha`), CK-PLUG's
        policy (:class:`juice.baselines.ckplug.CkPlugPolicy`), or None (not a contrastive method)."""
        if self.ckplug:
            return CkPlugPolicy()
        return jsd_alpha if self.adacad else self.cad_alpha

    @property
    def contrast(self) -> "ContrastRule | None":
        """The rule a contrastive method chooses each token by, from the prompt's and the
        question's logits (a :class:`juice.engine.Contrast`'s): :class:`juice.baselines.cad.CadPolicy`
        at CAD's or AdaCAD's alpha, CK-PLUG's policy; None for the others."""
        rule = self.contrastive
        return rule if rule is None or isinstance(rule, CkPlugPolicy) else CadPolicy(rule)


def as_method(value: "Method | Steering") -> Method:
    return value if isinstance(value, Method) else Method(steering=value)


__all__ = ["Method", "as_method"]
