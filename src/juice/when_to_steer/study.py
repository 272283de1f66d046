"""When to steer, the whole study in one call (`juice evaluate --contexts --study`): split a
source's questions in two (:func:`juice.data.context_types.split_of`), decode every method on
the **validation** half, choose the best static method and fit `auto` there, then decode every
method and the fitted `auto` on the **test** half, once, and compare them there with intervals
that resample whole questions (:func:`juice.when_to_steer.evaluation.question_bootstrap`).

    import juice
    from juice.when_to_steer.study import run_study
    lm = juice.load_model("gemma-3-270m")
    study = run_study(lm, juice.load_heads("heads_contextual.json", lm), "../shared/data/nqswap",
                      out="study-nqswap", validation_limit=300, test_limit=250)

What it reports beside each method (`study.md`, `validation/`, `test/`): the best static
method chosen on validation and every method's paired difference with it on test; `auto`'s
validation fit; the **oracle router** over auto's candidates (per request, the best candidate
chosen with hindsight: right where any candidate is right), the headroom a per-request choice
among them could reach; the minimum detectable paired difference of each table; the time each
half took.

Every method is **decoded once**: each static method and each of auto's candidates on both halves.
`auto` is not decoded: its output on a request is its chosen candidate's (the engine decodes a
:class:`juice.engine.Choice` exactly as the chosen candidate, tested), so its results are routed
offline (:func:`routed_results`) from the candidates' cached outputs and the first step's
signals (:func:`features_cached`); every policy, cross-validation fold and left-out source is then
scored in seconds. Decoding is cached per chunk of :data:`CHUNK` questions and method
(`out/cache/`, keyed by the model, the method's settings, the chunk's items and the source of the
code that decodes, :func:`decoding_code_key`; written atomically), so an interrupted study resumes
where it stopped, a new method decodes only itself, and a change to the decoding code decodes
again.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import time
from functools import lru_cache
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from juice.when_to_steer.auto import CANDIDATE, CANDIDATE_TABLE, candidate_betas, candidate_recipe
from juice.when_to_steer.signals import GATE_SIGNALS
from juice.data.context_types import ContextItem
from juice.eval.runner import ItemResult, results_from_json, results_to_json
from juice.io import settings_key, write_json_atomic
from juice.methods import REGISTRY, UNSTEERED, lookup, row_title
from juice.models import LoadedModel
from juice.progress import OnProgress, Progress, no_progress
from juice.recipe import Method
from juice.stage1 import HeadsArtifact, save_heads
from juice.when_to_steer.auto_tuning import (cross_validate, fit_outcomes, policy_picks, record_fit,
                                             request_features, validation_outcomes, verdict_table)
from juice.when_to_steer.outcomes import HALVES, Outcomes, half_to_json, outcomes_of
from juice.when_to_steer.evaluation import (MEAN, POWER_Z, QUESTION_ONLY, context_type_tables, evaluate_context_types,
                                            question_bootstrap, question_only_results, result_id)
from juice.when_to_steer.contexts import (SHORT, TITLES, ContextsEvaluation, best_static_method, chooses_per_request,
                                        context_items, context_methods, summarize)

CHUNK = 40
"""Questions per cached decoding chunk."""

ORACLE = "oracle"
"""The oracle router's name in the tables (not a method: an upper bound over auto's candidates)."""

CACHE_VERSION = "contexts/3"
"""Bumped when the cache's layout changes, so older caches are not read."""

DECODING_MODULES = ("juice.engine", "juice.baselines", "juice.eval.runner", "juice.eval.verdicts",
                    "juice.eval.degeneration", "juice.data.metrics", "juice.when_to_steer.evaluation", "juice.recipe",
                    "juice.steering", "juice.interventions", "juice.methods", "juice.models", "juice.architectures",
                    "juice.post_norm", "juice.tokens", "juice.text", "juice.readout")
"""The modules (a package: every module in it) whose source is part of a decoded chunk's cache
key (:func:`decoding_code_key`): the engine, the methods and how an output is scored."""

FEATURE_MODULES = ("juice.engine", "juice.baselines", "juice.when_to_steer.signals", "juice.models",
                   "juice.architectures", "juice.tokens", "juice.readout")
