"""The evaluation runner: decode every (item, conflict type, method) in shared batches and score it
with the paper's metrics (:mod:`juice.eval.verdicts`) for Tables 1 and 2.

Parametric direction (paper Sec. 4, Table 1): greedy decoding of 10 new tokens; the first 5 words
are correct if any accepted answer occurs in them after normalization (lower case, accents
folded, punctuation and articles removed), matched on word boundaries. A row stops decoding once
its first 5 words are final (:func:`evaluate`): the same verdicts, a shorter stored output. Also recorded per item:
the first-step probability of the parametric and of the context answer's first token, and
whether the output follows the context answer instead.

Contextual direction (paper Sec. 4.2, Table 2; the target is the contextual answer):

- MemoTrap: greedy decoding of 10 new tokens; correct if the first words of the output equal the
  words of the instruction-following continuation (lower case, punctuation stripped from the
  ends of each word). Also the likelihood comparison most peers report: correct if the
  continuation's summed log-probability beats the memorised one's (teacher forcing).
- NQ-Swap: greedy decoding of 20 new tokens; correct if a normalized substituted answer is a
  substring of the normalized output.

Methods are :class:`Method`s: a steering (Original, JuNE, JuICE, PH3's pruning), optionally the
Prompt baseline's instruction (:mod:`juice.baselines.prompt`), or CAD and AdaCAD
(:mod:`juice.baselines.cad`, contextual direction only).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace

import torch
from torch import Tensor

from juice.baselines.cad import contrast_generate
from juice.baselines.prompt import contextual_prompt, parametric_prompt
from juice.eval.degeneration import is_degenerate
from juice.data.records import CONFLICT_TYPES, CONTEXT_TYPE, ConflictExample, ContextualExample
from juice.engine import Contrast, Instructed, QuestionAlone, Stream
from juice.engine.backend import Engine, engine_or_default
from juice.engine.likelihood import continuation_ids
from juice.io import UnitCheckpoint
from juice.methods import row_key, row_title
from juice.data.metrics import CONTEXTUAL, METRICS, N_WORDS, is_correct, metrics_for
from juice.eval.verdicts import contextual_correct
from juice.models import LoadedModel
from juice.steering import Steering
from juice.text import first_words_final
from juice.tokens import answer_first_token
from juice.progress import OnProgress
from juice.recipe import Method, as_method

MAX_NEW_TOKENS = METRICS["first_words"].new_tokens
"""The paper's exact match decodes this many new tokens (:data:`juice.data.metrics.METRICS`)."""


def method_engine(method: "Method | Steering", engine: Engine | None = None) -> str:
    """Which engine decodes a method's rows: `engine`'s name, or "juice (<reason>)" where
    `engine` hands the method's streams to juice's own (:meth:`juice.engine.backend.Engine.decodes`);
    for the results' `protocol.engine`."""
    method, engine = as_method(method), engine_or_default(engine)
    if method.contrast is not None:
        stream = Stream(0, contrast=Contrast(1, method.contrast))
    elif method.choice is not None:
        stream = Stream(0, choice=replace(method.choice, question=1,
                                          instructed=2 if method.choice.needs_instruction else None))
    else:
        stream = Stream(0, method.steering)
    reason = engine.decodes(stream)
    return engine.name if reason is None else f"juice ({reason})"


