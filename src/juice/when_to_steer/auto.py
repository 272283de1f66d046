"""`auto`: steering that decides per request whether to steer, and how strongly (issue 35, part 2;
juice's own method, not the paper's). It builds its candidates through the registry
(:func:`juice.methods.recipe_of`), so it registers itself there as a plugin would
(:func:`register`, named in juice's `juice.methods` entry points): its entry, :data:`SPEC`, builds
with :func:`build`.

The signal is AdaCAD's (Wang et al., NAACL 2025): the Jensen-Shannon divergence, in bits, between
the model's next-token distribution with the context and without it (the question alone), at the
first step, from the unmodified model (:data:`juice.when_to_steer.signals.SIGNAL`). A passage that
changes the model's mind moves it toward 1. A policy (:class:`AutoPolicy`) cuts the signal of a
request **with a passage** into at most three bins by thresholds and names a candidate per bin:

- "original": the unmodified model;
- "question": the question alone, without the passage, with the unmodified model (ignore the
  context; the question's row is already in the choice's prefill:
  :data:`juice.engine.QUESTION_ALONE`);
- "prompt-mem": the Prompt baseline toward memory (paper App. D.1; the instruction to ignore
  the passage before the prompt, :func:`juice.baselines.prompt.instructed_context_item`), with
  the unmodified model: the instructed prompt is a third unmodified row of the choice's prefill
  (:data:`juice.engine.INSTRUCTED`; issue 77: where it is the best static method, auto can pick it);
- "juice": JuICE with the heads file's tuned betas (paper protocol, conflicting validation items);
- "juice/2": JuICE at half those betas;
- "june": JuNE with its tuned betas (when the file has them);
- "adacad": AdaCAD (Wang et al. 2025), the contrast with the question-only row that the choice's
  prefill already holds.

Before the bins, a **relevance gate** may send a request with a passage to one candidate (the
question alone, typically) when a signal of the passage's relevance is below a threshold: the
share of the question's words the passage holds (:func:`~juice.when_to_steer.signals.passage_relevance`, decided from the
request's tokens before any forward), CK-PLUG's confidence gain (Bi et al., ICLR 2026: the entropy
the passage removes at the first step) or CoCoA's contextual peakedness (Khandelwal et al., EMNLP
2025: the margin of the two most probable tokens with the passage), the last two read from the
same first step as the JSD (:data:`~juice.when_to_steer.signals.GATE_SIGNALS`). The fit chooses the signal on validation with
the rest.

A request **without a passage** (its prompt is its question: the same token ids) is decoded with
Original, decided by that structure (:attr:`juice.engine.Choice.without_passage`), never by the
signal: its JSD is 0 in exact arithmetic, but the two rows are computed at different places in a
padded batch and agree only to about 1e-8 in fp32, by an amount that depends on the processor's
kernels, so a threshold near 0 would steer some such requests on some machines. The
fit (:func:`juice.when_to_steer.auto_tuning.fit_policy`) sets its bins on the requests with a passage only.

In the engine a request is one stream with a :class:`juice.engine.Choice`: its prefill holds the
prompt's and the question's unmodified rows and a row per steered candidate (joining at the first
layer it steers), the choice is made from the first step's two distributions, and from then on
the stream decodes exactly as the chosen candidate's (AdaCAD: the contrastive stream over the
same two unmodified rows) (tested: a policy that always picks
"original" gives Original's tokens, one that always picks "juice" gives static JuICE's, a batch
gives each request's tokens alone). The decision is per request, not per step.

Tuning (:func:`juice.when_to_steer.auto_tuning.tune_auto`, `juice tune --methods auto`) reads
validation items only and writes the policy to the heads file (`tuned["auto"]`) like the betas
(:mod:`juice.when_to_steer.auto_tuning`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from juice.baselines.cad import jsd_alpha
from juice.engine import INSTRUCTED, QUESTION_ALONE, Choice, Contrast, Instructed
from juice.methods import (REGISTRY, SHORT, UNSTEERED as UNSTEERED_METHOD, Built, MethodInputs, MethodSpec, Row,
                           lookup, recipe_of, register as register_method)
from juice.models import LoadedModel
from juice.recipe import Method
from juice.steering import Steering, chosen_betas
from juice.tuned import TunedSettings
from juice.when_to_steer.evaluation import QUESTION_ONLY
from juice.when_to_steer.signals import (CONFIDENCE_GAIN, CONTEXT_PEAKEDNESS, GATE_SIGNALS, RELEVANCE, SIGNAL,
                                         RelevanceGate, gate_signal)

@dataclass(frozen=True)
class Candidate:
    """One of auto's choices (module docstring).

    Attributes:
        name: its name in a policy (`picks`, `irrelevant`, `betas`).
        method: the method it decodes with, a name of :data:`juice.methods.REGISTRY` (whose title
            names it in tables); None: the question alone (:data:`juice.engine.QUESTION_ALONE`).
        betas: the fraction of the method's tuned betas it steers with (head steerings only).
        required: it is a candidate whatever the heads file holds; a head steering other than
            JuICE's is one only where the file has its tuned betas.
        instruction: the Prompt baseline's instruction ("parametric") of an instructed
            candidate, else None.
    """

    name: str
    method: str | None
    betas: float = 1.0
    required: bool = True
    instruction: str | None = None

    @property
    def steered(self) -> bool:
        """It steers heads (its method is a head steering), so a policy holds its betas."""
        return self.method is not None and lookup(self.method).steers

    @property
    def label(self) -> str:
        """The suffix its title adds to its method's ("/2" for half the betas; "" for all)."""
        return "" if self.betas == 1 else f"/{1 / self.betas:g}"

    def key(self, suffix: str) -> str:
        """Its row key in the study's tables (:class:`juice.methods.Row`): its method, its share of
        the tuned betas (:attr:`label`, "/2") and the heads file's direction (`suffix`, "mem" or
        "ctx") after a head steering's, its instruction's after an instructed one's ("prompt-mem",
        whatever the heads): "juice/2-ctx", titled "JuICE/2-ctx" (:func:`juice.methods.row_title`);
        the question alone's is :data:`juice.when_to_steer.evaluation.QUESTION_ONLY`."""
        if self.method is None:
            return QUESTION_ONLY
        if self.instruction is not None:
            return Row(self.method, SHORT[self.instruction], self.label).key
        return Row(self.method, suffix if REGISTRY[self.method].heads else "", self.label).key