"""The modules whose source is part of the first-step signals' cache key (:func:`features_cached`)."""


@lru_cache(maxsize=None)
def decoding_code_key(modules: tuple[str, ...] = DECODING_MODULES) -> str:
    """The first 16 hex digits of the SHA-256 of the source of `modules` (a package: every `.py`
    file under it, by relative path): a cached chunk decoded by other code is not read.
    Deliberately broad (any change to the engine decodes every method again); the cost is a
    re-run, never a stale number."""
    digest = hashlib.sha256()
    for name in modules:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            raise ValueError(f"no module {name!r} to key the decoding cache on")
        origin = Path(spec.origin)
        files = sorted(origin.parent.rglob("*.py")) if spec.submodule_search_locations else [origin]
        for f in files:
            digest.update(f"{name}:{f.relative_to(origin.parent)}\n".encode())
            digest.update(f.read_bytes())
    return digest.hexdigest()[:16]


def decode_cached(lm: LoadedModel, items: Sequence[ContextItem], methods: Mapping[str, Method],
                  settings: Mapping[str, Any], cache: Path | None, *, max_rows: int | str = 64,
                  on_progress: OnProgress | None = None,
                  seconds: dict[str, float] | None = None, shard: tuple[int, int] = (0, 1)) -> list[ItemResult]:
    """:func:`juice.when_to_steer.evaluation.evaluate_context_types` in chunks of :data:`CHUNK` questions,
    each (chunk, method) cached in `cache` (None: no cache) with its share of the chunk's
    decoding time; the methods missing from a chunk's cache are decoded together (sharing the
    prefill).

    Args:
        seconds: if given, method -> decoding seconds it took, summed over the chunks, whether
            decoded now or read from the cache (where the cache recorded them: "unknown" chunks
            add nothing and are counted under "chunks without a time").
        shard: (k, n): only the chunks whose index is k modulo n, so n processes decode one half
            apart into one cache (the default: every chunk).

    Returns:
        the results in item order, per item in `methods` order (a shard's items only).
    """
    order: dict[tuple[str, str], int] = {}
    for item in items:
        order.setdefault((item.source, item.uid), len(order))
    questions = list(order)
    found: dict[tuple[int, str], ItemResult] = {}
    position = {id(item): k for k, item in enumerate(items)}
    model = lm.fingerprint()
    for c, at in enumerate(range(0, len(questions), CHUNK)):
        if c % shard[1] != shard[0]:
            continue
        wanted = set(questions[at:at + CHUNK])
        chunk = [i for i in items if (i.source, i.uid) in wanted]
        keys = {name: settings_key({"version": CACHE_VERSION, "model": model, "method": name,
                                    "code": decoding_code_key(),
                                    "settings": settings.get(name, {}),
                                    "items": [[i.source, i.uid, i.context_type, i.variant, i.prompt, i.question,
                                               list(i.memory_answers), list(i.context_answers)] for i in chunk]})
                for name in methods}
        missing = {}
        for name in methods:
            path = None if cache is None else cache / f"{keys[name]}.json"
            if path is not None and path.is_file():
                saved = json.loads(path.read_text(encoding="utf-8"))
                rows = results_from_json(saved["results"] if isinstance(saved, dict) else saved)
                if seconds is not None:
                    if isinstance(saved, dict):
                        seconds[name] = seconds.get(name, 0.0) + float(saved["seconds"])
                    else:
                        seconds["chunks without a time"] = seconds.get("chunks without a time", 0) + 1
                for item, r in zip(chunk, rows):
                    found[position[id(item)], name] = r
                if on_progress is not None:
                    on_progress(len(chunk))
            else:
                missing[name] = methods[name]
        if missing:
            t0 = time.perf_counter()
            decoded = evaluate_context_types(lm, chunk, missing, max_rows=max_rows, on_progress=on_progress)
            share = (time.perf_counter() - t0) / len(missing)
            per_method: dict[str, list[ItemResult]] = {name: [] for name in missing}
            for r in decoded:
                per_method[r.method].append(r)
            for name, rows in per_method.items():
                if seconds is not None:
                    seconds[name] = seconds.get(name, 0.0) + share
                if cache is not None:
                    write_json_atomic(cache / f"{keys[name]}.json",
                                      {"seconds": share, "results": results_to_json(rows)})
                for item, r in zip(chunk, rows):
                    found[position[id(item)], name] = r
    return [found[k, name] for k in range(len(items)) for name in methods if (k, name) in found]


