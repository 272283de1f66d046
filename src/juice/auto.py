"""`auto`: steering that decides per request whether to steer, and how strongly (issue 35, part 2;
juice's own method, not the paper's).

The signal is AdaCAD's (Wang et al., NAACL 2025): the Jensen-Shannon divergence, in bits, between
the model's next-token distribution with the context and without it (the question alone), at the
first step, from the unmodified model (:func:`juice.baselines.cad.jsd_alpha`). A passage that
changes the model's mind moves it toward 1. A policy (:class:`AutoPolicy`) cuts the signal of a
request **with a passage** into at most three bins by thresholds and names a candidate per bin:

- "original": the unmodified model;
- "question": the question alone, without the passage, with the unmodified model (ignore the
  context; the question's row is already in the choice's prefill:
  :data:`juice.engine.QUESTION_ALONE`);
- "juice": JuICE with the heads file's tuned betas (paper protocol, conflicting validation items);
- "juice/2": JuICE at half those betas;
- "june": JuNE with its tuned betas (when the file has them);
- "adacad": AdaCAD (Wang et al. 2025), the contrast with the question-only row that the choice's
  prefill already holds.

Before the bins, a **relevance gate** may send a request with a passage to one candidate (the
question alone, typically) when a signal of the passage's relevance is below a threshold: the
share of the question's words the passage holds (:func:`passage_relevance`, decided from the
request's tokens before any forward), CK-PLUG's confidence gain (Bi et al., ICLR 2026: the entropy
the passage removes at the first step) or CoCoA's contextual peakedness (Khandelwal et al., EMNLP
2025: the margin of the two most probable tokens with the passage), the last two read from the
same first step as the JSD (:data:`GATE_SIGNALS`). The fit chooses the signal on validation with
the rest.

A request **without a passage** (its prompt is its question: the same token ids) is decoded with
Original, decided by that structure (:attr:`juice.engine.Choice.without_passage`), never by the
signal: its JSD is 0 in exact arithmetic, but the two rows are computed at different places in a
padded batch and agree only to about 1e-8 in fp32, by an amount that depends on the processor's
kernels, so a threshold near 0 would steer some such requests on some machines. The
fit (:func:`fit_policy`) sets its bins on the requests with a passage only.

In the engine a request is one stream with a :class:`juice.engine.Choice`: its prefill holds the
prompt's and the question's unmodified rows and a row per steered candidate (joining at the first
layer it steers), the choice is made from the first step's two distributions, and from then on
the stream decodes exactly as the chosen candidate's (AdaCAD: the contrastive stream over the
same two unmodified rows) (tested: a policy that always picks
"original" gives Original's tokens, one that always picks "juice" gives static JuICE's, a batch
gives each request's tokens alone). The decision is per request, not per step.

Tuning (:func:`tune_auto`, `juice tune --methods auto`) reads validation items only: each
candidate is decoded on the validation items of every context type
(:mod:`juice.data.context_types`), the signal is computed for each, and the thresholds (from the
signal's quantiles) and the candidate per bin are chosen to maximize the **use relevant context**
objective (gold and conflicting: the context's answer; irrelevant and none: the memory answer),
averaged over the context types, ties going to fewer bins and to the less steered candidate. A
candidate whose share of degenerate validation outputs (:mod:`juice.eval.degeneration`) exceeds
Original's by more than :data:`juice.tuned.DEGENERATION_MARGIN` points is never
chosen (`juice tune`'s rule). The result is written to the heads file
(`tuned["auto"]`) like the betas.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from juice.baselines.cad import CadPolicy, jsd_alpha
from juice.data.context_types import CONTEXT_TYPES, ContextItem, ContextItems
from juice.engine import QUESTION_ALONE, Choice, Contrast
from juice.models import LoadedModel
from juice.steering import ORIGINAL, JuICE, JuNE, Steering, chosen_betas
from juice.tuned import DEGENERATION_MARGIN, TunedSettings

SIGNAL = "jsd_bits"
"""The policy's signal: first-step JSD (bits) between the with-context and question-only distributions."""


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
    """

    name: str
    method: str | None
    betas: float = 1.0
    required: bool = True

    @property
    def steered(self) -> bool:
        """It steers heads (its method is a head steering), so a policy holds its betas."""
        return self.method in _PRESETS

    @property
    def label(self) -> str:
        """The suffix its title adds to its method's ("/2" for half the betas; "" for all)."""
        return "" if self.betas == 1 else f"/{1 / self.betas:g}"