@dataclass(frozen=True)
class ItemResult:
    """One (example, conflict type, method) evaluation.

    Attributes:
        domain: the ParaConflict domain (e.g. "world_capital"); for MemoTrap / NQ-Swap items the
            dataset's name ("memotrap", "nqswap"); for your own rows the row's dataset label.
        subject: the item's subject; for MemoTrap / NQ-Swap items and your own rows, the item's id.
        conflict_type: "clean", "substitution" or "coherent"; "context" for MemoTrap / NQ-Swap
            items; for your own rows the row's label.
        method: the method's name in the run (a table row, or a tuning label such as "juice:2:-1").
        output: the decoded continuation.
        correct: exact match with the target answer (the metric of :mod:`juice.eval.verdicts`).
        follows_context: the output gives the context answer (parametric direction) instead.
        p_parametric, p_context: first-step probabilities of the parametric and the context
            answer's first token.
        item: the item's id within its domain (:attr:`juice.data.records.ConflictExample.uid`;
            for MemoTrap / NQ-Swap items and your own rows, the same as `subject`). Results of
            runs saved before it existed read as "" and are keyed by their subject.
    """

    domain: str
    subject: str
    conflict_type: str
    method: str
    output: str
    correct: bool
    follows_context: bool
    p_parametric: float
    p_context: float
    follows_parametric: bool | None = None   # contextual direction: output gives the memorised answer
    likelihood_correct: bool | None = None   # MemoTrap: the target class is the more likely one
    item: str = ""

    @property
    def item_key(self) -> tuple[str, str]:
        """(domain, item id) that tells this result's item from every other in a run (the
        subject for results saved without an item id)."""
        return self.domain, self.item or self.subject

    @property
    def degenerate(self) -> bool:
        """The output repeats itself (:func:`juice.eval.degeneration.is_degenerate`)."""
        return is_degenerate(self.output)


@dataclass(frozen=True)
class DecodeRequest:
    """One (prompt, method) to decode: `probe` holds the token ids whose first-step probabilities
    are returned; `question` is the prompt without its context (CAD, AdaCAD and auto only);
    `instructed` the prompt with the Prompt baseline's instruction toward memory (auto whose
    choice may decode it, :data:`juice.engine.INSTRUCTED`, only)."""

    prompt: str
    method: Method
    probe: Sequence[int]
    question: str | None = None
    instructed: str | None = None


def _request_key(r: DecodeRequest) -> tuple:
    """What a request's decoding depends on: its prompt, question, probe and method, its steering
    by :meth:`juice.steering.Steering.identity` (all-0 coefficients are the unmodified model)."""
    def key(s: "Steering | Contrast | QuestionAlone | Instructed") -> tuple:
        if isinstance(s, Contrast):   # a choice's contrast candidate (its question is the request's)
            return ("contrast", s.rule)
        if isinstance(s, QuestionAlone):
            return ("question alone",)
        if isinstance(s, Instructed):   # its prompt is the request's
            return ("instructed",)
        return s.identity()

    c = r.method.choice
    choice = None if c is None else (c.rule, tuple(key(s) for s in c.candidates), c.without_passage, c.gate)
    question = r.question if r.method.contrast is not None or c is not None else None
    instructed = r.instructed if c is not None and c.needs_instruction else None
    return (r.prompt, question, instructed, tuple(int(t) for t in r.probe), r.method.contrast, key(r.method.steering),
            choice)