CANDIDATE_TABLE: tuple[Candidate, ...] = (
    Candidate("original", "original"), Candidate("question", None),
    Candidate("prompt-mem", "prompt", instruction="parametric"), Candidate("juice", "juice"),
    Candidate("juice/2", "juice", 0.5), Candidate("june", "june", required=False), Candidate("adacad", "adacad"))
"""auto's candidates, least steered first (the order ties are broken in)."""

NO_PASSAGE = next(c.name for c in CANDIDATE_TABLE if c.method == UNSTEERED_METHOD)
"""The candidate a request without a passage decodes with: the one whose method steers nothing
(:data:`juice.methods.UNSTEERED`), whatever the bins say."""

CANDIDATE = {c.name: c for c in CANDIDATE_TABLE}
"""Candidate name -> :class:`Candidate`."""

CANDIDATES = tuple(CANDIDATE)
"""Candidate names, least steered first (the order ties are broken in)."""

UNSTEERED = tuple(c.name for c in CANDIDATE_TABLE if not c.steered)
"""Candidates without betas."""

MAX_THRESHOLDS = 2
"""At most this many thresholds (three bins)."""

THRESHOLD_GRID = 16
"""At most this many threshold values tried: quantiles of the validation signal."""


@dataclass(frozen=True)
class AutoRule:
    """The :data:`juice.engine.ChoiceRule` of a policy: the first-step JSD (bits) of each row's
    two distributions, cut at `thresholds` (a value equal to a threshold goes to the upper bin),
    gives the bin; `picks[bin]` is the candidate's index."""

    thresholds: tuple[float, ...]
    picks: tuple[int, ...]
    gate: str | None = None
    gate_threshold: float = 0.0
    gate_pick: int = 0

    def __call__(self, with_context: Tensor, question: Tensor) -> Tensor:
        """`[rows]` long candidate indices of `[rows, vocab]` with-context and question-only logits;
        with a model-based `gate` (:data:`GATE_SIGNALS`), a row whose gate signal is below
        `gate_threshold` takes `gate_pick` whatever its bin."""
        signal = jsd_alpha(with_context, question)
        edges = torch.tensor(self.thresholds, dtype=signal.dtype, device=signal.device)
        bins = torch.bucketize(signal, edges, right=True)
        picks = torch.tensor(self.picks, dtype=torch.long, device=signal.device)[bins]
        if self.gate is None:
            return picks
        below = gate_signal(self.gate, with_context, question) < self.gate_threshold
        return torch.where(below, torch.full_like(picks, self.gate_pick), picks)