_PRESETS = {"juice": JuICE, "june": JuNE}
"""The head steerings a candidate can run, by their registry names (:mod:`juice.steering`'s presets)."""

CANDIDATE_TABLE: tuple[Candidate, ...] = (
    Candidate("original", "original"), Candidate("question", None), Candidate("juice", "juice"),
    Candidate("juice/2", "juice", 0.5), Candidate("june", "june", required=False), Candidate("adacad", "adacad"))
"""auto's candidates, least steered first (the order ties are broken in)."""

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


RELEVANCE = "question_words_in_passage"
"""The gate's lexical signal: the share of the question's content words that the passage holds."""

MIN_WORD = 4
"""A content word: letters only, at least this long."""

SCAFFOLD_WORDS = frozenset({"context", "question", "answer"})
"""The words of the prompt formats juice builds (NQ-Swap's and your rows' `Context: ...\nQuestion:
...\nAnswer:`, :mod:`juice.data.nqswap`): never one of the question's own words, so never counted."""

_WORD = re.compile(r"[^\W\d_]+")

CONFIDENCE_GAIN = "confidence_gain"
"""A model-based gate signal: CK-PLUG's confidence gain (Bi et al., ICLR 2026), the entropy the
passage removes from the first step's next-token distribution, `H(question alone) - H(with the
passage)` in nats over CK-PLUG's plausible tokens (:func:`juice.baselines.ckplug.confidence_gain`;
CoCoA's entropy gap, Khandelwal et al., EMNLP 2025, is the same difference without the filter)."""

CONTEXT_PEAKEDNESS = "context_peakedness"
"""A model-based gate signal: CoCoA's contextual peakedness (Khandelwal et al., EMNLP 2025), the
margin between the two most probable next tokens with the passage (a probability in [0, 1])."""

GATE_SIGNALS = (RELEVANCE, CONFIDENCE_GAIN, CONTEXT_PEAKEDNESS)
"""The relevance gate's signals, each higher for a passage the model should read: the lexical one
(:func:`passage_relevance`, read from the request's words) and two model-based ones (read from the
first step's two distributions of the unmodified model). The fit tries each; ties go to the first."""


def content_words(text: str) -> set[str]:
    """The distinct content words of `text`: runs of letters (any script), lower-cased, at least
    :data:`MIN_WORD` long, wherever they stand (the first word of a text counts as any other), the
    prompt formats' :data:`SCAFFOLD_WORDS` left out.

    >>> sorted(content_words("Question: Michael Jordan plays which sport?\\nAnswer:"))
    ['jordan', 'michael', 'plays', 'sport', 'which']
    """
    return {w for w in (m.group(0).lower() for m in _WORD.finditer(text))
            if len(w) >= MIN_WORD and w not in SCAFFOLD_WORDS}


def passage_of(prompt: str, question: str) -> str:
    """The passage of a prompt: the prompt without its question, which ends it in every format
    juice builds; else the prompt without the longest ending it shares with the question."""
    if prompt.endswith(question):
        return prompt[: len(prompt) - len(question)]
    k = 0
    while k < min(len(prompt), len(question)) and prompt[-1 - k] == question[-1 - k]:
        k += 1
    return prompt[: len(prompt) - k]


def passage_relevance(prompt: str, question: str) -> float:
    """The share (in [0, 1]) of the question's distinct content words (:func:`content_words`)
    that occur among the passage's (:func:`passage_of`). 1.0 where the question has no content
    word (nothing to judge by). Read from the texts, so a word counts the same at the start of a
    text as after a space (a tokenizer gives "Michael" and " Michael" different tokens).

    A lexical relevance score, as a retriever's: a passage about another subject shares few of
    the question's words (juice's signal, :class:`RelevanceGate`).

    >>> passage_relevance("Paris is the capital of France. The capital of France is", "The capital of France is")
    1.0
    >>> passage_relevance("Berlin is the capital of Germany. The capital of France is", "The capital of France is")
    0.5
    """
    asked = content_words(question)
    return len(asked & content_words(passage_of(prompt, question))) / len(asked) if asked else 1.0


