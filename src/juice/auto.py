"""`auto`: steering that decides per request whether to steer, and how strongly (issue 35, part 2;
juice's own method, not the paper's).

The signal is AdaCAD's (Wang et al., NAACL 2025): the Jensen-Shannon divergence, in bits, between
the model's next-token distribution with the context and without it (the question alone), at the
first step, from the unmodified model (:func:`juice.baselines.cad.jsd_alpha`). A passage that
changes the model's mind moves it toward 1. A policy (:class:`AutoPolicy`) cuts the signal of a
request **with a passage** into at most three bins by thresholds and names a candidate per bin:

- "original": the unmodified model;
- "juice": JuICE with the heads file's tuned betas (paper protocol, conflicting validation items);
- "juice/2": JuICE at half those betas;
- "june": JuNE with its tuned betas (when the file has them);
- "adacad": AdaCAD (Wang et al. 2025), the contrast with the question-only row that the choice's
  prefill already holds.

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
candidate is decoded on the validation items of the four context types
(:mod:`juice.data.context_types`), the signal is computed for each, and the thresholds (from the
signal's quantiles) and the candidate per bin are chosen to maximize the **use relevant context**
objective (gold and conflicting: the context's answer; irrelevant and none: the memory answer),
averaged over the context types, ties going to fewer bins and to the less steered candidate. A
candidate whose share of degenerate validation outputs (:mod:`juice.eval.degeneration`) exceeds
Original's by more than :data:`juice.eval.degeneration.DEGENERATION_MARGIN` points is never
chosen (`juice tune`'s rule). The result is written to the heads file
(`tuned["auto"]`) like the betas.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from juice.baselines.cad import CadPolicy, jsd_alpha
from juice.data.context_types import CONTEXT_TYPES, ContextItem, ContextItems
from juice.engine import Choice, Contrast
from juice.eval.degeneration import DEGENERATION_MARGIN
from juice.models import LoadedModel
from juice.steering import ORIGINAL, JuICE, JuNE, chosen_betas

SIGNAL = "jsd_bits"
"""The policy's signal: first-step JSD (bits) between the with-context and question-only distributions."""

CANDIDATES = ("original", "juice", "juice/2", "june", "adacad")
"""Candidate names, least steered first (the order ties are broken in)."""

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

    def __call__(self, with_context: Tensor, question: Tensor) -> Tensor:
        """`[rows]` long candidate indices of `[rows, vocab]` with-context and question-only logits."""
        signal = jsd_alpha(with_context, question)
        edges = torch.tensor(self.thresholds, dtype=signal.dtype, device=signal.device)
        bins = torch.bucketize(signal, edges, right=True)
        return torch.tensor(self.picks, dtype=torch.long, device=signal.device)[bins]


