"""Your own data, end to end: identify heads, tune the betas, evaluate methods.

    import juice
    lm = juice.load_model("gemma-3-270m")
    heads = juice.identify(lm, "my_conflicts.jsonl", direction="context")      # Stage 1 (paper Alg. 2-3)
    juice.tune(lm, heads, "my_validation.jsonl")                                # (beta+, beta-) into `heads.tuned`
    report = juice.evaluate_file(lm, heads, "my_test.jsonl", ["original", "juice", "june"])

Rows come from :func:`juice.userdata.load_rows` (JSONL/CSV with `prompt`, `target`, optional
`other`, `conflict_type`, `question`, `aliases`; ParaConflict JSON; NQ-Swap JSONL; MemoTrap CSV).

Choices where the paper has no rule for arbitrary data (also in the README):

- Metric: the paper's exact match (an accepted answer, `target` or one of its `aliases`, among the
  first five words of 10 greedy new tokens, :func:`juice.data.metrics.is_correct`) for every file,
  NQ-Swap and MemoTrap included (their own metrics are `juice reproduce --direction contextual`'s).
- Groups: each `conflict_type` label is a column; "Average" is the mean over labels (the paper
  averages over conflict types), its interval a bootstrap within labels.
- Tuning (paper App. D.1): JuICE's and JuNE's (beta+, beta-) on the grid {0..5} x {0..-3}, and
  PH3's k in {1, 3, 5, 7, 9, 15}; best mean accuracy over labels, ties broken by the mean
  first-token probability of the target, then grid order.
- PH3 on your data: the knock-out scorer (zero each head, effect on the logit difference of
  target vs `other` at the last position) on the tuning rows that have `other`, since path
  patching needs counterfactual pairs of one template; heads that oppose the direction are
  pruned, k tuned with the betas.
- Prompt baseline: the paper's instruction for the direction (App. D.1): for the parametric
  direction the substitution instruction before the prompt ("coherent" labels: the coherent
  instruction and "Context: "; "clean" labels: no instruction), for the contextual direction the
  completion instruction and a line break.
- CAD and AdaCAD need each row's `question` (the prompt without its context).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from juice.baselines.ph3 import PRUNE_K, ConflictPrompt, Ph3Scores, heads_to_prune, logit_difference_effects
from juice.baselines.prompt import CONTEXTUAL_COMPLETION, instructed_parametric
from juice.data.records import Direction
from juice.engine.backend import Engine
from juice.eval.degeneration import correct_not_degenerate
from juice.data.metrics import is_correct
from juice.eval.runner import (
    MAX_NEW_TOKENS,
    DecodeRequest,
    ItemResult,
    decode_requests,
    exact_match_decided,
)
from juice.eval.tables import AVERAGE, IntervalTable, interval_table
from juice.eval.tuning import BETA_MINUS_GRID, BETA_PLUS_GRID, GridSetting
from juice.stage1 import HeadsArtifact, ScoringPrompt, make_artifact
from juice.models import LoadedModel
from juice.methods import REGISTRY, TUNED_STEERINGS, MethodInputs, build, check, lookup, names as method_names, row_title
from juice.progress import OnProgress, Progress, no_progress
from juice.recipe import Method, as_method
from juice.steering import ORIGINAL
from juice.tuned import DEGENERATION_MARGIN
from juice.tokens import answer_first_token
from juice.userdata import ConflictRow, file_digest, load_rows


def parse_direction(text: "str | Direction") -> Direction:
    """:meth:`juice.data.records.Direction.parse`: "parametric" (also "memory") or "contextual"
    (also "context").

    Raises:
        ValueError: anything else.
    """
    return Direction.parse(text)


def _rows(data: str | Path | Sequence[ConflictRow], direction: str,
          limit: int | None = None) -> tuple[list[ConflictRow], dict[str, Any]]:
    """Rows (the first `limit`, if given) and a record of where they came from (file, SHA-256
    prefix, count, labels)."""
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be a positive number of rows, got {limit}")
    if isinstance(data, (str, Path)):
        rows = load_rows(data, direction)
        where: dict[str, Any] = {"file": str(data), "sha256_16": file_digest(data)}
    else:
        rows = list(data)
        if not rows or not all(isinstance(r, ConflictRow) for r in rows):
            raise ValueError("data must be a file or a non-empty list of ConflictRow")
        where = {"file": None}
    if limit is not None:
        where["first_rows_of"] = len(rows)
        rows = rows[:limit]
    return rows, {**where, "rows": len(rows), "conflict_types": sorted({r.conflict_type for r in rows})}


# ---------------------------------------------------------------- Stage 1 on your rows


def identify(
    lm: LoadedModel, data: str | Path | Sequence[ConflictRow], *, direction: str = "parametric", k: int = 5,
    scoring: str = "exact", shortlist: int = 12, max_rows: int | str = 128, progress: Progress = no_progress,
    engine: Engine | None = None,
) -> HeadsArtifact:
    """Stage 1 (paper Sec. 3.2, Alg. 2-3) on every row of `data`: score each head by the change
    of the target's first-token probability under `H <- H + a*H`, keep heads non-negative for every
    `conflict_type` label present, top `k` per sign.

    Args:
        data: a data file (module docstring) or rows.
        direction: which answer the ParaConflict / NQ-Swap / MemoTrap rows promote (your own rows
            promote their `target` either way); recorded in the heads file.
        scoring: "exact" (the paper), "attribution" or "hybrid" (approximations, README).
        engine: what computes the exact scores (:mod:`juice.engine.backend`; None: juice's own).

    Returns:
        The heads artifact (save with :func:`juice.save_heads`); its `data` records the file.

    Raises:
        FileNotFoundError, ValueError: a missing or malformed file, an unknown direction or scoring.
        EmptyAnswerError: a target that tokenizes to nothing.
    """
    from juice.pipeline.run import ReproduceConfig
    from juice.pipeline.stages import score_prompts

    direction = parse_direction(direction)
    rows, where = _rows(data, direction)
    prompts = [ScoringPrompt(r.prompt, answer_first_token(lm.tokenizer, r.prompt, r.target), r.conflict_type)
               for r in rows]
    cfg = ReproduceConfig(model=lm.name, k=k, scoring=scoring, shortlist=shortlist, max_rows=max_rows)
    scores, selection = score_prompts(lm, cfg, prompts, progress, engine=engine)
    artifact = make_artifact(lm, scores, selection, k, direction, rows)
    artifact.data = where
    return artifact


# ---------------------------------------------------------------- one runner for rows


def instructed_prompt(row: ConflictRow, direction: str, model_type: str | None = None) -> str:
    """The Prompt baseline's form of `row.prompt` (module docstring; paper App. D.1): a row of
    another conflict type than clean or coherent gets the substitution form."""
    if direction == "contextual":
        return f"{CONTEXTUAL_COMPLETION}\n{row.prompt}"
    kind = row.conflict_type if row.conflict_type in ("clean", "coherent") else "substitution"
    return instructed_parametric(row.prompt, kind, model_type)


def evaluate_rows(
    lm: LoadedModel, rows: Sequence[ConflictRow], methods: Mapping[str, Method | Any], *, direction: str = "parametric",
    max_new_tokens: int = MAX_NEW_TOKENS, max_rows: int | str = 64, on_progress: OnProgress | None = None,
    full_outputs: bool = True, engine: Engine | None = None,
) -> list[ItemResult]:
    """Decode every row x method in shared batches (each distinct prompt's clean prefill once;
    CAD/AdaCAD in their own batches) and score by exact match against `target` and its aliases.
    With `full_outputs` False (the tuning's), a row stops once its first five words are final
    (:func:`juice.eval.runner.evaluate`): the same verdicts, outputs cut there. `engine` decodes
    (:mod:`juice.engine.backend`; None: juice's own).

    Results: `domain` = the row's `conflict_type` label (a table column), `subject` = the row's
    index, `conflict_type` = "all"; `p_parametric` / `p_context` = first-step probability of the
    first token of the parametric / context answer (target and `other` by direction; NaN where a
    row has no `other`); `follows_context` = the output gives the context answer.

    Raises:
        ValueError: CAD or AdaCAD on rows without `question`.
        EmptyAnswerError: an answer that tokenizes to nothing.
    """
    direction = parse_direction(direction)
    methods = {name: as_method(m) for name, m in methods.items()}
    requests = []
    for i, row in enumerate(rows):
        for name, method in methods.items():
            prompt = instructed_prompt(row, direction, lm.config.model_type) if method.instructed else row.prompt
            target = answer_first_token(lm.tokenizer, prompt, row.target)
            other = answer_first_token(lm.tokenizer, prompt, row.other) if row.other else target
            if method.contrast is not None and not row.question:
                raise ValueError(f"{name} needs each row's question (the prompt without its context); "
                                 f"row {i + 1} has none")
            probe = [target, other] if direction == "parametric" else [other, target]
            requests.append(DecodeRequest(prompt, method, probe, row.question))
    decoded = iter(decode_requests(lm, requests, max_new_tokens, max_rows=max_rows, on_progress=on_progress,
                                   stop_text=None if full_outputs else exact_match_decided(lm.tokenizer),
                                   engine=engine))
    results = []
    for i, row in enumerate(rows):
        for name in methods:
            text, probs = next(decoded)
            p_par, p_ctx = float(probs[0]), float(probs[1])
            if not row.other:
                p_par, p_ctx = (p_par, math.nan) if direction == "parametric" else (math.nan, p_ctx)
            correct = is_correct(text, row.answers)
            gives_other = bool(row.other) and is_correct(text, [row.other])
            results.append(ItemResult(
                domain=row.conflict_type, subject=str(i), conflict_type="all", method=name, output=text,
                correct=correct, follows_context=correct if direction == "contextual" else gives_other,
                p_parametric=p_par, p_context=p_ctx,
                follows_parametric=gives_other if direction == "contextual" else correct, item=str(i)))
    return results


def _accuracy(results: Sequence[ItemResult], direction: str) -> tuple[float, float, dict[str, float]]:
    """(mean accuracy over labels in percent, mean target probability, label -> accuracy %)."""
    labels = list(dict.fromkeys(r.domain for r in results))
    per = {g: 100.0 * sum(r.correct for r in results if r.domain == g) / sum(r.domain == g for r in results)
           for g in labels}
    p = [r.p_parametric if direction == "parametric" else r.p_context for r in results]
    return sum(per.values()) / len(per), sum(p) / len(p), per


# ---------------------------------------------------------------- tuning

ORIGINAL_LABEL = "original"
"""The label of Original's results in a tuning run (the degeneration guard's reference)."""


@dataclass(frozen=True)
class TunedSetting:
    """One method's chosen setting and the grid behind it.

    Attributes:
        beta_plus, beta_minus: the chosen betas (JuICE, JuNE); None for PH3.
        k, pruned: PH3's number of pruned heads and which (PH3 only).
        accuracy: mean accuracy over labels on the tuning rows, percent.
        grid: every setting tried: {"beta_plus", "beta_minus" | "k", "accuracy", "p_target",
            "degeneration" (percent of degenerate outputs), "eligible" (within the margin)}.
        degeneration: the chosen setting's percent of degenerate outputs.
        original_degeneration: Original's on the same rows; a setting is eligible while its
            share exceeds it by at most :data:`juice.tuned.DEGENERATION_MARGIN` points.
    """

    accuracy: float
    grid: list[dict[str, float]]
    beta_plus: float | None = None
    beta_minus: float | None = None
    k: int | None = None
    pruned: list[str] = field(default_factory=list)
    degeneration: float = 0.0
    original_degeneration: float = 0.0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"accuracy": round(self.accuracy, 4), "grid": self.grid,
                               "degeneration": round(self.degeneration, 4),
                               "original_degeneration": round(self.original_degeneration, 4),
                               "degeneration_margin": DEGENERATION_MARGIN}
        if self.k is None:
            out.update(beta_plus=self.beta_plus, beta_minus=self.beta_minus)
        else:
            out.update(k=self.k, pruned=self.pruned, scorer="knockout")
        return out


def tune(
    lm: LoadedModel, artifact: HeadsArtifact, data: str | Path | Sequence[ConflictRow], *,
    methods: Sequence[str] = TUNED_STEERINGS, beta_plus_grid: Sequence[float] = BETA_PLUS_GRID,
    beta_minus_grid: Sequence[float] = BETA_MINUS_GRID, ks: Sequence[int] = PRUNE_K, limit: int | None = None,
    max_rows: int | str = 64, progress: Progress = no_progress, engine: Engine | None = None,
) -> dict[str, TunedSetting]:
    """Choose (beta+, beta-) for JuICE and JuNE (and PH3's k, with "ph3" in `methods`) on your
    validation rows (paper App. D.1; module docstring), and record them in `artifact.tuned`
    with the data's provenance, so a heads file alone is enough to steer and serve.

    Beyond the paper: every grid point records its share of degenerate outputs
    (:mod:`juice.eval.degeneration`), and a setting whose share exceeds Original's on the same
    rows by more than :data:`~juice.tuned.DEGENERATION_MARGIN` percentage points is
    never chosen (where every setting does, the least degenerate ones compete).

    All settings decode in one batched run sharing each prompt's clean prefill. `limit`: use the
    first rows only. `engine` decodes and scores PH3's heads (:mod:`juice.engine.backend`; None:
    juice's own).

    Returns:
        method -> :class:`TunedSetting`.

    Raises:
        ValueError: an unknown method, PH3 without any row that has `other`, malformed data.
    """
    check_tune_methods(methods)
    direction = artifact.direction
    rows, where = _rows(data, direction, limit)
    settings = [GridSetting(m, float(bp), float(bm)) for m in methods if REGISTRY[m].tuned == "betas"
                for bp in beta_plus_grid for bm in beta_minus_grid]
    steerings: dict[str, Any] = {
        s.label: build(s.method, MethodInputs(lm, artifact.selection, beta_plus=s.beta_plus,
                                              beta_minus=s.beta_minus)).method.steering for s in settings}
    ph3_order: tuple = ()
    for pruning in (m for m in methods if REGISTRY[m].tuned == "k"):   # PH3: its k
        scores = ph3_knockout_scores(lm, rows, direction, max_rows=max_rows, progress=progress, engine=engine)
        for k in ks:
            settings.append(GridSetting(pruning, k=k))
            steerings[settings[-1].label] = build(pruning, MethodInputs(
                lm, pruned=heads_to_prune(scores, direction, k))).method.steering
        ph3_order = heads_to_prune(scores, direction, max(ks))
    steerings[ORIGINAL_LABEL] = ORIGINAL   # the degeneration guard's reference (decoded once with JuICE (0, 0))
    advance = progress(f"tuning: {len(steerings)} settings x {len(rows)} rows", len(steerings) * len(rows))
    results = evaluate_rows(lm, rows, steerings, direction=direction, max_rows=max_rows, on_progress=advance,
                            full_outputs=False, engine=engine)   # grid points keep verdicts and probabilities only

    def degeneration(label: str) -> float:
        mine = [r for r in results if r.method == label]
        return 100.0 * sum(r.degenerate for r in mine) / len(mine)

    original = degeneration(ORIGINAL_LABEL)
    out: dict[str, TunedSetting] = {}
    for m in methods:
        points = []
        for setting in settings:
            if setting.method == m:
                acc, p, _ = _accuracy([r for r in results if r.method == setting.label], direction)
                points.append((acc, p, setting, degeneration(setting.label)))
        eligible = [d <= original + DEGENERATION_MARGIN for *_, d in points]
        if not any(eligible):   # every setting breaks the text more: the least degenerate compete
            least = min(d for *_, d in points)
            eligible = [d == least for *_, d in points]
        # best accuracy, then target probability, then the first in grid order (max keeps the first)
        best_i = max((i for i in range(len(points)) if eligible[i]),
                     key=lambda i: (points[i][0], _finite(points[i][1]), -i))
        acc, _, best, degenerate = points[best_i]
        extra = lambda a, p, d, ok: {"accuracy": round(a, 4), "p_target": round(_finite(p), 6),   # noqa: E731
                                     "degeneration": round(d, 4), "eligible": ok}
        if REGISTRY[m].tuned == "k":
            grid = [{"k": s.k, **extra(a, p, d, ok)} for (a, p, s, d), ok in zip(points, eligible)]
            out[m] = TunedSetting(acc, grid, k=best.k, pruned=[str(h) for h in ph3_order[:best.k]],
                                  degeneration=degenerate, original_degeneration=original)
        else:
            grid = [{"beta_plus": s.beta_plus, "beta_minus": s.beta_minus, **extra(a, p, d, ok)}
                    for (a, p, s, d), ok in zip(points, eligible)]
            out[m] = TunedSetting(acc, grid, beta_plus=best.beta_plus, beta_minus=best.beta_minus,
                                  degeneration=degenerate, original_degeneration=original)
    tuned = artifact.tuned
    for m, s in out.items():
        tuned = tuned.with_record(m, s.to_json())
    artifact.tuned = tuned.with_provenance(where)
    return out


def check_tune_methods(methods: Sequence[str]) -> None:
    """Raise ValueError unless `methods` is a non-empty choice among the methods `juice tune`
    chooses settings for here (:func:`juice.methods.names` with `tune=True`: juice, june, ph3;
    `juice tune` also takes "auto", :func:`juice.when_to_steer.auto_tuning.tune_auto`, which this function does not)."""
    tunable = method_names(tune=True)
    unknown = [m for m in methods if m not in tunable]
    if unknown or not methods:
        raise ValueError(f"tune chooses settings for {', '.join(tunable)} (and auto), not {', '.join(unknown) or 'nothing'}")


def check_methods(names: Sequence[str], artifact: HeadsArtifact | None) -> None:
    """What :func:`evaluation_methods` refuses, checked without a model (so the CLI refuses bad
    input before loading one; :func:`juice.methods.check`).

    Raises:
        ValueError: no names, an unknown name, auto (contexts only), steering or PH3 without a
            heads file, PH3 untuned.
    """
    if not names:
        raise ValueError("no methods to evaluate")
    for raw in names:
        if not lookup(raw).rows:
            raise ValueError(f"{lookup(raw).name} is evaluated with --contexts (it needs each item's question "
                             "without its context)")
        check(raw, artifact.tuned if artifact else None, has_heads=artifact is not None)


def _finite(x: float) -> float:
    return -1.0 if math.isnan(x) else x


def ph3_knockout_scores(lm: LoadedModel, rows: Sequence[ConflictRow], direction: str, *, max_rows: int | str = 128,
                        progress: Progress = no_progress, engine: Engine | None = None) -> Ph3Scores:
    """PH3's head effects on your rows with `other` (knock-out scorer, :func:`juice.baselines.ph3.
    logit_difference_effects`): LD = logit(parametric) - logit(context) at the last position.

    Raises:
        ValueError: no row has `other`.
    """
    prompts = []
    for r in rows:
        if r.other:
            target = answer_first_token(lm.tokenizer, r.prompt, r.target)
            other = answer_first_token(lm.tokenizer, r.prompt, r.other)
            par, ctx = (target, other) if direction == "parametric" else (other, target)
            prompts.append(ConflictPrompt(r.prompt, par, ctx))
    if not prompts:
        raise ValueError("PH3 needs rows with `other` (the answer to suppress) to score heads")
    advance = progress(f"PH3: knock out each head on {len(prompts)} rows", len(prompts))
    return logit_difference_effects(lm, prompts, max_rows=max_rows, on_progress=advance, engine=engine)


# ---------------------------------------------------------------- evaluation


@dataclass
class RowsEvaluation:
    """`juice evaluate`'s result: every output and the table with intervals.

    Attributes:
        results: one per (row, method).
        table: accuracy intervals; columns are the rows' labels and "Average", group "all".
        degeneration: the share of degenerate outputs, laid out as `table`
            (:mod:`juice.eval.degeneration`).
        correct_not_degenerate: exact match on a non-degenerate output, laid out as `table`,
            with its paired differences (:func:`juice.eval.degeneration.correct_not_degenerate`).
        methods: the rows in order, by key (:class:`juice.methods.Row`: "original", "juice");
            settings: the betas / k each row used. :meth:`titled` names them by title, as the
            files and the terminal show them.
    """

    results: list[ItemResult]
    table: IntervalTable
    methods: list[str]
    settings: dict[str, Any]
    data: dict[str, Any]
    degeneration: IntervalTable | None = None
    correct_not_degenerate: IntervalTable | None = None

    def columns(self) -> list[tuple[str, str]]:
        labels = list(dict.fromkeys(r.domain for r in self.results))
        return [(c, "all") for c in [*labels, AVERAGE]]

    def titled(self) -> "RowsEvaluation":
        """The same evaluation with its rows named by title (:func:`juice.methods.row_title`)."""
        from juice.eval.runner import titled

        table = lambda t: None if t is None else t.titled()   # noqa: E731
        return RowsEvaluation(titled(self.results), self.table.titled(), [row_title(m) for m in self.methods],
                              {row_title(m): v for m, v in self.settings.items()}, self.data,
                              table(self.degeneration), table(self.correct_not_degenerate))

    def to_json(self) -> dict[str, Any]:
        """`evaluation.json`, rows by title."""
        from juice.eval.runner import results_to_json

        shown = self.titled()
        return {"data": shown.data, "methods": shown.methods, "settings": shown.settings,
                "table": shown.table.to_json(),
                "degeneration": shown.degeneration.to_json() if shown.degeneration else None,
                "correct_not_degenerate": (shown.correct_not_degenerate.to_json()
                                           if shown.correct_not_degenerate else None),
                "results": results_to_json(shown.results)}


def evaluation_methods(lm: LoadedModel, artifact: HeadsArtifact | None, names: Sequence[str], *,
                       beta_plus: float | None = None, beta_minus: float | None = None) -> tuple[dict[str, Method], dict]:
    """Row key -> :class:`Method` for `--methods` names (:data:`juice.methods.REGISTRY`), and
    the settings each uses (the heads file's tuned betas / PH3 k unless betas are given; the
    defaults for an untuned file, with an :class:`~juice.steering.UntunedBetasWarning`).

    Raises:
        ValueError: an unknown name; steering or PH3 without a heads file; PH3 not tuned.
    """
    check_methods(names, artifact)
    methods: dict[str, Method] = {}
    settings: dict[str, Any] = {}
    inputs = MethodInputs(lm, artifact.selection if artifact else None, artifact.tuned if artifact else {},
                          beta_plus, beta_minus)
    for raw in names:
        spec = lookup(raw)
        built = build(spec.name, inputs)
        methods[spec.name] = built.method
        if built.settings:
            settings[spec.name] = built.settings
    return methods, settings


def evaluate_file(
    lm: LoadedModel, artifact: HeadsArtifact | None, data: str | Path | Sequence[ConflictRow],
    methods: Sequence[str] = ("original", *TUNED_STEERINGS), *, direction: str | None = None,
    beta_plus: float | None = None, beta_minus: float | None = None, limit: int | None = None,
    max_rows: int | str = 64, resamples: int = 2000, seed: int = 0, progress: Progress = no_progress,
    engine: Engine | None = None,
) -> RowsEvaluation:
    """Evaluate `methods` (names in :data:`juice.methods.REGISTRY`) on every row of `data`, with 95%
    bootstrap intervals per label, the mean over labels, and paired differences (JuICE vs every
    method, every method vs Original) (:func:`juice.eval.tables.interval_table`). `limit`: the first
    rows only. `engine` decodes (:mod:`juice.engine.backend`; None: juice's own).

    Raises:
        ValueError: see :func:`evaluation_methods` and :func:`evaluate_rows`.
    """
    direction = parse_direction(direction or (artifact.direction if artifact else "parametric"))
    rows, where = _rows(data, direction, limit)
    table_methods, settings = evaluation_methods(lm, artifact, methods, beta_plus=beta_plus, beta_minus=beta_minus)
    advance = progress(f"evaluation: {len(table_methods)} methods x {len(rows)} rows", len(table_methods) * len(rows))
    results = evaluate_rows(lm, rows, table_methods, direction=direction, max_rows=max_rows, on_progress=advance,
                            engine=engine)
    names = list(table_methods)
    boot = dict(resamples=resamples, seed=seed)
    table = interval_table(results, names, **boot)
    degeneration = interval_table(results, names, value=lambda r: r.degenerate, **boot)
    usable = interval_table(results, names, value=correct_not_degenerate, **boot)
    return RowsEvaluation(results, table, names, settings, {**where, "direction": direction}, degeneration, usable)


__all__ = ["RowsEvaluation", "TunedSetting", "check_methods", "check_tune_methods", "evaluate_file", "evaluate_rows", "evaluation_methods",
           "identify", "instructed_prompt", "parse_direction", "ph3_knockout_scores", "tune"]