Features = tuple[list[float], dict[str, list[float]], list[bool]]
"""Per item: the first-step JSD, gate signal name -> values, whether it has a passage
(:func:`juice.when_to_steer.auto_tuning.request_features`)."""


def features_cached(lm: LoadedModel, items: Sequence[ContextItem], cache: Path | None,
                    shard: tuple[int, int] = (0, 1)) -> Features:
    """:func:`juice.when_to_steer.auto_tuning.request_features` of `items`, in chunks of
    :data:`CHUNK` items cached in `cache` (keyed by the model, the chunk's prompts and questions
    and the source of :data:`FEATURE_MODULES`); None: no cache. `shard`: (k, n), only the chunks
    whose index is k modulo n (:func:`decode_cached`)."""
    signal: list[float] = []
    gates: dict[str, list[float]] = {}
    passage: list[bool] = []
    model = lm.fingerprint()
    for c, at in enumerate(range(0, len(items), CHUNK)):
        if c % shard[1] != shard[0]:
            continue
        chunk = items[at:at + CHUNK]
        key = settings_key({"version": CACHE_VERSION, "model": model, "features": decoding_code_key(FEATURE_MODULES),
                            "items": [[i.prompt, i.question] for i in chunk]})
        path = None if cache is None else cache / f"features-{key}.json"
        if path is not None and path.is_file():
            saved = json.loads(path.read_text(encoding="utf-8"))
        else:
            x, g, p = request_features(lm, chunk)
            saved = {"signal": x, "gates": g, "passage": p}
            if path is not None:
                write_json_atomic(path, saved)
        signal += [float(v) for v in saved["signal"]]
        passage += [bool(v) for v in saved["passage"]]
        for name, values in saved["gates"].items():
            gates.setdefault(name, []).extend(float(v) for v in values)
    return signal, gates, passage


def routed_results(items: Sequence[ContextItem], results: Sequence[ItemResult], picks: Sequence[str],
                   keys: Mapping[str, str], name: str) -> list[ItemResult]:
    """A router's results without decoding: per item, the result of the candidate it picks
    (`picks[k]`, a candidate name; `keys`: candidate -> its method's row key in `results`),
    renamed `name`. Exactly auto's, whose engine decodes the chosen candidate's tokens (module
    docstring; tested against a live decode).

    Raises:
        KeyError: a picked candidate without a result for its item.
    """
    by = {(r.domain, r.item, r.conflict_type, r.method): r for r in results}
    return [replace(by[item.source, result_id(item), item.context_type, keys[pick]], method=name)
            for item, pick in zip(items, picks)]


def oracle_results(items: Sequence[ContextItem], results: Sequence[ItemResult], candidates: Sequence[str]
                   ) -> list[ItemResult]:
    """Per item, the oracle router over `candidates` (row keys in `results`, Original's
    among them): right under each objective where any candidate is right; its output is the
    first right candidate's (for the degeneration columns), else the first candidate's. A
    request without a passage (its prompt is its question) is Original's, as `auto` decodes it
    by its structure: the oracle is the headroom of auto's choice, not of steering without a
    passage."""
    by = {(r.domain, r.item, r.conflict_type, r.method): r for r in results}
    out = []
    for item in items:
        names = [UNSTEERED] if item.prompt == item.question else candidates
        rows = [by[item.source, result_id(item), item.context_type, c] for c in names]
        best = next((r for r in rows if r.correct), rows[0])
        out.append(replace(best, method=ORACLE, correct=any(r.correct for r in rows),
                           follows_parametric=any(bool(r.follows_parametric) for r in rows)))
    return out