def decode_requests(
    lm: LoadedModel, requests: Sequence[DecodeRequest], max_new_tokens: int, *, max_rows: int | str = 64,
    on_progress: OnProgress | None = None, stop_text: Callable[[str], bool] | None = None,
    engine: Engine | None = None, checkpoint: UnitCheckpoint | None = None,
) -> list[tuple[str, Tensor]]:
    """Greedy decoding of every request in one :func:`juice.engine.generate` call per
    intervention site (:attr:`juice.steering.Steering.site`; Original and CAD requests go with
    the rest): steered, unsteered and CAD / AdaCAD requests (contrastive streams,
    :class:`juice.baselines.cad.CadPolicy`) share its batches, and each distinct prompt (or
    question) is prefilled once.

    A row stops at the tokenizer's EOS and its text ends there, as Hugging Face's `generate`
    does for the authors' baselines (docs/protocol.md is silent on EOS; this is juice's choice, the
    same for every method); a batch stops once every row has produced EOS.

    Requests that are the same computation (:func:`_request_key`: same prompt and probe, same
    steering, a steering of all-zero coefficients counting as Original; e.g. Prompt's clean
    rows and Original's, or JuICE and JuNE at (beta+, beta-) = (0, 0)) are decoded once and
    share the result. With `stop_text`, a row stops once its text satisfies it
    (:func:`juice.engine.generate`'s `stop_text`); its text is what was decoded.

    Args:
        on_progress: called with the number of requests finished after each batch (and once
            with the number of duplicates at the end).
        engine: what decodes (:mod:`juice.engine.backend`); None: juice's own engine.
        checkpoint: where each decoded chunk is kept so that a killed call resumes
            (:func:`juice.engine.generate`'s `checkpoint`); only an engine in this process
            (`engine.in_process`) takes it, another decodes without.

    Returns:
        Per request, in order: (decoded text, `[len(probe)]` first-step probe probabilities).

    Raises:
        ValueError: a CAD / AdaCAD or choosing (auto) request without its question (or, where its
            choice may decode the instructed prompt, without that prompt).
    """
    firsts: dict[tuple, int] = {}
    copy_of = [firsts.setdefault(_request_key(r), i) for i, r in enumerate(requests)]
    unique = sorted(firsts.values())
    if len(unique) < len(requests):
        position = {u: k for k, u in enumerate(unique)}
        decoded = decode_requests(lm, [requests[i] for i in unique], max_new_tokens, max_rows=max_rows,
                                  on_progress=on_progress, stop_text=stop_text, engine=engine, checkpoint=checkpoint)
        if on_progress:
            on_progress(len(requests) - len(unique))   # the duplicates, done with their originals
        return [decoded[position[c]] for c in copy_of]
    out: list[tuple[str, Tensor]] = [None] * len(requests)  # type: ignore[list-item]

    def site_of(m: Method) -> str | None:
        sites = {s.site for s in (m.choice.candidates if m.choice is not None else (m.steering,))
                 if isinstance(s, Steering) and s.steers}
        return next(iter(sites)) if sites else None

    steered = {site_of(r.method) for r in requests} - {None}
    unsteered = next(iter(steered)) if len(steered) == 1 else "o_proj_input"   # Original joins the steered
    by_site: dict[str, list[int]] = {}
    for i, r in enumerate(requests):
        if r.method.contrast is not None and not r.question:
            raise ValueError(f"request {i + 1}: CAD and AdaCAD need the prompt without its context (question)")
        if r.method.choice is not None and not r.question:
            raise ValueError(f"request {i + 1}: auto needs the prompt without its context (question)")
        if r.method.choice is not None and r.method.choice.needs_instruction and not r.instructed:
            raise ValueError(f"request {i + 1}: auto with the Prompt candidate needs the instructed prompt")
        site = site_of(r.method) or unsteered
        by_site.setdefault(site, []).append(i)
    for site, idx in by_site.items():   # one call per intervention site (the steerings' own)
        texts: dict[str, int] = {}
        streams = []
        for i in idx:
            r = requests[i]
            prompt = texts.setdefault(r.prompt, len(texts))
            if r.method.choice is not None:
                question = texts.setdefault(r.question, len(texts))
                instructed = (texts.setdefault(r.instructed, len(texts)) if r.method.choice.needs_instruction
                              else None)
                streams.append(Stream(prompt, choice=replace(r.method.choice, question=question,
                                                             instructed=instructed)))
            elif r.method.contrast is None:
                streams.append(Stream(prompt, r.method.steering))
            else:
                question = texts.setdefault(r.question, len(texts))
                streams.append(Stream(prompt, contrast=Contrast(question, r.method.contrast)))
        decoder = engine_or_default(engine)
        kept = {"checkpoint": checkpoint} if checkpoint is not None and decoder.in_process else {}
        gen = decoder.generate(
            lm, list(texts), streams, max_new_tokens, probe_tokens=torch.tensor([list(requests[i].probe) for i in idx]),
            max_rows=max_rows, on_progress=on_progress, stop_at_eos=True, stop_text=stop_text, **kept)
        for i, text, probs in zip(idx, gen.texts, gen.first_probs):
            out[i] = (text, probs)
    return out


