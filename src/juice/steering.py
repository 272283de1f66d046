"""What a steering is (paper Stage 2), and its presets: JuICE, JuNE and PH3's pruning.

JuICE (paper Alg. 1, Stage 2): run 1 is the unmodified model; run 2 adds beta+ (resp. beta-)
times run 1's outputs of the positive (negative) heads to the same heads. JuNE (Alg. 4) scales
the heads' live outputs in one run: `H <- H + beta * H`. A :class:`Steering` holds its kind and
its `[n_layers, n_heads]` coefficients; :mod:`juice.engine` runs it (batched, cached).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from juice.architectures import HeadGeometry
from juice.interventions import HeadSelection
from juice.interventions import Head, check_heads, head_coefficients
from juice.models import LoadedModel
from juice.tuned import TunedSettings

SteeringKind = Literal["none", "scale", "add"]
"""How a steering changes a head's output H, at a coefficient c: "none" (no change: Original),
"scale" (`H <- (1 + c) H`, the live output, in one run: JuNE, Alg. 4, and PH3's pruning, c = -1),
"add" (`H <- H + c H_clean`, H_clean run 1's output of the same head: JuICE's dual run, Alg. 1).
Not a method (:class:`juice.recipe.Method`): the registry's methods (:data:`juice.methods.REGISTRY`)
build steerings of these kinds."""
KINDS: tuple[str, ...] = ("none", "scale", "add")
SITES: tuple[str, ...] = ("o_proj_input", "post_norm")
"""Where a steering acts on a head's output: its slice of the attention output projection's input
(the paper's), or its contribution after the attention block's output norm (:mod:`juice.post_norm`)."""


def steering_coefficients(
    geometry: HeadGeometry, selection: HeadSelection, beta_plus: float, beta_minus: float, kind: SteeringKind = "add",
) -> Tensor:
    """`[n_layers, n_heads]`: beta+ on positive heads, beta- on negative heads, 0 elsewhere.

    A head in both sets gets both updates, one after the other, as the algorithms apply them:
    JuICE (Alg. 1) adds beta+ then beta- times the clean run's output, H + (beta+ + beta-) H_clean,
    so its coefficient is the sum; JuNE (Alg. 4) scales the live output twice,
    (1 + beta+)(1 + beta-) H, so its coefficient is (1 + beta+)(1 + beta-) - 1.

    Args:
        kind: "add" (JuICE's) or "scale" (JuNE's): what the coefficients are for (only a head in
            both sets differs).

    Raises:
        IndexError: a head is out of range for `geometry`.
        ValueError: another kind.
    """
    if kind not in ("add", "scale"):
        raise ValueError(f"steering coefficients are for the kinds add or scale, not {kind!r}")
    check_heads([*selection.positive, *selection.negative], geometry)
    coefficients = torch.zeros(geometry.n_layers, geometry.n_heads)
    for layer, head in selection.positive:
        coefficients[layer, head] += beta_plus
    for layer, head in selection.negative:
        c = coefficients[layer, head]   # (1 + c)(1 + b-) - 1, written so that c = 0 gives b- exactly
        coefficients[layer, head] = c + beta_minus + (c * beta_minus if kind == "scale" else 0.0)
    return coefficients


@dataclass(frozen=True)
class Steering:
    """How the heads are steered, with its coefficients.

    Attributes:
        kind: :data:`SteeringKind`: "none" (no change), "scale" (JuNE's single run, pruning) or
            "add" (JuICE's dual run).
        coefficients: `[n_layers, n_heads]`, beta at the steered heads, 0 elsewhere.
            Ignored for "none".
        site: where the heads are steered (:data:`SITES`): "o_proj_input" (the paper's, the
            default) or "post_norm" (after the attention output norm, :mod:`juice.post_norm`).

    Raises:
        ValueError: an unknown kind or site, or coefficients of the wrong shape.
    """

    kind: SteeringKind = "none"
    coefficients: Tensor | None = None
    site: str = "o_proj_input"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown steering kind {self.kind!r}; choose from {KINDS}")
        if self.site not in SITES:
            raise ValueError(f"unknown steering site {self.site!r}; choose from {SITES}")
        if self.kind != "none" and (self.coefficients is None or self.coefficients.dim() != 2):
            raise ValueError(f"a steering of kind {self.kind} needs coefficients of shape [n_layers, n_heads]")

    @property
    def steers(self) -> bool:
        """The run changes head outputs (JuNE, JuICE, pruning); False for Original."""
        return self.kind != "none"

    @property
    def dual_run(self) -> bool:
        """The paper's dual run (JuICE, Alg. 1): a clean run 1 whose head outputs run 2 adds, so a
        decoding engine gives the stream two rows; JuNE and Original run once."""
        return self.kind == "add"

    def identity(self) -> tuple:
        """What the numbers of a decoding under this steering depend on: ("original",) for one that
        changes nothing (no steering, or coefficients all 0: H + 0 * H = H, the same numbers,
        not an approximation), else its kind, site, the coefficients' shape and dtype and the
        SHA-256 (16 hex digits) of their bytes. A stable value: decoded chunks are checkpointed
        under it (:func:`juice.engine.batch.chunk_unit`) and requests deduplicated by it
        (:func:`juice.eval.runner.decode_requests`)."""
        if not self.steers or not bool(self.coefficients.ne(0).any()):
            return ("original",)
        data = self.coefficients.detach().cpu().contiguous()
        return (self.kind, self.site, tuple(data.shape), str(data.dtype),
                hashlib.sha256(data.numpy().tobytes()).hexdigest()[:16])

    def scale_add(self, zero: Tensor) -> tuple[Tensor, Tensor]:
        """(scale, add), each `[n_layers, n_heads]`: the rule the forward applies at a head's
        slice of the output projection's input, `H * (1 + scale) + add * H_clean`
        (:class:`juice.interventions.RowPlan`). JuNE (Alg. 4) and pruning put their coefficients
        in `scale`; JuICE (Alg. 1) in `add` (H_clean: run 1's output of the same head); Original
        neither. The one mapping juice's engine and the vLLM plugin share.

        Args:
            zero: `[n_layers, n_heads]` zeros (on the device and dtype the caller needs).
        """
        if self.kind == "add":
            return zero, self.coefficients
        if self.kind == "scale":
            return self.coefficients, zero
        return zero, zero


ORIGINAL = Steering()


def _geometry(model: "LoadedModel | HeadGeometry") -> HeadGeometry:
    return model if isinstance(model, HeadGeometry) else model.geometry


def JuICE(model: "LoadedModel | HeadGeometry", heads: HeadSelection, beta_plus: float, beta_minus: float) -> Steering:
    """The JuICE preset (paper Alg. 1, dual run): run 1 is the unmodified model; run 2 adds
    beta+ (beta-) times run 1's outputs of the positive (negative) heads to the same heads.

    Args:
        model: a loaded model (or its head geometry).
        heads: the heads to steer (e.g. `load_heads(path, lm).selection`).

    Raises:
        IndexError: a head outside the model.
    """
    return Steering("add", steering_coefficients(_geometry(model), heads, beta_plus, beta_minus))


def JuNE(model: "LoadedModel | HeadGeometry", heads: HeadSelection, beta_plus: float, beta_minus: float) -> Steering:
    """The JuNE preset (paper Alg. 4, one run): the live outputs of the positive (negative) heads
    are scaled by 1 + beta+ (1 + beta-).

    Raises:
        IndexError: a head outside the model.
    """
    return Steering("scale", steering_coefficients(_geometry(model), heads, beta_plus, beta_minus, "scale"))


def Prune(model: "LoadedModel | HeadGeometry", heads: Sequence[Head]) -> Steering:
    """Zero the outputs of `heads` (PH3's pruning, Jin et al. 2024): JuNE with beta = -1, which
    equals zeroing those heads' columns of the output projection (tested).

    Raises:
        IndexError: a head outside the model.
    """
    return Steering("scale", head_coefficients(_geometry(model), {h: -1.0 for h in heads}))




DEFAULT_BETAS: tuple[float, float] = (2.0, 0.0)
"""(beta+, beta-) where neither the caller nor the heads file (`juice tune`) gives them: a
starting point, not a tuned value; on a small model it can break the text (issue 38)."""


def PerHead(kind: SteeringKind, model: "LoadedModel | HeadGeometry", coefficients: Mapping[Head, float]) -> Steering:
    """A steering of `kind` ("scale": JuNE's, or "add": JuICE's) with explicit per-head coefficients in place of a
    heads file's heads and betas (a request's `heads`, :mod:`juice.steering_request`): JuNE's live
    output becomes `(1 + c) H`, JuICE adds `c` times run 1's output.

    Raises:
        IndexError: a head outside the model.
        ValueError: another kind.
    """
    if kind not in ("scale", "add"):
        raise ValueError(f"per-head coefficients are for the kinds scale or add, not {kind!r}")
    return Steering(kind, head_coefficients(_geometry(model), dict(coefficients)))


PRESETS = {"scale": JuNE, "add": JuICE}
"""The head-steering presets by their kind: `(model, heads, beta+, beta-) -> Steering`; the
registry's JuNE and JuICE entries build with them."""


class UntunedBetasWarning(UserWarning):
    """JuICE or JuNE runs with :data:`DEFAULT_BETAS` because the heads file holds no tuned betas, or
    with a beta outside the range the file was tuned over (:func:`chosen_betas`)."""


def chosen_betas(method: str, tuned: "TunedSettings | Mapping[str, Any] | None", beta_plus: float | None = None,
                 beta_minus: float | None = None) -> tuple[float, float, str | None]:
    """The betas a steering of `method` runs with, and the warning to show if they are untuned.

    Each beta is the caller's, else the heads file's tuned value for `method`
    (`HeadsArtifact.tuned`, written by `juice tune`), else :data:`DEFAULT_BETAS`'s.

    Args:
        method: "juice" or "june".
        tuned: the heads file's tuned settings (:class:`juice.tuned.TunedSettings`, or its JSON
            object), or None (no file).

    Returns:
        (beta+, beta-, warning): the warning is one line naming `juice tune` where a default was
        used; else, where the file records the betas it was tuned over
        (:meth:`juice.tuned.TunedSettings.beta_range`) and a beta lies outside them, one line
        naming that range (juice's check, not the paper's: its grids stay within 0..5 and -3..0);
        else None.
    """
    mine = TunedSettings.of(tuned).betas(method)
    bp = beta_plus if beta_plus is not None else (mine.beta_plus if mine else None)
    bm = beta_minus if beta_minus is not None else (mine.beta_minus if mine else None)
    warning = None
    if bp is None or bm is None:
        bp = DEFAULT_BETAS[0] if bp is None else bp
        bm = DEFAULT_BETAS[1] if bm is None else bm
        warning = (f"{method} with untuned betas (beta_plus={float(bp):g}, beta_minus={float(bm):g}): the heads file "
                   f"holds none for {method}, and defaults can break a model's text; run `juice tune` on "
                   "validation rows, or pass both betas")
    elif (span := TunedSettings.of(tuned).beta_range(method)) is not None:
        outside = [f"{name}={float(b):g}" for name, b, (lo, hi) in (("beta_plus", bp, span[0]), ("beta_minus", bm, span[1]))
                   if not lo <= b <= hi]
        if outside:
            warning = (f"{method} with {' and '.join(outside)}, outside the range the heads file was tuned over "
                       f"(beta_plus {span[0][0]:g}..{span[0][1]:g}, beta_minus {span[1][0]:g}..{span[1][1]:g}): "
                       "untested there, the text may not be an answer")
    return float(bp), float(bm), warning