@dataclass(frozen=True, eq=False)
class RelevanceGate:
    """A :class:`juice.engine.Choice`'s gate: candidate `pick` for a request whose passage
    holds less than `threshold` of its question's words (:func:`passage_relevance` of the texts
    the tokenizer decodes from the request's token ids), else None."""

    threshold: float
    pick: int
    tokenizer: Any

    def __call__(self, prompt_ids: Sequence[int], question_ids: Sequence[int]) -> int | None:
        decode = self.tokenizer.decode
        share = passage_relevance(decode(list(prompt_ids), skip_special_tokens=True),
                                  decode(list(question_ids), skip_special_tokens=True))
        return self.pick if share < self.threshold else None


def relevance(lm: LoadedModel, prompts: Sequence[str], questions: Sequence[str]) -> list[float]:
    """Per request, :func:`passage_relevance` of its prompt and question texts as the gate reads
    them (decoded from their token ids), 1.0 without a passage."""
    from juice.tokens import token_ids

    gate = RelevanceGate(0.0, 0, lm.tokenizer)
    decode = gate.tokenizer.decode
    return [passage_relevance(decode(token_ids(lm.tokenizer, p), skip_special_tokens=True),
                              decode(token_ids(lm.tokenizer, q), skip_special_tokens=True))
            for p, q in zip(prompts, questions)]


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