@dataclass
class Study:
    """A study's result (module docstring).

    Attributes:
        validation, test: the two halves' evaluations (:class:`juice.when_to_steer.ContextsEvaluation`);
            the test's `best_static` is chosen on validation.
        fit: `auto`'s validation fit (:class:`juice.when_to_steer.auto_tuning.AutoFit`), or None without auto.
        timings: seconds per stage.
        cross_validation: scheme -> `auto` against the best static method on held-out
            validation folds (:func:`juice.when_to_steer.auto_tuning.cross_validate`): both means, their paired
            difference with its question-resampled interval and standard error, and whether
            the gain exceeds two standard errors (`qualified`).
    """
    validation: Any
    test: Any
    fit: Any = None
    timings: dict[str, float] = field(default_factory=dict)
    cross_validation: dict[str, dict[str, Any]] = field(default_factory=dict)

    def headline(self) -> dict[str, Any]:
        """The study in one record (`juice reproduce`'s results and terminal): the best static
        method (chosen on validation), test means and paired differences of the mean over context
        types under "use relevant context" (percent, [low, high]), auto's cross-validation verdicts
        and the number of test questions; every method by its title (a record's part)."""
        boot, best = self.test.summary["use_relevant"], self.test.best_static
        auto = next((m for m in self.test.methods if chooses_per_request(m)), None)

        def pct(iv) -> list[float]:
            return [round(100 * iv.mean, 2), round(100 * iv.low, 2), round(100 * iv.high, 2)]

        out: dict[str, Any] = {"best_static": row_title(best), "questions": _questions(self.test),
                               "means": {row_title(m): pct(c[MEAN]) for m, c in boot.cells.items()}}
        for other in ([auto, ORACLE] if auto else [ORACLE]):
            for base in (best, UNSTEERED):
                key = f"{other} - {base}"
                if key in boot.differences:
                    out[row_title(key)] = pct(boot.differences[key][MEAN])
        out["cross_validation"] = {k: {"qualified": v["qualified"],
                                       "difference": [round(v[f], 2) for f in ("difference", "low", "high")]}
                                   for k, v in self.cross_validation.items()}
        return out

    def markdown(self) -> str:

        t, v = self.test, self.validation
        parts = [f"# When to steer, split by question: {t.data.get('source', '')}\n",
                 f"Validation: {v.data['counts']} items ({_questions(v)} questions); test: {t.data['counts']} items "
                 f"({_questions(t)} questions); no question in both. Best static method on validation "
                 f"(use relevant context): **{row_title(t.best_static)}**.\n"]
        if self.fit is not None:
            parts.append(f"auto's policy (fitted on validation): {self.fit.policy.describe()}. Validation mean "
                         f"{self.fit.mean:.1f}% against "
                         + ", ".join(f"{c} {x:.1f}%" for c, x in self.fit.static.items())
                         + ".\n")
        for label, c in self.cross_validation.items():
            parts.append(f"Cross-validation on validation ({label}): auto {c['auto']:.1f}%, best static "
                         f"(chosen per fold: {', '.join(sorted(set(c['chosen'])))}) "   # titles (_cv_summary)
                         f"{c['best_static']:.1f}%, "
                         f"difference {c['difference']:+.1f} [{c['low']:+.1f}, {c['high']:+.1f}] points, "
                         "standard error "
                         f"{c['standard_error']:.1f}: {'qualified' if c['qualified'] else 'not qualified'} "
                         "(needs more than two standard errors).\n")
        for name in t.summary:
            parts += [f"## Test: {TITLES[name]}, mean over context types, by question\n", t.summary_markdown(name)]
        parts.append("## Validation: " + TITLES["use_relevant"] + ", by question\n")
        parts.append(v.summary_markdown("use_relevant"))
        parts.append("Time (s, this machine): " + ", ".join(f"{k} {x:.0f}" for k, x in self.timings.items()) + "\n")
        return "\n".join(parts)


def _cv_summary(items: Sequence[ContextItem], held: Mapping[str, Any], resamples: int, seed: int) -> dict[str, Any]:
    """Held-out verdicts as results of two methods; their means and paired difference, by question."""

    rows = []
    for name in ("auto", "best_static"):
        for item, right in zip(items, held[name]):
            rows.append(ItemResult(domain=item.source, subject=item.uid, conflict_type=item.context_type, method=name,
                                   output="", correct=right, follows_context=False, p_parametric=0.0, p_context=0.0,
                                   item=result_id(item)))
    boot = question_bootstrap(rows, ["auto", "best_static"], [("auto", "best_static")], resamples=resamples, seed=seed)
    diff = boot.differences["auto - best_static"][MEAN]
    se = boot.detectable["auto - best_static"] / POWER_Z
    return {"auto": 100 * boot.cells["auto"][MEAN].mean, "best_static": 100 * boot.cells["best_static"][MEAN].mean,
            "difference": 100 * diff.mean, "low": 100 * diff.low, "high": 100 * diff.high, "standard_error": 100 * se,
            "qualified": bool(diff.mean > 2 * se), "chosen": [row_title(m) for m in held["chosen"]],
            "folds": held["folds"]}


