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

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from juice.baselines.cad import jsd_alpha
from juice.baselines.ckplug import confidence_gain
from juice.engine import QUESTION_ALONE, Choice, Contrast, forward_last
from juice.models import LoadedModel
from juice.steering import PRESETS, Steering, chosen_betas
from juice.tokens import pad_left, token_ids
from juice.tuned import TunedSettings

if TYPE_CHECKING:
    from juice.recipe import Method

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
        return self.method in PRESETS

    @property
    def label(self) -> str:
        """The suffix its title adds to its method's ("/2" for half the betas; "" for all)."""
        return "" if self.betas == 1 else f"/{1 / self.betas:g}"


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

    def choice(self, lm: LoadedModel, selection, recipe_of: RecipeOf) -> Choice:
        """The engine's :class:`~juice.engine.Choice` (its `question` is a placeholder, -1), the
        candidates built by `recipe_of` (:func:`juice.methods.recipe_of`).

        Raises:
            IndexError: a head outside the model.
        """
        names = self.candidates
        steerings = tuple(candidate_option(CANDIDATE[n], lm, selection, self.betas, recipe_of) for n in names)
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


RecipeOf = Callable[..., "Method"]
"""`(method name, model, selection, beta_plus, beta_minus) -> recipe`: how a candidate's method is
built, by the method registry (:func:`juice.methods.recipe_of`; passed in, so that this module,
which the registry's `auto` entry builds on, imports nothing above it)."""


def candidate_recipe(candidate: Candidate, lm: LoadedModel, selection, betas: Mapping[str, tuple[float, float]],
                     recipe_of: RecipeOf) -> "Method | None":
    """A candidate's recipe (:class:`juice.recipe.Method`) as the registry builds its method: a
    head steering at the candidate's `betas`, Original, AdaCAD; None for the question alone.

    Raises:
        KeyError: a steered candidate without betas in `betas`.
        IndexError: a head outside the model.
    """
    if candidate.method is None:
        return None
    if candidate.steered:
        return recipe_of(candidate.method, lm, selection, *betas[candidate.name])
    return recipe_of(candidate.method, lm, None, None, None)


def candidate_option(candidate: Candidate, lm: LoadedModel, selection, betas: Mapping[str, tuple[float, float]],
                     recipe_of: RecipeOf) -> "Steering | Contrast":
    """What the engine decodes a candidate with inside a choice: its recipe's steering
    (:func:`candidate_recipe`), the question alone (:data:`juice.engine.QUESTION_ALONE`), or a
    contrastive recipe's rule against the question-only row (AdaCAD).

    Raises:
        KeyError: a steered candidate without betas in `betas`.
        ValueError: a candidate whose recipe a choice cannot run (an instruction, a choice).
        IndexError: a head outside the model.
    """
    recipe = candidate_recipe(candidate, lm, selection, betas, recipe_of)
    if recipe is None:
        return QUESTION_ALONE
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


def has_passage(lm: LoadedModel, prompts: Sequence[str], questions: Sequence[str]) -> list[bool]:
    """Per request, whether it has a passage: its prompt's token ids differ from its question's
    (the structure :class:`juice.engine.Choice` decides "no passage" by; module docstring).

    Raises:
        ValueError: `prompts` and `questions` of different lengths.
    """

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


__all__ = ["AutoPolicy", "AutoRule", "CANDIDATE", "CANDIDATES", "CANDIDATE_TABLE", "CONFIDENCE_GAIN",
           "CONTEXT_PEAKEDNESS", "Candidate", "GATE_SIGNALS", "RELEVANCE", "RelevanceGate", "SIGNAL",
           "RecipeOf", "candidate_betas", "candidate_option", "candidate_recipe", "content_words", "first_step_features",
           "first_step_signal", "gate_signal", "has_passage", "passage_of", "passage_relevance", "policy_of", "relevance"]