def exact_match_decided(tokenizer) -> Callable[[str], bool]:
    """The stop rule of :func:`evaluate`: the first :data:`~juice.data.metrics.N_WORDS` words of
    a text are final (:func:`juice.text.first_words_final`, margin 2 for a tokenizer that cleans
    up spaces when decoding)."""
    margin = 2 if getattr(tokenizer, "clean_up_tokenization_spaces", False) else 1
    return lambda text: first_words_final(text, N_WORDS, margin)


def evaluate(
    lm: LoadedModel,
    examples: Sequence[ConflictExample],
    methods: Mapping[str, "Method | Steering"],
    conflict_types: Sequence[str] = CONFLICT_TYPES,
    *,
    max_new_tokens: int = MAX_NEW_TOKENS,
    max_rows: int | str = 64,
    on_progress: OnProgress | None = None,
    full_outputs: bool = False,
    engine: Engine | None = None,
    checkpoint: UnitCheckpoint | None = None,
) -> list[ItemResult]:
    """Generate for every example x conflict type x method in shared batches and score them.

    Exact match reads the first 5 words only, so a row stops decoding once its text holds a
    sixth word (:func:`juice.text.first_words_final`; EOS still ends it earlier): the verdicts
    are those of the full `max_new_tokens`, and the stored `output` is what was decoded up to
    there, not the full continuation (`full_outputs=True` decodes every row to the end).

    All methods of one prompt share its clean prefill (see :mod:`juice.steering`).

    Args:
        methods: name -> :class:`Method` (or a bare steering); names label the results (e.g.
            "Original", "Prompt", "PH3-l", "JuICE").
        on_progress: called with the number of (prompt, method) streams finished.
        engine: what decodes (:mod:`juice.engine.backend`); None: juice's own engine.
        checkpoint: where decoded chunks are kept, so a killed call resumes
            (:func:`decode_requests`).

    Raises:
        EmptyAnswerError: an answer tokenizes to nothing.
        ValueError: a CAD method (CAD applies to the contextual direction).
    """
    methods = {name: as_method(m) for name, m in methods.items()}
    if any(m.contrast is not None for m in methods.values()):
        raise ValueError("the contrastive methods (CAD, AdaCAD, CK-PLUG, CoCoA, COIECD, GRD) apply to the "
                         "contextual direction; use evaluate_contextual")
    meta, requests = [], []
    model_type = lm.config.model_type
    for ex in examples:
        for t in conflict_types:
            for name, method in methods.items():
                prompt = parametric_prompt(ex, t, model_type) if method.instructed else ex.prompts[t]
                probe = [answer_first_token(lm.tokenizer, prompt, ex.answer),
                         answer_first_token(lm.tokenizer, prompt, ex.context_answer)]
                meta.append((ex, t, name))
                requests.append(DecodeRequest(prompt, method, probe))
    if not requests:
        return []
    decoded = decode_requests(lm, requests, max_new_tokens, max_rows=max_rows, on_progress=on_progress,
                              stop_text=None if full_outputs else exact_match_decided(lm.tokenizer), engine=engine,
                              checkpoint=checkpoint)
    results = []
    for (ex, t, name), (text, probs) in zip(meta, decoded):
        results.append(ItemResult(
            domain=ex.domain, subject=ex.subject, conflict_type=t, method=name, output=text,
            correct=is_correct(text, ex.answers),
            follows_context=is_correct(text, [ex.context_answer]),
            p_parametric=float(probs[0]), p_context=float(probs[1]), item=ex.uid,
        ))
    return results