def gate_signal(name: str, with_context: Tensor, question: Tensor) -> Tensor:
    """`[rows]` float: a model-based gate signal (:data:`CONFIDENCE_GAIN`, :data:`CONTEXT_PEAKEDNESS`)
    of `[rows, vocab]` first-step logits with the passage and of the question alone.

    Raises:
        ValueError: another name (the lexical signal is read from the texts: :func:`passage_relevance`).
    """
    from juice.baselines.ckplug import confidence_gain

    if name == CONFIDENCE_GAIN:
        return confidence_gain(with_context, question)[0]
    if name == CONTEXT_PEAKEDNESS:
        top = with_context.float().softmax(-1).topk(2, dim=-1).values
        return top[..., 0] - top[..., 1]
    raise ValueError(f"auto: {name!r} is not a model-based gate signal ({', '.join(GATE_SIGNALS[1:])})")


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
        return [c for c in CANDIDATES if c in self.picks or c in gated or c == "original"]

    def choice(self, lm: LoadedModel, selection) -> Choice:
        """The engine's :class:`~juice.engine.Choice` (its `question` is a placeholder, -1).

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
                      without_passage=names.index("original"), gate=gate)

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


def candidate_option(candidate: Candidate, lm: LoadedModel, selection,
                     betas: Mapping[str, tuple[float, float]]) -> "Steering | Contrast":
    """What the engine decodes a candidate with: a steering (:class:`juice.steering.Steering`:
    Original, a head steering at the candidate's `betas`), the question alone
    (:data:`juice.engine.QUESTION_ALONE`), or AdaCAD's contrast with the question-only row.

    Raises:
        KeyError: a steered candidate without betas in `betas`.
        ValueError: a candidate whose method auto cannot run.
        IndexError: a head outside the model.
    """
    if candidate.method is None:
        return QUESTION_ALONE
    if candidate.steered:
        return _PRESETS[candidate.method](lm, selection, *betas[candidate.name])
    recipe = _UNSTEERED_RECIPES.get(candidate.method)
    if recipe is None:
        raise ValueError(f"auto cannot run {candidate.method!r} as a candidate")
    return recipe()


_UNSTEERED_RECIPES = {"original": lambda: ORIGINAL, "adacad": lambda: Contrast(-1, CadPolicy(jsd_alpha))}
"""The candidates' methods without heads, as the engine runs them inside a choice (AdaCAD: CAD at
the JSD in bits, :func:`juice.baselines.cad.jsd_alpha`, against the question-only row)."""


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


def has_passage(lm: LoadedModel, prompts: Sequence[str], questions: Sequence[str]) -> list[bool]:
    """Per request, whether it has a passage: its prompt's token ids differ from its question's
    (the structure :class:`juice.engine.Choice` decides "no passage" by; module docstring).

    Raises:
        ValueError: `prompts` and `questions` of different lengths.
    """
    from juice.tokens import token_ids

    if len(prompts) != len(questions):
        raise ValueError("one question per prompt")
    return [token_ids(lm.tokenizer, p) != token_ids(lm.tokenizer, q) for p, q in zip(prompts, questions)]


def first_step_signal(lm: LoadedModel, prompts: Sequence[str], questions: Sequence[str], *, batch: int = 16) -> Tensor:
    """`[n]` first-step JSD (bits) between each prompt's and its question's next-token
    distributions under the unmodified model (the policy's signal), batched (left padding).

    A request without a passage (:func:`has_passage`) gets exactly 0, by its structure, and is
    not computed: the two rows of one text at different places in a padded batch agree only to
    about 1e-8 in fp32, processor-dependent. The others agree with one at a time to that order.

    Raises:
        ValueError: `prompts` and `questions` of different lengths.
    """
    return first_step_features(lm, prompts, questions, batch=batch)[SIGNAL]


@torch.inference_mode()
def first_step_features(lm: LoadedModel, prompts: Sequence[str], questions: Sequence[str], *, batch: int = 16
                        ) -> dict[str, Tensor]:
    """The first step's signals of each request from one batched pass: :data:`SIGNAL` (the bins'
    JSD, :func:`first_step_signal`) and the model-based gate signals (:func:`gate_signal`), each
    `[n]`, 0 for a request without a passage (not computed; never gated: module docstring).

    Raises:
        ValueError: `prompts` and `questions` of different lengths.
    """
    from juice.engine import forward_last
    from juice.tokens import pad_left, token_ids

    passage = has_passage(lm, prompts, questions)
    rows = [k for k, p in enumerate(passage) if p]
    texts = [prompts[k] for k in rows] + [questions[k] for k in rows]
    names = (SIGNAL, *GATE_SIGNALS[1:])
    out = {name: torch.zeros(len(prompts)) for name in names}
    if not texts:
        return out
    logits = []
    for at in range(0, len(texts), batch):
        ids = [token_ids(lm.tokenizer, t) for t in texts[at:at + batch]]
        b = pad_left(ids, lm.tokenizer.pad_token_id or 0)
        hidden, _ = forward_last(lm, b.input_ids.to(lm.device), b.attention_mask.to(lm.device),
                                 b.position_ids.to(lm.device))
        logits.append(lm.logits(hidden).float().cpu())
    both = torch.cat(logits)
    with_context, question, at = both[:len(rows)], both[len(rows):], torch.tensor(rows)
    out[SIGNAL][at] = jsd_alpha(with_context, question).to(torch.float32)
    for name in GATE_SIGNALS[1:]:
        out[name][at] = gate_signal(name, with_context, question).to(torch.float32)
    return out


@dataclass
class AutoFit:
    """A policy chosen on validation items, and what it scored there.

    Attributes:
        policy: the chosen :class:`AutoPolicy`.
        mean: its validation mean over context types (use relevant context, %).
        static: each candidate alone: its validation mean (%).
        per_type: the policy's validation accuracy per context type (%).
        tried: policies compared.
    """

    policy: AutoPolicy
    mean: float
    static: dict[str, float]
    per_type: dict[str, float]
    tried: int
    degeneration: dict[str, float] = field(default_factory=dict)
    refused: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"mean": round(self.mean, 4), "static": {k: round(v, 4) for k, v in self.static.items()},
                "per_type": {k: round(v, 4) for k, v in self.per_type.items()}, "tried": self.tried,
                "degeneration": {k: round(v, 4) for k, v in self.degeneration.items()},
                "refused_for_degeneration": list(self.refused)}


GATE_GRID = 12
"""At most this many relevance thresholds tried: quantiles of the validation relevance."""


def _weights(types: Sequence[str], sources: Sequence[str]) -> tuple["np.ndarray", list[str]]:
    """Per item, its weight in the mean over context types of the mean over sources (percent),
    and the context types present."""
    import numpy as np

    present = [t for t in CONTEXT_TYPES if t in set(types)]
    count: dict[tuple[str, str], int] = {}
    for t, src in zip(types, sources):
        count[t, src] = count.get((t, src), 0) + 1
    per_type_sources = {t: sum(1 for (tt, _) in count if tt == t) for t in present}
    return np.array([100.0 / (len(present) * per_type_sources[t] * count[t, src]) for t, src in zip(types, sources)]), present


GateValues = Mapping[str, Sequence[float]] | Sequence[float]
"""Per item, the gate signals: gate signal name (:data:`GATE_SIGNALS`) -> per item, its value; a
plain sequence is the lexical one (:func:`passage_relevance`)."""


def _gate_values(relevance) -> dict[str, list[float]]:
    if relevance is None:
        return {}
    if isinstance(relevance, Mapping):
        return {name: [float(v) for v in values] for name, values in relevance.items()}
    return {RELEVANCE: [float(v) for v in relevance]}


def policy_picks(policy: AutoPolicy, signal: Sequence[float], passage: Sequence[bool],
                 relevance: GateValues | None = None) -> list[str]:
    """Per item, the candidate `policy` decodes it with: Original without a passage, the gate's
    pick below its threshold on its signal (`relevance[policy.gate]`), else the bin's (as
    :class:`juice.engine.Choice` decides)."""
    gate = _gate_values(relevance).get(policy.gate)
    out = []
    for k, (x, has) in enumerate(zip(signal, passage)):
        if not has:
            out.append("original")
        elif policy.relevance is not None and gate is not None and gate[k] < policy.relevance:
            out.append(policy.irrelevant)
        else:
            out.append(policy.picks[sum(x >= e for e in policy.thresholds)])
    return out


def fit_policy(verdicts: Mapping[str, Sequence[bool]], signal: Sequence[float], types: Sequence[str],
               sources: Sequence[str], betas: Mapping[str, tuple[float, float]],
               passage: Sequence[bool] | None = None, degenerate: Mapping[str, Sequence[bool]] | None = None,
               margin: float = DEGENERATION_MARGIN, relevance: GateValues | None = None) -> AutoFit:
    """Choose a relevance gate, thresholds and a candidate per bin (module docstring) from
    validation outcomes: every gate (none, or, for each gate signal given, a threshold among
    :data:`GATE_GRID` quantiles of its validation values with each candidate below it) and every
    set of at most :data:`MAX_THRESHOLDS` thresholds among :data:`THRESHOLD_GRID` quantiles of the
    signal, with the best candidate per bin; the highest mean wins, ties going to no gate, fewer
    bins, less steered candidates and the earlier gate signal in :data:`GATE_SIGNALS`.

    Args:
        verdicts: candidate name -> per item, its use-relevant verdict ("original" required).
        signal: per item, the first-step JSD (bits).
        types, sources: per item, its context type and source.
        betas: the steered candidates' betas.
        passage: per item, whether it has a passage (:func:`has_passage`); default: every item
            but the "none" ones. An item without one is decoded with Original whatever the
            bins (:attr:`juice.engine.Choice.without_passage`): it scores Original's verdict
            and never moves a threshold.
        degenerate: candidate name -> per item, whether its output is degenerate; a candidate
            whose share exceeds Original's by more than `margin` points is never picked.
        relevance: the gate signals to try (:data:`GateValues`: name -> per item; a plain
            sequence is :func:`passage_relevance`); None: no gate is tried.

    Returns:
        the :class:`AutoFit`: the objective is the mean over context types of the accuracy
        averaged over sources, as :func:`juice.eval.contexts.context_type_means` reports it.

    Raises:
        ValueError: no items, lists of different lengths, or no "original" verdicts.
    """
    import numpy as np

    n = len(signal)
    passage = [t != "none" for t in types] if passage is None else [bool(p) for p in passage]
    if (not n or any(len(v) != n for v in verdicts.values()) or len(types) != n or len(sources) != n
            or len(passage) != n or any(len(v) != n for v in _gate_values(relevance).values())):
        raise ValueError("auto: one verdict, signal, type, source, passage flag and relevance per validation item")
    if "original" not in verdicts:
        raise ValueError("auto: the fit needs Original's verdicts (the choice without a passage)")
    names = [c for c in CANDIDATES if c in verdicts]
    share = {c: 100.0 * sum(map(bool, d)) / len(d) for c, d in (degenerate or {}).items() if len(d)}
    refused = tuple(c for c in names if c in share and "original" in share and share[c] > share["original"] + margin)
    names = [c for c in names if c not in refused]
    weight, present = _weights(types, sources)
    has = np.array(passage)
    x = np.array([float(v) for v in signal])
    score = np.stack([weight * np.array([bool(v) for v in verdicts[c]]) * has for c in names])   # [cands, n]
    fixed = float((weight * np.array([bool(v) for v in verdicts["original"]]))[~has].sum())
    values = {name: np.array(v) for name, v in _gate_values(relevance).items()}
    unknown = [name for name in values if name not in GATE_SIGNALS]
    if unknown:
        raise ValueError(f"auto: unknown gate signal {unknown[0]!r}; choose from {', '.join(GATE_SIGNALS)}")

    cuts = _midpoints(x[has], THRESHOLD_GRID)
    splits = []   # (k, edges, [n, k + 1] one-hot bins): the same for every gate
    for k in range(MAX_THRESHOLDS + 1):
        for edges in itertools.combinations(cuts, k):
            onehot = np.zeros((n, k + 1))
            onehot[np.arange(n), np.searchsorted(np.array(edges), x, side="right") if k else 0] = 1.0
            splits.append((k, edges, onehot))
    gates: list[tuple[str | None, float | None, int | None]] = [(None, None, None)]
    if has.any():
        gates += [(name, g, j) for name in GATE_SIGNALS if name in values
                  for g in _midpoints(values[name][has], GATE_GRID) for j in range(len(names))]
    steer_rank = np.array([CANDIDATES.index(c) for c in names])
    best: tuple | None = None
    tried = 0
    for gate_name, gate, gate_pick in gates:
        below = np.zeros(n, dtype=bool) if gate is None else has & (values[gate_name] < gate)
        gated = 0.0 if gate is None else float(score[gate_pick][below].sum())
        live = score * ~below   # [cands, n]: items that reach the bins
        rank = 0 if gate_name is None else GATE_SIGNALS.index(gate_name)
        for k, edges, onehot in splits:
            per_bin = live @ onehot   # [cands, bins]
            picks = np.round(per_bin, 9).argmax(0)   # the best candidate per bin, ties to the less steered
            total = fixed + gated + float(per_bin[picks, np.arange(k + 1)].sum())
            tried += 1
            key = (round(total, 9), gate is None, -k, -int(steer_rank[picks].sum()), -rank)
            if best is None or key > best[0]:
                best = (key, gate_name, gate, gate_pick, edges, tuple(names[j] for j in picks))
    _, gate_name, gate, gate_pick, edges, picks = best
    if len(set(picks)) == 1:   # one candidate everywhere: no thresholds needed
        edges, picks = (), picks[:1]
    irrelevant = "question" if gate is None else names[gate_pick]
    used = set(picks) | ({irrelevant} if gate is not None else set())
    policy = AutoPolicy(tuple(float(e) for e in edges), tuple(picks),
                        {c: tuple(betas[c]) for c in used if c not in UNSTEERED},
                        None if gate is None else float(gate), irrelevant, gate_name or RELEVANCE)
    chosen_names = policy_picks(policy, signal, passage, relevance)
    chosen = [verdicts[c][i] for i, c in enumerate(chosen_names)]
    static = {c: sum(_type_means(verdicts[c], types, sources, present).values()) / len(present)
              for c in [*names, *refused]}
    per_type = _type_means(chosen, types, sources, present)
    return AutoFit(policy, sum(per_type.values()) / len(present), static, per_type, tried, share, refused)


def _midpoints(values, size: int) -> list[float]:
    """The midpoints between consecutive distinct `values` (a numpy array), thinned to at most
    `size` evenly spaced ones: the candidate thresholds of :func:`fit_policy`."""
    order = sorted(set(values.tolist()))
    cuts = [(a + b) / 2 for a, b in zip(order, order[1:])]
    if len(cuts) > size:
        cuts = sorted({cuts[round(i * (len(cuts) - 1) / (size - 1))] for i in range(size)})
    return cuts


def _type_means(values: Sequence[bool], types: Sequence[str], sources: Sequence[str], present: Sequence[str]
                ) -> dict[str, float]:
    """Context type -> accuracy (%) of `values` averaged over sources, for the types `present`."""
    out = {}
    for t in present:
        srcs = sorted({src for tt, src in zip(types, sources) if tt == t})
        out[t] = sum(100.0 * sum(bool(v) for v, tt, ss in zip(values, types, sources) if tt == t and ss == src)
                     / sum(1 for tt, ss in zip(types, sources) if tt == t and ss == src) for src in srcs) / len(srcs)
    return out


def cross_validate(verdicts: Mapping[str, Sequence[bool]], static: Mapping[str, Sequence[bool]],
                   signal: Sequence[float], types: Sequence[str], sources: Sequence[str], groups: Sequence[Any],
                   betas: Mapping[str, tuple[float, float]], *, passage: Sequence[bool] | None = None,
                   degenerate: Mapping[str, Sequence[bool]] | None = None, relevance: GateValues | None = None,
                   folds: int = 5, seed: int = 0, margin: float = DEGENERATION_MARGIN) -> dict[str, Any]:
    """Cross-validate the fit (:func:`fit_policy`) against the best static method, grouped: the
    items of one group (a question, or a whole source for leave-one-domain-out) are never split
    between training and held-out folds. In each fold the policy and the best static method
    (highest training mean among `static`) are chosen on the training items and applied to the
    held-out ones; every item is held out once.

    Args:
        verdicts: auto's candidates' verdicts (as :func:`fit_policy`).
        static: every static method's verdicts (name -> per item), the candidates among them or not.
        groups: per item, its group; folds: the number of folds (at most the number of groups;
            `folds=0`: one fold per group, e.g. per source).

    Returns:
        {"auto": per item, the held-out policy's verdict; "best_static": the held-out best
        static method's; "chosen": per fold, the best static method's name; "folds": k}.

    Raises:
        ValueError: see :func:`fit_policy`; fewer than two groups.
    """
    import random

    distinct = list(dict.fromkeys(groups))
    if len(distinct) < 2:
        raise ValueError("auto: cross-validation needs at least two groups")
    k = len(distinct) if folds <= 0 else min(folds, len(distinct))
    order = distinct[:]
    random.Random(seed).shuffle(order)
    fold_of = {g: i % k for i, g in enumerate(order)}
    passage = [t != "none" for t in types] if passage is None else list(passage)
    gates = _gate_values(relevance)
    auto = [False] * len(signal)
    best = [False] * len(signal)
    chosen = []
    for f in range(k):
        train = [i for i, g in enumerate(groups) if fold_of[g] != f]
        held = [i for i, g in enumerate(groups) if fold_of[g] == f]
        pick = lambda seq: [seq[i] for i in train]   # noqa: E731
        fit = fit_policy({c: pick(v) for c, v in verdicts.items()}, pick(signal), pick(types), pick(sources), betas,
                         pick(passage), None if degenerate is None else {c: pick(v) for c, v in degenerate.items()},
                         margin, {name: pick(v) for name, v in gates.items()} if gates else None)
        train_w, _ = _weights(pick(types), pick(sources))
        name = max(static, key=lambda m: (round(float(sum(w * bool(static[m][i]) for w, i in zip(train_w, train))), 9),
                                          -list(static).index(m)))
        chosen.append(name)
        picks = policy_picks(fit.policy, [signal[i] for i in held], [passage[i] for i in held],
                             {name: [v[i] for i in held] for name, v in gates.items()})
        for i, c in zip(held, picks):
            auto[i] = bool(verdicts[c][i])
            best[i] = bool(static[name][i])
    return {"auto": auto, "best_static": best, "chosen": chosen, "folds": k}


def tune_auto(lm: LoadedModel, artifact, items: ContextItems | Sequence[ContextItem], *,
              where: Mapping[str, Any] | None = None, max_rows: int | str = 64,
              on_progress=None) -> AutoFit:
    """Tune `auto` on validation context items and write it into `artifact.tuned["auto"]`
    (module docstring). Reads `items` only (never test items: give validation data).

    Args:
        artifact: the heads file (:class:`juice.stage1.HeadsArtifact`); its tuned JuICE (and
            JuNE) betas are the candidates' (defaults where untuned).
        items: validation items (:func:`juice.when_to_steer.context_items` of a validation source).
        where: the data's provenance, saved beside the policy.

    Returns:
        the :class:`AutoFit`.

    Raises:
        ValueError: no items.
    """
    from juice.eval.contexts import evaluate_context_types, question_only_results

    items = items.items if isinstance(items, ContextItems) else list(items)
    if not items:
        raise ValueError("auto: no validation items to tune on")
    methods = candidate_methods(lm, artifact)
    results = evaluate_context_types(lm, items, methods, max_rows=max_rows, on_progress=on_progress)
    titles = {c: c for c in methods}
    alone = question_only_results(items, results, original="original", name="question")
    if len(alone) == len(items):   # every question has its none item: the question-alone candidate
        results, titles = [*results, *alone], {**titles, "question": "question"}
    fit = fit_from_results(lm, items, results, titles, candidate_betas(artifact.tuned))
    artifact.tuned = artifact.tuned.with_record("auto", {**fit.policy.to_json(), "validation": fit.to_json(),
                                                         "data": dict(where or {})})
    return fit


def candidate_methods(lm: LoadedModel, artifact) -> dict[str, "Method"]:   # noqa: F821
    """Candidate name -> its evaluation method (:class:`juice.recipe.Method`), at the heads
    file's betas (:func:`candidate_betas`)."""
    from juice.recipe import Method

    betas = candidate_betas(artifact.tuned)
    out = {}
    for c in CANDIDATE_TABLE:
        if c.method is None or (c.steered and c.name not in betas):
            continue   # the question alone is Original's output on the none item; an untuned JuNE is none
        option = candidate_option(c, lm, artifact.selection, betas)
        out[c.name] = Method(adacad=True) if isinstance(option, Contrast) else Method(option)
    return out