def _questions(evaluation) -> int:
    return len({(r.domain, r.subject) for r in evaluation.results})


def run_study(lm: LoadedModel, artifact: HeadsArtifact, source: str | Path | None, *, out: str | Path,
              names: Sequence[str] | None = None,
              auto: bool = True,
              validation_limit: int | None = None, test_limit: int | None = None,
              keep: Callable[[ContextItem], bool] | None = None, domain: str | None = None, seed: int = 0,
              max_rows: int | str = 64, resamples: int = 2000, progress: Progress = no_progress,
              decode_only: bool = False, decode_halves: Sequence[str] = HALVES,
              decode_shard: tuple[int, int] = (0, 1)) -> Study | None:
    """The study (module docstring) on `source` (:func:`juice.when_to_steer.context_items`) with one
    heads file; writes `out/validation/`, `out/test/` (contexts.json, .md, .png), `out/study.md`,
    `out/study.json`, the heads file with `auto`'s policy (`out/heads_auto.json`) and, with `auto`,
    every decoded method's verdicts and the first steps' signals on both halves
    (`out/outcomes.json`, :class:`juice.when_to_steer.outcomes.Outcomes`), and each half's as
    soon as it is decoded (`out/outcomes-validation.json`, `out/outcomes-test.json`,
    :func:`juice.when_to_steer.outcomes.half_to_json`: what the decoding code, model and settings
    were, so halves decoded in separate runs are joined only when those agree).

    Args:
        names: the static methods (names in :data:`juice.methods.REGISTRY` but auto); None: every
            method the registry builds without a tuned k or policy (all but PH3 and auto), in table order.
        auto: fit `auto` on validation (its candidates are decoded there) and route it on test.
        validation_limit, test_limit: the first N questions of each source in each half.
        keep: a rule an item must meet (e.g. :func:`juice.when_to_steer.prompt_fits`).
        decode_only: decode every method on both halves into the cache (and the first steps'
            signals) and return None: the hours of a published-size study, run in resumable parts.
        decode_halves: with `decode_only`, the halves to decode (e.g. ("test",): the other's
            `outcomes-validation.json` came from an earlier run); `outcomes.json` is written only
            when both are decoded in this run.
        decode_shard: with `decode_only`, (k, n): decode only the chunks whose index is k modulo
            n into the cache and write no outcomes; n such runs side by side (one thread each)
            decode a half faster than one run on every core, and a run without a shard then
            writes the outcomes from the cache.

    Raises:
        ValueError: see :func:`juice.when_to_steer.context_items` and
            :func:`juice.when_to_steer.context_methods`; a half without items; `decode_halves`
            names no half, an unknown one, or not both without `decode_only`; `decode_shard` is
            not (k, n) with 0 <= k < n, or is a shard without `decode_only`.
    """
    _check_decode_options(decode_only, decode_halves, decode_shard)
    out = Path(out)
    halves = {}
    for split, limit in (("validation", validation_limit), ("test", test_limit)):
        items, where = context_items(source, domain=domain, limit=limit, keep=keep, split=split, seed=seed)
        if not items.items:
            raise ValueError(f"no {split} items")
        halves[split] = (items.items, where)
    plan = _study_methods(lm, artifact, names, auto)
    timings: dict[str, float] = {}
    results, features, decode_seconds = _decode_halves(lm, halves, plan, out, auto=auto, decode_halves=decode_halves,
                                                       decode_shard=decode_shard, max_rows=max_rows,
                                                       progress=progress, timings=timings)
    if decode_only:
        return None
    boot = dict(resamples=resamples, seed=seed)
    t0 = time.perf_counter()
    fit, cv = None, {}
    if auto:
        val_items, val_where = halves["validation"]
        fit, cv = _fit_auto(artifact, val_items, results["validation"], features["validation"], val_where,
                            plan.candidates, plan.static_names, plan.betas, out, **boot)
    validation = _validation_half(halves["validation"], results["validation"], plan, **boot)
    timings["validation"] += time.perf_counter() - t0
    t0 = time.perf_counter()
    test = _test_half(halves["test"], results["test"], features.get("test"), plan, fit, validation, **boot)
    timings["test"] += time.perf_counter() - t0
    for half, spent in decode_seconds.items():   # decoding, whether now or when the cache was written
        timings[f"{half} decoding (all chunks)"] = sum(v for k, v in spent.items() if k != "chunks without a time")
        if spent.get("chunks without a time"):
            timings[f"{half} chunks without a time"] = spent["chunks without a time"]
    study = Study(validation, test, fit, timings, cv)
    _write_study(study, out)
    return study