@dataclass(frozen=True)
class AutoPolicy:
    """Which candidate each signal bin decodes with (module docstring).

    Attributes:
        thresholds: ascending JSD values (bits), at most :data:`MAX_THRESHOLDS`.
        picks: a candidate name (:data:`CANDIDATES`) per bin: `len(thresholds) + 1` of them.
        betas: candidate name -> (beta+, beta-) for the steered candidates picked.

    Raises:
        ValueError: thresholds not ascending, a pick count that does not match, an unknown
            candidate, or a steered candidate without betas.
    """

    thresholds: tuple[float, ...] = ()
    picks: tuple[str, ...] = ("original",)
    betas: Mapping[str, tuple[float, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if list(self.thresholds) != sorted(self.thresholds) or len(self.thresholds) > MAX_THRESHOLDS:
            raise ValueError(f"auto: thresholds must be ascending, at most {MAX_THRESHOLDS}, got {list(self.thresholds)}")
        if len(self.picks) != len(self.thresholds) + 1:
            raise ValueError(f"auto: {len(self.thresholds)} thresholds need {len(self.thresholds) + 1} picks, "
                             f"got {len(self.picks)}")
        for name in self.picks:
            if name not in CANDIDATES:
                raise ValueError(f"auto: unknown candidate {name!r}; choose from {', '.join(CANDIDATES)}")
            if name not in ("original", "adacad") and name not in self.betas:
                raise ValueError(f"auto: candidate {name!r} needs its betas")

    @property
    def candidates(self) -> list[str]:
        """Original (the choice for a request without a passage) and the distinct candidates
        picked, in :data:`CANDIDATES` order."""
        return [c for c in CANDIDATES if c in self.picks or c == "original"]

    def choice(self, lm: LoadedModel, selection) -> Choice:
        """The engine's :class:`~juice.engine.Choice` (its `question` is a placeholder, -1).

        Raises:
            IndexError: a head outside the model.
        """
        names = self.candidates
        make = {"original": lambda: ORIGINAL,
                "adacad": lambda: Contrast(-1, CadPolicy(jsd_alpha)),
                "juice": lambda: JuICE(lm, selection, *self.betas["juice"]),
                "juice/2": lambda: JuICE(lm, selection, *self.betas["juice/2"]),
                "june": lambda: JuNE(lm, selection, *self.betas["june"])}
        steerings = tuple(make[n]() for n in names)
        return Choice(-1, steerings, AutoRule(tuple(float(t) for t in self.thresholds),
                                              tuple(names.index(p) for p in self.picks)),
                      without_passage=names.index("original"))

    def to_json(self) -> dict[str, Any]:
        return {"signal": SIGNAL, "thresholds": list(self.thresholds), "picks": list(self.picks),
                "betas": {k: {"beta_plus": v[0], "beta_minus": v[1]} for k, v in self.betas.items()}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "AutoPolicy":
        """Raises: ValueError: another signal or a malformed policy (one line)."""
        if data.get("signal", SIGNAL) != SIGNAL:
            raise ValueError(f"auto: unknown signal {data.get('signal')!r} (this juice reads {SIGNAL})")
        try:
            betas = {k: (float(v["beta_plus"]), float(v["beta_minus"])) for k, v in data.get("betas", {}).items()}
            return cls(tuple(float(t) for t in data["thresholds"]), tuple(str(p) for p in data["picks"]), betas)
        except (KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"auto: malformed policy in the heads file ({err!r})") from None


def candidate_betas(tuned: Mapping[str, Any] | None) -> dict[str, tuple[float, float]]:
    """Candidate name -> (beta+, beta-): "juice" and "juice/2" from the file's tuned JuICE betas
    (:func:`juice.steering.chosen_betas`, defaults where untuned), "june" where JuNE is tuned."""
    bp, bm, _ = chosen_betas("juice", dict(tuned or {}))
    out = {"juice": (bp, bm), "juice/2": (bp / 2, bm / 2)}
    if "june" in (tuned or {}):
        jp, jm, _ = chosen_betas("june", dict(tuned))
        out["june"] = (jp, jm)
    return out


def policy_of(tuned: Mapping[str, Any] | None) -> AutoPolicy:
    """The heads file's tuned policy (`tuned["auto"]`).

    Raises:
        ValueError: the file holds none (run `juice tune --methods auto`), or a malformed one.
    """
    if not tuned or "auto" not in tuned:
        raise ValueError("auto needs a policy tuned on validation items: run `juice tune --methods auto` "
                         "with validation data (NQ-Swap, ParaConflict) first")
    return AutoPolicy.from_json(tuned["auto"])


def auto_method(lm: LoadedModel, artifact) -> "Method":   # noqa: F821 (juice.eval.runner.Method)
    """The evaluation method of a heads file's tuned `auto` (:class:`juice.eval.runner.Method`).

    Raises:
        ValueError: see :func:`policy_of`.
    """
    from juice.eval.runner import Method

    return Method(choice=policy_of(artifact.tuned).choice(lm, artifact.selection))


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


@torch.inference_mode()
def first_step_signal(lm: LoadedModel, prompts: Sequence[str], questions: Sequence[str], *, batch: int = 16) -> Tensor:
    """`[n]` first-step JSD (bits) between each prompt's and its question's next-token
    distributions under the unmodified model (the policy's signal), batched (left padding).

    A request without a passage (:func:`has_passage`) gets exactly 0, by its structure, and is
    not computed: the two rows of one text at different places in a padded batch agree only to
    about 1e-8 in fp32, processor-dependent. The others agree with one at a time to that order.

    Raises:
        ValueError: `prompts` and `questions` of different lengths.
    """
    from juice.engine import forward_last
    from juice.tokens import pad_left, token_ids

    passage = has_passage(lm, prompts, questions)
    rows = [k for k, p in enumerate(passage) if p]
    texts = [prompts[k] for k in rows] + [questions[k] for k in rows]
    out = torch.zeros(len(prompts))
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
    out[torch.tensor(rows)] = jsd_alpha(both[:len(rows)], both[len(rows):]).to(out.dtype)
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


def fit_policy(verdicts: Mapping[str, Sequence[bool]], signal: Sequence[float], types: Sequence[str],
               sources: Sequence[str], betas: Mapping[str, tuple[float, float]],
               passage: Sequence[bool] | None = None, degenerate: Mapping[str, Sequence[bool]] | None = None,
               margin: float = DEGENERATION_MARGIN) -> AutoFit:
    """Choose thresholds and a candidate per bin (module docstring) from validation outcomes.

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

    Returns:
        the :class:`AutoFit`: the objective is the mean over context types of the accuracy
        averaged over sources, as :func:`juice.eval.contexts.context_type_means` reports it.

    Raises:
        ValueError: no items, lists of different lengths, or no "original" verdicts.
    """
    n = len(signal)
    passage = [t != "none" for t in types] if passage is None else [bool(p) for p in passage]
    if (not n or any(len(v) != n for v in verdicts.values()) or len(types) != n or len(sources) != n
            or len(passage) != n):
        raise ValueError("auto: one verdict, signal, type, source and passage flag per validation item")
    if "original" not in verdicts:
        raise ValueError("auto: the fit needs Original's verdicts (the choice without a passage)")
    names = [c for c in CANDIDATES if c in verdicts]
    share = {c: 100.0 * sum(map(bool, d)) / len(d) for c, d in (degenerate or {}).items() if len(d)}
    refused = tuple(c for c in names if c in share and "original" in share and share[c] > share["original"] + margin)
    names = [c for c in names if c not in refused]
    present = [t for t in CONTEXT_TYPES if t in set(types)]
    count: dict[tuple[str, str], int] = {}
    for t, s in zip(types, sources):
        count[t, s] = count.get((t, s), 0) + 1
    per_type_sources = {t: sum(1 for (tt, _) in count if tt == t) for t in present}
    weight = [100.0 / (len(present) * per_type_sources[t] * count[t, s]) for t, s in zip(types, sources)]
    score = {c: [w * bool(v) * p for w, v, p in zip(weight, verdicts[c], passage)] for c in names}
    fixed = sum(w * bool(v) for w, v, p in zip(weight, verdicts["original"], passage) if not p)
    order = sorted(set(float(x) for x, p in zip(signal, passage) if p))
    cuts = [(a + b) / 2 for a, b in zip(order, order[1:])]
    if len(cuts) > THRESHOLD_GRID:
        cuts = [cuts[round(i * (len(cuts) - 1) / (THRESHOLD_GRID - 1))] for i in range(THRESHOLD_GRID)]
        cuts = sorted(set(cuts))
    best: tuple | None = None
    tried = 0
    for k in range(MAX_THRESHOLDS + 1):
        for edges in itertools.combinations(cuts, k):
            bins = [sum(x >= e for e in edges) for x in signal]
            picks, total = [], fixed
            for b in range(k + 1):   # the best candidate per bin (the objective is a sum over items)
                gains = [sum(sc for sc, bb in zip(score[c], bins) if bb == b) for c in names]
                j = max(range(len(names)), key=lambda i: (round(gains[i], 9), -i))
                picks.append(names[j])
                total += gains[j]
            tried += 1
            steer = sum(CANDIDATES.index(p) for p in picks)
            key = (round(total, 9), -k, -steer)
            if best is None or key > best[0]:
                best = (key, edges, tuple(picks), total)
    _, edges, picks, total = best
    if len(set(picks)) == 1:   # one candidate everywhere: no thresholds needed
        edges, picks = (), picks[:1]
    policy = AutoPolicy(tuple(edges), tuple(picks),
                        {c: tuple(betas[c]) for c in set(picks) if c not in ("original", "adacad")})
    bins = [sum(x >= e for e in edges) for x in signal]
    chosen = [verdicts[picks[b] if p else "original"][i] for i, (b, p) in enumerate(zip(bins, passage))]

    def type_mean(values: Sequence[bool]) -> dict[str, float]:
        out = {}
        for t in present:
            srcs = sorted({s for tt, s in count if tt == t})
            out[t] = sum(100.0 * sum(bool(v) for v, tt, ss in zip(values, types, sources) if tt == t and ss == s)
                         / count[t, s] for s in srcs) / len(srcs)
        return out

    static = {c: sum(type_mean(verdicts[c]).values()) / len(present) for c in [*names, *refused]}
    per_type = type_mean(chosen)
    return AutoFit(policy, sum(per_type.values()) / len(present), static, per_type, tried, share, refused)


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
    from juice.eval.contexts import evaluate_context_types
    from juice.eval.runner import Method

    items = items.items if isinstance(items, ContextItems) else list(items)
    if not items:
        raise ValueError("auto: no validation items to tune on")
    betas = candidate_betas(artifact.tuned)
    steer = {"original": ORIGINAL, "juice": JuICE(lm, artifact.selection, *betas["juice"]),
             "juice/2": JuICE(lm, artifact.selection, *betas["juice/2"])}
    if "june" in betas:
        steer["june"] = JuNE(lm, artifact.selection, *betas["june"])
    methods = {c: Method(s) for c, s in steer.items()} | {"adacad": Method(adacad=True)}
    results = evaluate_context_types(lm, items, methods, max_rows=max_rows, on_progress=on_progress)
    by_item: dict[str, list[bool]] = {c: [] for c in methods}
    degenerate: dict[str, list[bool]] = {c: [] for c in methods}
    for r in results:   # in item order, per method
        by_item[r.method].append(r.correct)
        degenerate[r.method].append(r.degenerate)
    prompts, questions = [i.prompt for i in items], [i.question for i in items]
    signal = first_step_signal(lm, prompts, questions).tolist()
    fit = fit_policy(by_item, signal, [i.context_type for i in items], [i.source for i in items], betas,
                     has_passage(lm, prompts, questions), degenerate)
    artifact.tuned = {**artifact.tuned, "auto": {**fit.policy.to_json(), "validation": fit.to_json(),
                                                 "data": dict(where or {})}}
    return fit


__all__ = ["AutoFit", "AutoPolicy", "AutoRule", "CANDIDATES", "SIGNAL", "auto_method", "candidate_betas",
           "first_step_signal", "fit_policy", "has_passage", "policy_of", "tune_auto"]