def evaluate_contextual(
    lm: LoadedModel,
    examples: Sequence[ContextualExample],
    methods: Mapping[str, "Method | Steering"],
    *,
    likelihood: bool = True,
    max_rows: int | str = 64,
    on_progress: OnProgress | None = None,
    engine: Engine | None = None,
    checkpoint: UnitCheckpoint | None = None,
) -> list[ItemResult]:
    """Contextual-direction evaluation (module docstring): every example x method, generation
    batched per metric (10 new tokens for MemoTrap, 20 for NQ-Swap); CAD and AdaCAD as contrastive
    streams of the same batches (:func:`decode_requests`), their
    probabilities under the contrasted first-step distribution.

    Results use `domain` = dataset, `subject` = uid, `conflict_type` = "context"; `correct` means
    the contextual answer. With `likelihood`, MemoTrap items also get the likelihood comparison.
    `engine` decodes (:mod:`juice.engine.backend`; None: juice's own engine); `checkpoint` keeps
    the generation's decoded chunks, so a killed call resumes (:func:`decode_requests`; the
    likelihood comparison is redone).

    Raises:
        EmptyAnswerError: an answer tokenizes to nothing.
    """
    methods = {name: as_method(m) for name, m in methods.items()}
    results: dict[tuple[int, str], ItemResult] = {}
    for metric in metrics_for(CONTEXTUAL):
        new_tokens = METRICS[metric].new_tokens
        group = [(i, ex) for i, ex in enumerate(examples) if ex.metric == metric]
        if not group:
            continue
        meta, requests = [], []
        for i, ex in group:
            for name, method in methods.items():
                prompt = contextual_prompt(ex) if method.instructed else ex.prompt
                probe = [answer_first_token(lm.tokenizer, prompt, ex.parametric_answer),
                         answer_first_token(lm.tokenizer, prompt, ex.context_answer)]
                meta.append((i, ex, name))
                requests.append(DecodeRequest(prompt, method, probe, ex.question))
        decoded = decode_requests(lm, requests, new_tokens, max_rows=max_rows, on_progress=on_progress,
                                  engine=engine, checkpoint=checkpoint)
        for (i, ex, name), (text, probs) in zip(meta, decoded):
            correct = contextual_correct(ex, text, ex.context_answers)
            results[(i, name)] = ItemResult(
                domain=ex.dataset, subject=ex.uid, conflict_type=CONTEXT_TYPE, method=name, output=text,
                correct=correct, follows_context=correct,
                p_parametric=float(probs[0]), p_context=float(probs[1]),
                follows_parametric=contextual_correct(ex, text, ex.parametric_answers), item=ex.uid,
            )
    if likelihood:
        memo = [(i, ex) for i, ex in enumerate(examples) if METRICS[ex.metric].likelihood]
        wins = likelihood_wins(lm, [ex for _, ex in memo], methods, max_rows=max_rows, engine=engine)
        for name in methods:
            for (i, _), win in zip(memo, wins[name]):
                r = results[(i, name)]
                results[(i, name)] = ItemResult(**{**asdict(r), "likelihood_correct": bool(win)})
    return [results[(i, name)] for i in range(len(examples)) for name in methods if (i, name) in results]