@dataclass(frozen=True)
class AutoPolicy:
    """Which candidate each signal bin decodes with (module docstring).

    Attributes:
        thresholds: ascending JSD values (bits), at most :data:`MAX_THRESHOLDS`.
        picks: a candidate name (:data:`CANDIDATES`) per bin: `len(thresholds) + 1` of them.
        betas: candidate name -> (beta+, beta-) for the steered candidates picked.
        relevance: the relevance gate's threshold on its signal `gate`: a request with a
            passage whose signal is smaller is decoded with `irrelevant` and never reaches the
            bins; None: no gate.
        irrelevant: the candidate below the gate.
        gate: the gate's signal (:data:`GATE_SIGNALS`): the share of the question's words the
            passage holds (:func:`passage_relevance`, decided from the request's tokens before
            any forward), or a model-based one read at the first step (:func:`gate_signal`).

    Raises:
        ValueError: thresholds not ascending, a pick count that does not match, an unknown
            candidate, or a steered candidate without betas.
    """

    thresholds: tuple[float, ...] = ()
    picks: tuple[str, ...] = ("original",)
    betas: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    relevance: float | None = None
    irrelevant: str = "question"
    gate: str = RELEVANCE

    def __post_init__(self) -> None:
        if self.gate not in GATE_SIGNALS:
            raise ValueError(f"auto: unknown gate signal {self.gate!r}; choose from {', '.join(GATE_SIGNALS)}")
        if list(self.thresholds) != sorted(self.thresholds) or len(self.thresholds) > MAX_THRESHOLDS:
            raise ValueError(f"auto: thresholds must be ascending, at most {MAX_THRESHOLDS}, got {list(self.thresholds)}")
        if len(self.picks) != len(self.thresholds) + 1:
            raise ValueError(f"auto: {len(self.thresholds)} thresholds need {len(self.thresholds) + 1} picks, "
                             f"got {len(self.picks)}")
        for name in (*self.picks, *([self.irrelevant] if self.relevance is not None else [])):
            if name not in CANDIDATES:
                raise ValueError(f"auto: unknown candidate {name!r}; choose from {', '.join(CANDIDATES)}")
            if name not in UNSTEERED and name not in self.betas:
                raise ValueError(f"auto: candidate {name!r} needs its betas")

    @property
    def candidates(self) -> list[str]:
        """Original (the choice for a request without a passage) and the distinct candidates
        picked, in :data:`CANDIDATES` order."""
        gated = [self.irrelevant] if self.relevance is not None else []
        return [c for c in CANDIDATES if c in self.picks or c in gated or c == NO_PASSAGE]

    def choice(self, lm: LoadedModel, selection) -> Choice:
        """The engine's :class:`~juice.engine.Choice` (its `question`, and its `instructed` where
        "prompt-mem" is picked, are placeholders, -1: the caller sets them), the candidates built
        by the registry (:func:`candidate_option`).

        Raises:
            IndexError: a head outside the model.
        """
        names = self.candidates
        steerings = tuple(candidate_option(CANDIDATE[n], lm, selection, self.betas) for n in names)
        lexical = self.relevance is not None and self.gate == RELEVANCE
        gate = RelevanceGate(float(self.relevance), names.index(self.irrelevant), lm.tokenizer) if lexical else None
        model_gate = (() if self.relevance is None or lexical
                      else (self.gate, float(self.relevance), names.index(self.irrelevant)))
        return Choice(-1, steerings, AutoRule(tuple(float(t) for t in self.thresholds),
                                              tuple(names.index(p) for p in self.picks), *model_gate),
                      without_passage=names.index(NO_PASSAGE), gate=gate,
                      instructed=-1 if any(isinstance(s, Instructed) for s in steerings) else None)

    def describe(self) -> str:
        """The policy in one line: "no passage -> original; <gate>; <bins>"."""
        units = {RELEVANCE: "of the question's words in the passage", CONFIDENCE_GAIN: "nats of confidence gain",
                 CONTEXT_PEAKEDNESS: "contextual peakedness"}
        gate = ("" if self.relevance is None else f"{self.relevance:.3g} {units[self.gate]} -> below: "
                f"{self.irrelevant}; ")
        bins = " | ".join(f"{'' if i == 0 else f'JSD >= {self.thresholds[i - 1]:.3g}: '}{name}"
                          for i, name in enumerate(self.picks))
        return f"no passage -> original; {gate}{bins}"

    def to_json(self) -> dict[str, Any]:
        out = {"signal": SIGNAL, "thresholds": list(self.thresholds), "picks": list(self.picks),
               "betas": {k: {"beta_plus": v[0], "beta_minus": v[1]} for k, v in self.betas.items()}}
        if self.relevance is not None:
            out["gate"] = {"signal": self.gate, "threshold": self.relevance, "pick": self.irrelevant}
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "AutoPolicy":
        """Raises: ValueError: another signal or a malformed policy (one line)."""
        if data.get("signal", SIGNAL) != SIGNAL:
            raise ValueError(f"auto: unknown signal {data.get('signal')!r} (this juice reads {SIGNAL})")
        gate = data.get("gate")
        if gate is not None and (not isinstance(gate, Mapping) or gate.get("signal") not in GATE_SIGNALS):
            raise ValueError(f"auto: unknown gate {gate!r} (this juice reads {', '.join(GATE_SIGNALS)})")
        try:
            betas = {k: (float(v["beta_plus"]), float(v["beta_minus"])) for k, v in data.get("betas", {}).items()}
            return cls(tuple(float(t) for t in data["thresholds"]), tuple(str(p) for p in data["picks"]), betas,
                       None if gate is None else float(gate["threshold"]),
                       "question" if gate is None else str(gate["pick"]),
                       RELEVANCE if gate is None else str(gate["signal"]))
        except (KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"auto: malformed policy in the heads file ({err!r})") from None