def _check_decode_options(decode_only: bool, decode_halves: Sequence[str], decode_shard: tuple[int, int]) -> None:
    """:func:`run_study`'s decoding options, refused before anything loads.

    Raises:
        ValueError: as :func:`run_study` says.
    """
    k, n = decode_shard
    if not 0 <= k < n:
        raise ValueError(f"decode_shard: {decode_shard} is not (k, n) with 0 <= k < n")
    if n > 1 and not decode_only:
        raise ValueError(f"decode_shard: {decode_shard} decodes into the cache only, with --decode-only")
    unknown = sorted(set(decode_halves) - set(HALVES))
    if unknown or not decode_halves or (not decode_only and set(decode_halves) != set(HALVES)):
        raise ValueError(f"decode_halves: {list(decode_halves)} is not a non-empty subset of {list(HALVES)}"
                         + ("" if decode_only else " holding both (only --decode-only decodes one half)"))


@dataclass
class _StudyMethods:
    """What a study decodes: the static methods (row key -> recipe), auto's candidates that are not
    among them, every decoded method's settings, auto's candidates by name (candidate -> row key),
    the static rows with the question alone, auto's candidates' betas and the heads' direction
    suffix ("ctx", "mem")."""

    static: dict[str, Method]
    extra: dict[str, Method]
    settings: dict[str, Any]
    candidates: dict[str, str]
    static_names: list[str]
    betas: dict[str, tuple[float, float]]
    suffix: str

    @property
    def decoded(self) -> dict[str, Method]:
        return {**self.static, **self.extra}


def _study_methods(lm: LoadedModel, artifact: HeadsArtifact, names: Sequence[str] | None, auto: bool
                   ) -> _StudyMethods:
    """The methods :func:`run_study` decodes (its `names`, and with `auto` its candidates)."""
    if names is None:
        names = [n for n, spec in REGISTRY.items() if spec.tuned in (None, "betas")]
    static, settings = context_methods(lm, [artifact], [n for n in names if lookup(n).tuned != "policy"])   # not auto
    settings = {**settings, QUESTION_ONLY: {"from": "Original's output on the question alone (the none item)"}}
    suffix = SHORT[str(artifact.direction)]
    keys = {c.name: c.key(suffix) for c in CANDIDATE_TABLE}
    betas = candidate_betas(artifact.tuned)
    extra: dict[str, Method] = {}
    if auto:   # auto's candidates that are not static methods of the table
        for c in CANDIDATE_TABLE:
            if c.method is not None and keys[c.name] not in static and (not c.steered or c.name in betas):
                extra[keys[c.name]] = auto_candidate(lm, artifact, c.name, betas)
                settings = {**settings, keys[c.name]: {"candidate": c.name, "betas": betas.get(c.name)}}
    candidates = {c: k for c, k in keys.items() if k in static or k in extra or c == "question"}
    return _StudyMethods(static, extra, settings, candidates, [*static, QUESTION_ONLY], betas, suffix)