def fit_from_results(lm: LoadedModel, items: Sequence[ContextItem], results: Sequence, titles: Mapping[str, str],
                     betas: Mapping[str, tuple[float, float]], margin: float = DEGENERATION_MARGIN,
                     gate: bool = True) -> AutoFit:
    """Fit the policy (:func:`fit_policy`, with the relevance gate unless `gate` is False) from
    validation results already decoded.

    Args:
        items: the validation items, in order.
        results: :class:`juice.eval.runner.ItemResult` of every candidate on every item (a
            context-type evaluation's; other methods are ignored).
        titles: candidate name (:data:`CANDIDATES`) -> its method's name in `results`; a
            candidate absent from `titles` is not considered ("original" is required).
        betas: the steered candidates' betas.

    Raises:
        ValueError: a candidate without a result for some item, or no "original".
    """
    verdicts, degenerate = verdict_table(items, results, titles)
    signal, gates, passage = request_features(lm, items)
    return fit_policy(verdicts, signal, [i.context_type for i in items], [i.source for i in items], betas,
                      passage, degenerate, margin, gates if gate else None)


def request_features(lm: LoadedModel, items: Sequence[ContextItem]
                     ) -> tuple[list[float], dict[str, list[float]], list[bool]]:
    """Per item, what the policy reads: the first-step JSD (:func:`first_step_signal`), the gate
    signals (:data:`GATE_SIGNALS` -> per item: the passage's lexical relevance, :func:`relevance`,
    and the model-based ones, :func:`first_step_features`) and whether it has a passage
    (:func:`has_passage`)."""
    prompts, questions = [i.prompt for i in items], [i.question for i in items]
    features = first_step_features(lm, prompts, questions)
    gates = {RELEVANCE: relevance(lm, prompts, questions), **{n: features[n].tolist() for n in GATE_SIGNALS[1:]}}
    return features[SIGNAL].tolist(), gates, has_passage(lm, prompts, questions)