def candidate_betas(tuned: TunedSettings | Mapping[str, Any] | None) -> dict[str, tuple[float, float]]:
    """Steered candidate name -> (beta+, beta-): its fraction of its method's betas in the file
    (:class:`Candidate`): a required candidate's from :func:`juice.steering.chosen_betas`
    (defaults where untuned: "juice", "juice/2"), another's where the file has them ("june")."""
    tuned = TunedSettings.of(tuned)
    out = {}
    for c in CANDIDATE_TABLE:
        if not c.steered:
            continue
        if c.required:
            bp, bm, _ = chosen_betas(c.method, tuned)
        elif (found := tuned.betas(c.method)) is not None:
            bp, bm = found.beta_plus, found.beta_minus
        else:
            continue
        out[c.name] = (bp * c.betas, bm * c.betas)
    return out


def candidate_recipe(candidate: Candidate, lm: LoadedModel, selection, betas: Mapping[str, tuple[float, float]]
                     ) -> Method | None:
    """A candidate's recipe (:class:`juice.recipe.Method`) as the registry builds its method: a
    head steering at the candidate's `betas`, Original, Prompt with its instruction, AdaCAD; None
    for the question alone.

    Raises:
        KeyError: a steered candidate without betas in `betas`.
        IndexError: a head outside the model.
    """
    if candidate.method is None:
        return None
    if candidate.steered:
        return recipe_of(candidate.method, lm, selection, *betas[candidate.name])
    return recipe_of(candidate.method, lm, None, None, None, candidate.instruction)