def _decode_halves(lm: LoadedModel, halves: Mapping[str, tuple[list[ContextItem], dict]], plan: _StudyMethods,
                   out: Path, *, auto: bool, decode_halves: Sequence[str], decode_shard: tuple[int, int],
                   max_rows: int | str, progress: Progress, timings: dict[str, float]
                   ) -> tuple[dict[str, list[ItemResult]], dict[str, Features], dict[str, dict[str, float]]]:
    """Every method of `plan` decoded once on each half of `decode_halves` (through the cache
    `out/cache`), with the question alone's rows and, with `auto`, the first steps' signals; each
    half's outcomes written as it is done, both halves' when both are (`auto` is routed later, not
    decoded). A shard (`decode_shard` (k, n), n > 1) only fills the cache.

    Returns:
        half -> results, half -> signals (with `auto`), half -> decoding seconds per chunk.
    """
    decoded, cache, n = plan.decoded, out / "cache", decode_shard[1]
    results: dict[str, list[ItemResult]] = {}
    features: dict[str, Features] = {}
    decode_seconds: dict[str, dict[str, float]] = {"validation": {}, "test": {}}
    half_outcomes: dict[str, Outcomes] = {}
    decoding = {"code": decoding_code_key(), "features": decoding_code_key(FEATURE_MODULES),
                "model": settings_key(lm.fingerprint()), "settings": settings_key(plan.settings)}
    for split, (items, _) in halves.items():
        if split not in decode_halves:
            continue
        t0 = time.perf_counter()
        advance = progress(f"{split}: {len(decoded)} methods x {len(items)} items", len(decoded) * len(items))
        results[split] = decode_cached(lm, items, decoded, plan.settings, cache, max_rows=max_rows,
                                       on_progress=advance, seconds=decode_seconds[split], shard=decode_shard)
        if n > 1:   # a shard: into the cache only
            if auto:
                features_cached(lm, items, cache, shard=decode_shard)
            continue
        results[split] += question_only_results(items, results[split])
        if auto:
            features[split] = features_cached(lm, items, cache)
            half_outcomes[split] = outcomes_of(items, results[split], [*decoded, QUESTION_ONLY], features[split],
                                               split, candidates=plan.candidates, static=plan.static_names,
                                               betas=plan.betas)
            write_json_atomic(out / f"outcomes-{split}.json", half_to_json(half_outcomes[split], decoding))
        timings[split] = time.perf_counter() - t0
    if auto and len(half_outcomes) == len(HALVES):   # every analysis, without the model (outcomes.py)
        write_json_atomic(out / "outcomes.json", Outcomes.concatenate(list(half_outcomes.values())).to_json())
    return results, features, decode_seconds


def _validation_half(half: tuple[list[ContextItem], dict], results: list[ItemResult], plan: _StudyMethods, *,
                     resamples: int, seed: int):
    """The validation half's evaluation with the oracle's rows, its best static method and its
    summary (:class:`juice.when_to_steer.ContextsEvaluation`); extends `results` with the oracle's."""
    items, where = half
    results += oracle_results(items, results, list(plan.candidates.values()))
    keys = [*plan.static_names, *plan.extra, ORACLE]
    validation = ContextsEvaluation(
        results, context_type_tables(results, keys, resamples=resamples, seed=seed), keys,
        plan.settings, {**where, "best_static_from": "this validation run"})
    best = best_static_method({"means": validation.means(), "methods": plan.static_names}, among=plan.static_names)
    validation.best_static = best
    validation.summary = summarize(results, keys, best, resamples=resamples, seed=seed)
    return validation


def _test_half(half: tuple[list[ContextItem], dict], results: list[ItemResult], features: Features | None,
               plan: _StudyMethods, fit, validation, *, resamples: int, seed: int):
    """The test half's evaluation: the static methods, `auto` routed by `fit`'s policy (when
    fitted) and the oracle, against the best static method chosen on `validation`."""
    items, where = half
    settings = dict(plan.settings)
    routed = []
    if fit is not None:
        name = f"auto-{plan.suffix}"
        settings[name] = fit.policy.to_json()
        signal, gates, passage = features
        picks = policy_picks(fit.policy, signal, passage, gates)
        results += routed_results(items, results, picks, plan.candidates, name)
        routed = [name]
    results += oracle_results(items, results, list(plan.candidates.values()))
    keys = [*plan.static_names, *routed, ORACLE]
    kept = [r for r in results if r.method in keys]
    where = {**where, "best_static_from": f"validation split of {validation.data.get('source')}"}
    best = validation.best_static
    return ContextsEvaluation(
        kept, context_type_tables(kept, keys, focus=routed[0] if routed else UNSTEERED, resamples=resamples,
                                  seed=seed),
        keys, settings, where, summarize(kept, keys, best, resamples=resamples, seed=seed), best)