def verdict_table(items: Sequence[ContextItem], results: Sequence, titles: Mapping[str, str]
                  ) -> tuple[dict[str, list[bool]], dict[str, list[bool]]]:
    """(name -> per item, its use-relevant verdict; name -> per item, whether its output is
    degenerate) for each `titles` name (-> its method's name in `results`).

    Raises:
        ValueError: a method without a result for some item.
    """
    from juice.eval.contexts import result_id

    by_key = {(r.domain, r.item, r.conflict_type, r.method): r for r in results}
    verdicts: dict[str, list[bool]] = {}
    degenerate: dict[str, list[bool]] = {}
    for candidate, title in titles.items():
        rows = [by_key.get((i.source, result_id(i), i.context_type, title)) for i in items]
        if any(r is None for r in rows):
            raise ValueError(f"auto: {title!r} has no result for every validation item")
        verdicts[candidate] = [r.correct for r in rows]
        degenerate[candidate] = [r.degenerate for r in rows]
    return verdicts, degenerate


__all__ = ["AutoFit", "AutoPolicy", "AutoRule", "CANDIDATE", "CANDIDATES", "CANDIDATE_TABLE", "Candidate",
           "CONFIDENCE_GAIN", "CONTEXT_PEAKEDNESS", "GATE_SIGNALS", "GateValues", "RELEVANCE", "SIGNAL",
           "RelevanceGate", "first_step_features", "gate_signal", "candidate_betas", "candidate_option",
           "candidate_methods", "cross_validate", "first_step_signal", "fit_from_results", "fit_policy", "passage_of",
           "passage_relevance", "policy_picks", "relevance", "request_features", "verdict_table", "content_words",
           "has_passage", "policy_of", "tune_auto"]