def candidate_option(candidate: Candidate, lm: LoadedModel, selection, betas: Mapping[str, tuple[float, float]]
                     ) -> Steering | Contrast:
    """What the engine decodes a candidate with inside a choice: its recipe's steering
    (:func:`candidate_recipe`), the question alone (:data:`juice.engine.QUESTION_ALONE`), the
    instructed prompt (:data:`juice.engine.INSTRUCTED`: an unmodified instructed recipe; the
    caller gives that prompt, :func:`juice.baselines.prompt.instructed_request`), or a
    contrastive recipe's rule against the question-only row (AdaCAD).

    Raises:
        KeyError: a steered candidate without betas in `betas`.
        ValueError: a candidate whose recipe a choice cannot run (an instruction with a steering,
            a choice).
        IndexError: a head outside the model.
    """
    recipe = candidate_recipe(candidate, lm, selection, betas)
    if recipe is None:
        return QUESTION_ALONE
    if recipe.instructed and not recipe.steering.steers and recipe.contrast is None and recipe.choice is None:
        return INSTRUCTED
    if recipe.instructed or recipe.choice is not None:
        raise ValueError(f"auto cannot run {candidate.method!r} as a candidate")
    return recipe.steering if recipe.contrast is None else Contrast(-1, recipe.contrast)


def policy_of(tuned: TunedSettings | Mapping[str, Any] | None) -> AutoPolicy:
    """The heads file's tuned policy (:attr:`juice.tuned.TunedSettings.auto`).

    Raises:
        ValueError: the file holds none (run `juice tune --methods auto`), or a malformed one.
    """
    policy = TunedSettings.of(tuned).auto
    if policy is None:
        raise ValueError("auto needs a policy tuned on validation items: run `juice tune --methods auto` "
                         "with validation data (NQ-Swap, ParaConflict) first")
    return AutoPolicy.from_json(policy)


def build(x: MethodInputs) -> Built:
    """auto's registry entry (:data:`juice.methods.REGISTRY`): the heads file's tuned policy
    (:func:`policy_of`) as a recipe whose choice holds its candidates.

    Raises:
        ValueError: betas given (auto chooses its own strength), or no tuned policy.
        IndexError: a head outside the model.
    """
    if x.beta_plus is not None or x.beta_minus is not None:
        raise ValueError("auto chooses its own strength: give no betas")
    policy = policy_of(x.tuned)
    return Built(Method(choice=policy.choice(x.model, x.selection)), policy.to_json())


SPEC = MethodSpec("auto", "auto", build, protocol=True, heads=True, tuned="policy", rows=False, steerer=True,
                  question=True,
                  summary="per request, Original, the question alone or a steering (juice.when_to_steer.auto)")
"""auto's registry entry: a request may ask for it; it needs a heads file with a tuned policy
(`juice tune --methods auto`) and each request's question; it is no row of the paper's tables."""


def register() -> None:
    """Add :data:`SPEC` to :data:`juice.methods.REGISTRY` (juice's `juice.methods` entry point
    `auto`, which the registry calls when first listed: :data:`juice.methods.PLUGIN_GROUP`)."""
    register_method(SPEC)


__all__ = ["AutoPolicy", "AutoRule", "CANDIDATE", "CANDIDATES", "CANDIDATE_TABLE", "Candidate", "MAX_THRESHOLDS",
           "NO_PASSAGE", "SPEC", "THRESHOLD_GRID", "UNSTEERED", "build", "candidate_betas", "candidate_option", "candidate_recipe", "policy_of", "register"]