def _fit_auto(artifact: HeadsArtifact, items: Sequence[ContextItem], results: Sequence[ItemResult],
              features: Features, where: Mapping[str, Any], candidates: Mapping[str, str],
              static_names: Sequence[str], betas: Mapping[str, tuple[float, float]], out: Path, resamples: int,
              seed: int) -> tuple[Any, dict[str, dict[str, float]]]:
    """auto fitted on the validation half's decoded candidates, written into the heads file
    (`out/heads_auto.json`), and its cross-validated gain over the best static method, 5-fold by
    question and, with several sources, leaving one source out: with every gate signal tried (as
    the fit), with each alone, and with none."""

    o = validation_outcomes(None, items, results, candidates, features)
    fit = fit_outcomes(o, betas)
    record_fit(artifact, fit, where)
    save_heads(artifact, out / "heads_auto.json")
    every_static, _ = verdict_table(items, results, {m: m for m in static_names})
    schemes = {"5-fold, grouped by question": ([(i.source, i.uid) for i in items], 5, o.gates)}
    if len(set(o.sources)) > 1:
        schemes["leave one source out"] = (o.sources, 0, o.gates)
        for name in GATE_SIGNALS:   # does each gate signal transfer to a source the fit has not seen?
            schemes[f"leave one source out, gate on {name} only"] = (o.sources, 0, {name: o.gates[name]})
        schemes["leave one source out, no gate"] = (o.sources, 0, None)
    cv = {}
    for label, (groups, folds, tried) in schemes.items():
        held = cross_validate(o.verdicts, every_static, o.signal, o.types, o.sources, groups, betas, passage=o.passage,
                              degenerate=o.degenerate, relevance=tried, folds=folds, seed=seed)
        cv[label] = _cv_summary(items, held, resamples, seed)
    return fit, cv


def _write_study(study: Study, out: Path) -> None:
    """`out/{validation,test}/contexts.{json,md,png}`, `out/study.json` and `out/study.md`."""
    from juice.plots import have_matplotlib

    validation, test, fit = study.validation, study.test, study.fit
    for name, evaluation in (("validation", validation), ("test", test)):
        write_json_atomic(out / name / "contexts.json", evaluation.to_json())
        (out / name / "contexts.md").write_text(evaluation.markdown(), encoding="utf-8")
        if have_matplotlib():
            evaluation.figure(out / name / "contexts.png")
    write_json_atomic(out / "study.json", {"best_static": row_title(test.best_static), "timings_s": study.timings,
                                           "cross_validation": study.cross_validation,
                                           "auto": None if fit is None else {**fit.policy.to_json(), **fit.to_json()},
                                           "validation": {k: v.titled().to_json() for k, v in validation.summary.items()},
                                           "test": {k: v.titled().to_json() for k, v in test.summary.items()}})
    (out / "study.md").write_text(study.markdown(), encoding="utf-8")


def auto_candidate(lm: LoadedModel, artifact: HeadsArtifact, candidate: str, betas: Mapping[str, tuple[float, float]]
                   ) -> Method:
    """The evaluation method of one of auto's candidates (:data:`juice.when_to_steer.auto.CANDIDATES`), built by
    the registry at the candidate's betas (`betas`, :func:`juice.when_to_steer.auto.candidate_betas`), as
    auto decodes it (:func:`juice.when_to_steer.auto.candidate_recipe`).

    Raises:
        ValueError: the question alone (no method of its own: Original's output on the none item).
    """
    recipe = candidate_recipe(CANDIDATE[candidate], lm, artifact.selection, betas)
    if recipe is None:
        raise ValueError("the question alone is Original's output on the none item, not a method to decode")
    return recipe


__all__ = ["CHUNK", "DECODING_MODULES", "FEATURE_MODULES", "Features", "ORACLE", "Study", "auto_candidate",
           "decode_cached", "decoding_code_key", "features_cached", "oracle_results",
           "routed_results", "run_study"]