def likelihood_wins(
    lm: LoadedModel, examples: Sequence[ContextualExample], methods: Mapping[str, "Method | Steering"], *,
    max_rows: int | str = 64, engine: Engine | None = None,
) -> dict[str, list[bool]]:
    """MemoTrap's classification metric: for each method and example, whether the contextual
    continuation has a higher summed log-probability than the memorised one (teacher forcing).

    Both continuations of every method are scored by forced decoding in shared batches
    (:func:`juice.engine.generate` with `forced_tokens`; CAD and AdaCAD by
    :func:`juice.baselines.cad.cad_generate` with `forced_tokens`, under the contrasted
    distribution), so a prompt's clean prefill is computed once. `engine` decodes (None: juice's).

    Returns:
        method name -> one bool per example.
    """
    methods = {name: as_method(m) for name, m in methods.items()}
    if not examples:
        return {name: [] for name in methods}
    prompts: dict[str, int] = {}
    streams, conts, owners, cad = [], [], [], {}
    for name, method in methods.items():
        for j, ex in enumerate(examples):
            prompt = contextual_prompt(ex) if method.instructed else ex.prompt
            for c, text in enumerate((ex.context_answer, ex.parametric_answer)):
                cont = continuation_ids(lm.tokenizer, prompt, text)[1]
                if method.contrast is not None:
                    cad.setdefault(method.contrast, []).append((name, j, c, prompt, ex.question, cont))
                    continue
                # each distinct prompt once, so its streams share one clean prefill
                streams.append(Stream(prompts.setdefault(prompt, len(prompts)), method.steering))
                conts.append(cont)
                owners.append((name, j, c))
    logprob: dict[tuple[str, int, int], float] = {}

    def forced(cs: list[list[int]]) -> tuple[Tensor, int]:
        width = max(map(len, cs))
        out = torch.full((len(cs), width), lm.tokenizer.pad_token_id or 0, dtype=torch.long)
        for i, c in enumerate(cs):
            out[i, : len(c)] = torch.tensor(c)
        return out, width

    if streams:
        tokens, width = forced(conts)
        gen = engine_or_default(engine).generate(lm, list(prompts), streams, width, max_rows=max_rows,
                                                 forced_tokens=tokens)
        for key, cont, lp in zip(owners, conts, gen.forced_logprobs):
            logprob[key] = float(lp[: len(cont)].sum())
    for rule, items in cad.items():
        tokens, width = forced([it[5] for it in items])
        gen = contrast_generate(lm, [it[3] for it in items], [it[4] for it in items], width, rule,
                                max_rows=max_rows, forced_tokens=tokens, engine=engine)
        for it, lp in zip(items, gen.forced_logprobs):
            logprob[it[:3]] = float(lp[: len(it[5])].sum())
    return {name: [logprob[(name, j, 0)] > logprob[(name, j, 1)] for j in range(len(examples))] for name in methods}


def titled(results: Sequence[ItemResult]) -> list[ItemResult]:
    """`results` with their rows named by title (:func:`juice.methods.row_title`), as the state
    and results.json hold them."""
    return [replace(r, method=row_title(r.method)) for r in results]


def keyed(results: Sequence[ItemResult]) -> list[ItemResult]:
    """`results` read from a state or results file, their rows named by key again (:func:`juice.methods.row_key`)."""
    return [replace(r, method=row_key(r.method)) for r in results]


def summary(results: Sequence[ItemResult]) -> dict[str, dict[str, float]]:
    """method -> mean accuracy, follows-context rate (contextual direction: also the rate of
    outputs giving the memorised answer) and answer probabilities (over all items)."""
    by_method: dict[str, list[ItemResult]] = defaultdict(list)
    for r in results:
        by_method[r.method].append(r)
    out = {}
    for m, rs in by_method.items():
        n = len(rs)
        out[m] = {
            "n": n,
            "accuracy": 100.0 * sum(r.correct for r in rs) / n,
            "follows_context": 100.0 * sum(r.follows_context for r in rs) / n,
            "p_parametric": sum(r.p_parametric for r in rs) / n,
            "p_context": sum(r.p_context for r in rs) / n,
        }
        parametric = [r.follows_parametric for r in rs if r.follows_parametric is not None]
        if parametric:
            out[m]["follows_parametric"] = 100.0 * sum(parametric) / len(parametric)
    return out


def results_to_json(results: Sequence[ItemResult]) -> list[dict]:
    return [asdict(r) for r in results]


def results_from_json(rows: Sequence[dict]) -> list[ItemResult]:
    return [ItemResult(**r) for r in rows]


__all__ = ["ItemResult", "method_engine", "evaluate", "evaluate_contextual", "likelihood_wins",
           "results_from_json", "results_to_json", "summary"]
