"""When to steer, end to end (`juice evaluate --contexts`): the same questions with a gold, a
conflicting, an irrelevant, a distracting and no context (:mod:`juice.data.context_types`), every
method (both steering directions where both heads files are given), both objectives, with n,
intervals and paired differences, saved as JSON, Markdown and a figure.

    import juice
    from juice.when_to_steer import context_items, evaluate_contexts
    lm = juice.load_model("gemma-3-270m")
    items, where = context_items("../shared/data/nqswap", limit=40)
    report = evaluate_contexts(lm, [juice.load_heads("heads_contextual.json", lm)], items,
                               ["original", "prompt", "cad", "juice", "june"])

Sources (:func:`context_items`): an NQ-Swap JSONL file or a folder holding `nqswap.jsonl`; your
own JSONL or CSV rows with `question`, `context`, `answer` and optionally `context_answer`
(:func:`juice.data.context_types.user_context_items`); a ParaConflict JSON file (the authors'
item lists); a folder of the authors' domains (each domain's `unfiltered_test.json`); or, with
no source, juice's built-in domains. `limit` keeps the
first N underlying items of each source (each with its context types).

Methods: `original`, `prompt` (both instructions: "Prompt-mem" ignores the context,
"Prompt-ctx" follows it), `cad`, `adacad`, `ckplug` (CK-PLUG's adaptive mode, Bi et al. 2026,
:mod:`juice.baselines.ckplug`), and per heads file `juice`, `june`, `ph3` (named with
the file's direction: rows "juice-ctx", "june-mem", "ph3-ctx", ..., titled "JuICE-ctx", ...),
each with the file's tuned settings: the betas the paper's protocol tunes on conflicting
validation items, so the table shows what that tuning costs on gold, irrelevant and missing
context; and `auto` ("auto-ctx",
:mod:`juice.when_to_steer.auto`), the per-request choice tuned on validation items of every context type
(`juice tune --methods auto`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from juice.data.context_types import (CONTEXT_TYPES, RELATED_DOMAINS, SPLITS, ContextItem, ContextItems,
                                      nqswap_context_items, paraconflict_context_items, user_context_items)
from juice.engine.backend import Engine
from juice.when_to_steer.evaluation import (MEAN, TABLES, QuestionBootstrap, context_type_means, context_type_tables,
                                            evaluate_context_types, question_bootstrap)
from juice.eval.runner import ItemResult, results_to_json
from juice.recipe import Method
from juice.eval.tables import AVERAGE, IntervalTable
from juice.io import read_jsonl
from juice.models import LoadedModel
from juice.progress import Progress, no_progress
from juice.stage1 import HeadsArtifact
from juice.methods import (FOCUS, REGISTRY, SHORT, UNSTEERED, MethodInputs, Row, build, check, lookup, row_key, row_of,
                           row_title)

SUMMARIZED = ("use_relevant", "trust_memory", "use_relevant_not_degenerate")
"""The objectives whose mean over context types gets question-resampled paired intervals."""

TITLES = {"use_relevant": "use relevant context", "trust_memory": "trust memory",
          "follows_context": "answers that follow the passage",
          "use_relevant_not_degenerate": "use relevant context, and not degenerate",
          "degenerate": "degenerate outputs (juice's measure; lower is better)"}


def _read_rows(path: Path) -> list[dict]:
    """The rows of a JSONL or CSV file (one line each; CSV answers may list forms as `a|b`).

    Raises:
        ValueError: a line that is not JSON (the message names it).
    """
    import csv

    if path.suffix == ".csv":
        with path.open(encoding="utf-8", newline="") as f:
            rows = list(csv.DictReader(f))
        for row in rows:
            for key in ("answer", "context_answer"):
                if isinstance(row.get(key), str) and "|" in row[key]:
                    row[key] = [a for a in row[key].split("|") if a.strip()]
        return rows
    return read_jsonl(path)


def _is_nqswap(path: Path) -> bool:
    """Whether a JSONL file's first row has NQ-Swap's fields (else: your own rows)."""
    if path.suffix != ".jsonl":
        return False
    first = next((line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()), "")
    try:
        row = json.loads(first)
    except json.JSONDecodeError:
        return True   # NQ-Swap's reader names the bad line
    return not isinstance(row, dict) or "org_context" in row or "context" not in row


def context_items(source: str | Path | None = None, *, domain: str | None = None, limit: int | None = None,
                  contexts: Sequence[str] = CONTEXT_TYPES, seed: int = 0,
                  keep: Callable[[ContextItem], bool] | None = None,
                  split: str | None = None) -> tuple[ContextItems, dict[str, Any]]:
    """The items of `source` (module docstring) under `contexts`, and where they came from.

    Args:
        domain: with no source or an authors' folder, only this domain.
        limit: the first N underlying items (distinct questions) of each source (domain, or
            NQ-Swap) in the split; every row of the source still lends its passage to the
            irrelevant items.
        split: "validation" or "test": only the questions of that half
            (:func:`juice.data.context_types.split_of` with `seed`, by question, so the two
            never share one; irrelevant passages come from the same half); None: every question.
        contexts: the context types kept (:data:`juice.data.context_types.CONTEXT_TYPES`).
        keep: an underlying item is kept only if every one of its prompts satisfies it (before
            `limit` picks the first N; e.g. :func:`prompt_fits`); the number dropped is
            `where["dropped"]`.

    Raises:
        ValueError: an unknown context type or domain; a file that is neither NQ-Swap nor
            ParaConflict; a malformed row (the loaders' one-line errors).
        FileNotFoundError: no such file or folder.
    """
    unknown = [c for c in contexts if c not in CONTEXT_TYPES]
    if unknown or not contexts:
        raise ValueError(f"--contexts takes {', '.join(CONTEXT_TYPES)}, not {', '.join(unknown) or 'nothing'}")
    if split is not None and split not in SPLITS:   # before any file is read
        raise ValueError(f"--split takes {' or '.join(SPLITS)}, not {split!r}")
    from juice.data.nqswap import read_records
    from juice.data.paraconflict import build_domain, load_paraconflict_json
    from juice.data.splits import find_paper_domains

    cut = list   # every item lends its passage; `limit` keeps the first N per source afterwards
    where: dict[str, Any] = {"seed": seed, "limit": limit, "split": split}
    if source is None:
        from juice.data.paraconflict import DOMAINS

        names = [domain] if domain else list(DOMAINS)
        examples = [ex for name in names for ex in cut(build_domain(name))]
        related = [ex for name in {RELATED_DOMAINS.get(n) for n in names} - set(names) - {None}
                   for ex in build_domain(name)]
        built = paraconflict_context_items(examples, seed, split, related)
        where["source"] = f"built-in {', '.join(names)}"
    else:
        path = Path(source)
        if not path.exists():
            raise FileNotFoundError(f"no such file or folder: {path}")
        if path.suffix in (".jsonl", ".csv") and not _is_nqswap(path):   # your own rows: context, question, answer
            built, where["source"] = user_context_items(_read_rows(path), seed, path.stem, split), f"rows {path}"
        elif (path.is_dir() and (path / "nqswap.jsonl").is_file()) or path.suffix == ".jsonl":
            built, where["source"] = nqswap_context_items(cut(read_records(path)), seed, split), f"NQ-Swap {path}"
        elif path.is_dir():
            every = find_paper_domains(path)
            found = {k: v for k, v in every.items() if k == domain} if domain else every
            if not found:
                raise ValueError(f"{path}: no NQ-Swap file and no domain folder of the authors' layout"
                                 f"{f' named {domain}' if domain else ''}")
            examples = [ex for name, folder in found.items()
                        for ex in cut(load_paraconflict_json(folder / "unfiltered_test.json", name))]
            related = [ex for name, folder in every.items()
                       if name not in found and name in {RELATED_DOMAINS.get(n) for n in found}
                       for ex in load_paraconflict_json(folder / "unfiltered_test.json", name)]
            built = paraconflict_context_items(examples, seed, split, related)
            where["source"] = f"ParaConflict {path}"
        else:
            built = paraconflict_context_items(cut(load_paraconflict_json(path, domain)), seed, split)
            where["source"] = f"ParaConflict {path}"
    refused = {(i.source, i.uid) for i in built.items if keep is not None and i.context_type in contexts
               and not keep(i)}
    first: dict[str, list[str]] = {}
    for item in built.items:   # the first `limit` underlying items of each source
        uids = first.setdefault(item.source, [])
        if item.uid not in uids and (item.source, item.uid) not in refused and (not limit or len(uids) < limit):
            uids.append(item.uid)
    chosen = {(src, uid) for src, uids in first.items() for uid in uids}
    kept = ContextItems([i for i in built.items if i.context_type in contexts and (i.source, i.uid) in chosen],
                        {t: [u for u in v if any((src, u) in chosen for src in first)]
                         for t, v in built.skipped.items() if t in contexts})
    where["counts"] = kept.counts()
    where["skipped"] = {t: len(v) for t, v in kept.skipped.items()}
    if keep is not None:
        where["dropped"] = len(refused)
    return kept, where


def prompt_fits(tokenizer, max_tokens: int) -> Callable[[ContextItem], bool]:
    """A `keep` rule for :func:`context_items`: the item's prompt holds at most `max_tokens`
    tokens (NQ-Swap passages that are whole tables run to 1,000+ tokens; Prompt's instruction
    adds about 40 more, not counted).

    Raises:
        ValueError: `max_tokens` < 1.
    """
    if max_tokens < 1:
        raise ValueError(f"max_prompt_tokens must be at least 1, got {max_tokens}")
    from juice.tokens import token_ids

    return lambda item: len(token_ids(tokenizer, item.prompt)) <= max_tokens


def context_methods(lm: LoadedModel, artifacts: Sequence[HeadsArtifact], names: Sequence[str]
                    ) -> tuple[dict[str, Method], dict[str, Any]]:
    """Row key (:class:`juice.methods.Row`) -> :class:`~juice.recipe.Method` for `names` (any of
    :data:`juice.methods.REGISTRY`), and the settings each uses (by row key). A heads method runs
    once per heads file, its row's variant the file's direction ("juice-ctx", titled "JuICE-ctx");
    the Prompt baseline once per instruction ("prompt-mem", "prompt-ctx"); auto from the file that
    holds its policy ("auto-ctx").

    Raises:
        ValueError: an unknown name; juice, june, ph3 or auto without a heads file; PH3 or auto
            not tuned in a file; two heads files of one direction.
    """
    directions = [str(a.direction) for a in artifacts]
    if len(set(directions)) < len(directions):
        raise ValueError("give at most one heads file per direction")
    methods: dict[str, Method] = {}
    settings: dict[str, Any] = {}
    for raw in names:
        spec = lookup(raw)
        if spec.per_instruction:
            for instruction, suffix in SHORT.items():
                built = build(spec.name, MethodInputs(lm, instruction=instruction))
                methods[Row(spec.name, suffix).key] = built.method
            continue
        if not spec.heads:
            built = build(spec.name, MethodInputs(lm))
            methods[spec.name] = built.method
            if built.settings:
                settings[spec.name] = built.settings
            continue
        if not artifacts:
            raise ValueError(f"{spec.name} needs a heads file (--heads)")
        for artifact in artifacts:
            if spec.tuned == "policy" and not artifact.tuned.holds(spec.name) and any(
                    a.tuned.holds(spec.name) for a in artifacts):
                continue   # the other direction's file holds the policy
            check(spec.name, artifact.tuned, has_heads=True, where=f" in the {artifact.direction} heads file")
            key = Row(spec.name, SHORT[str(artifact.direction)]).key
            built = build(spec.name, MethodInputs(lm, artifact.selection, artifact.tuned))
            methods[key], settings[key] = built.method, built.settings
    return methods, settings


@dataclass
class ContextsEvaluation:
    """`juice evaluate --contexts`'s result.

    Attributes:
        results: one per (item, method) (:func:`juice.when_to_steer.evaluation.evaluate_context_types`).
        tables: "use_relevant", "trust_memory", "follows_context" -> interval table (columns:
            sources and "Average"; groups: context types).
        methods: row keys (:class:`juice.methods.Row`; "Question-only" and the study's "oracle"
            beside them) in order; settings: the betas / k / alpha each used. Everything is keyed
            by row key; :meth:`to_json`, :meth:`markdown` and :meth:`figure` show titles.
        data: the source, counts, skips, seed, limit, split.
        summary: objective (:data:`SUMMARIZED`) -> per method, each context type and the mean
            over them with intervals that resample whole questions, and paired differences
            against Original and against `best_static` (:func:`juice.when_to_steer.evaluation.question_bootstrap`).
        best_static: the best static method's key (not `auto`) on the **validation** run it was
            chosen from (:func:`best_static_method`), or None where none was given.
    """

    results: list[ItemResult]
    tables: dict[str, IntervalTable]
    methods: list[str]
    settings: dict[str, Any]
    data: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, QuestionBootstrap] = field(default_factory=dict)
    best_static: str | None = None

    def columns(self) -> list[tuple[str, str]]:
        """(Average, context type) for every context type evaluated."""
        present = {r.conflict_type for r in self.results}
        return [(AVERAGE, t) for t in CONTEXT_TYPES if t in present]

    def means(self) -> dict[str, dict[str, dict[str, float]]]:
        """table -> method -> context type (and "mean") -> percent."""
        return {name: context_type_means(t) for name, t in self.tables.items()}

    def to_json(self) -> dict[str, Any]:
        """`contexts.json`: every method by its title (read back by :func:`best_static_method`)."""
        return {"data": self.data, "methods": [row_title(m) for m in self.methods],
                "settings": {row_title(m): s for m, s in self.settings.items()},
                "tables": {k: t.titled().to_json() for k, t in self.tables.items()},
                "means": {k: {row_title(m): row for m, row in means.items()} for k, means in self.means().items()},
                "summary": {k: v.titled().to_json() for k, v in self.summary.items()},
                "best_static": None if self.best_static is None else row_title(self.best_static),
                "results": results_to_json([replace(r, method=row_title(r.method)) for r in self.results])}

    def summary_markdown(self, objective: str = "use_relevant") -> str:
        """The per-question table of `objective` (:func:`summary_table`)."""
        return summary_table(self.summary[objective], self.methods, self.best_static,
                             self.data.get("best_static_from", "given"))

    def markdown(self) -> str:
        """The report: one table per objective and the follow rate, n per cell, paired differences."""
        from juice.eval.report import difference_markdown, interval_markdown

        columns = self.columns()
        parts = [f"# When to steer: {self.data.get('source', '')}\n",
                 f"Items: {self.data.get('counts')}; skipped: {self.data.get('skipped')}; split: "
                 f"{self.data.get('split') or 'all questions'}.\n"]
        for name in self.summary:
            parts += [f"## {TITLES[name]}: mean over context types, by question\n",
                      "Cells: %, [95% interval]; whole questions resampled within each source (2,000 "
                      "resamples), the same draws for every method (paired).\n", self.summary_markdown(name)]
        parts.append("# Per item\n\nCells: % (95% bootstrap interval half-width over prompts), averaged over "
                     "sources; bold: interval wholly above the runner-up's.\n")
        shown = [row_title(m) for m in self.methods]
        for name, table in self.tables.items():
            cols = [(c, g) for c, g in columns if name != "follows_context" or g != "none"]
            heads = [g for _, g in cols]
            titled = table.titled()
            parts += [f"## {TITLES[name]}\n", interval_markdown(titled, shown, cols, heads,
                                                                 bold=name not in ("follows_context", "degenerate")),
                      "\nPaired differences, percentage points [95% interval]:\n",
                      difference_markdown(titled, cols, heads)]
        parts.append("\n## Settings\n\n" + "\n".join(f"- {row_title(m)}: {json.dumps(s)}"
                                                       for m, s in self.settings.items()))
        return "\n".join(parts) + "\n"

    def figure(self, path: str | Path) -> Path:
        """Accuracy under "use relevant context" per context type, one group per method, 95%
        intervals as error bars (needs matplotlib)."""
        from juice.plots import interval_bar_chart

        cells = {row_title(m): dict(self.tables["use_relevant"].cells[m][AVERAGE]) for m in self.methods}
        title = f"use relevant context by context type ({self.data.get('source')})"
        return interval_bar_chart(cells, path, title=title)


def summary_table(boot, methods: Sequence[str], best_static: str | None, best_static_from: str = "given") -> str:
    """Two per-question tables (Markdown) of one objective's summary (a :class:`juice.when_to_steer.evaluation.
    QuestionBootstrap`), each narrow enough for a page: first the headline, each method's mean over
    the context types (%, 95% interval) and its paired differences against Original and
    `best_static`; then the mean per context type; n distinct questions in both, and the minimum
    detectable difference (a study's tables; a committed record's in docs/when-to-steer.md).
    `boot`, `methods` and `best_static` name methods by row key or by title (a record's); the
    tables show titles."""
    types = [k for k in next(iter(boot.cells.values())) if k != MEAN]
    original = next((m for m in methods if row_key(m) == UNSTEERED), UNSTEERED)
    against = [original] + ([best_static] if best_static and best_static != original else [])

    def pct(iv) -> str:
        return "-" if math.isnan(iv.mean) else f"{100 * iv.mean:.1f} [{100 * iv.low:.1f}, {100 * iv.high:.1f}]"

    def diff(iv) -> str:
        return "-" if math.isnan(iv.mean) else f"{100 * iv.mean:+.1f} [{100 * iv.low:+.1f}, {100 * iv.high:+.1f}]"

    def table(head: list[str], rows: list[list[str]]) -> list[str]:
        return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(r) + " |" for r in rows)]

    shown = [m for m in methods if m in boot.cells]
    any_cell = next(iter(boot.cells.values()))
    headline = [[row_title(m), pct(boot.cells[m][MEAN]),
                 *[diff(boot.differences[f"{m} - {b}"][MEAN]) if f"{m} - {b}" in boot.differences else ""
                   for b in against]] for m in shown]
    headline.append(["n (questions)", str(any_cell[MEAN].n), *[""] * len(against)])
    per_type = [[row_title(m), *[pct(boot.cells[m][t]) for t in types]] for m in shown]
    per_type.append(["n (questions)", *[str(any_cell[t].n) for t in types]])
    lines = table(["Method", "mean over the types", *[f"- {row_title(b)}" for b in against]], headline)
    lines += ["", "Per context type:", ""] + table(["Method", *types], per_type)
    detect = [v for v in boot.detectable.values() if not math.isnan(v)]
    if detect:
        lines.append(f"\nMinimum detectable paired difference of the mean (80% power, two-sided 5%, from the "
                     f"observed spread): {100 * min(detect):.1f} to {100 * max(detect):.1f} points "
                     f"(median {100 * float(sorted(detect)[len(detect) // 2]):.1f}).")
    lines.append("Best static method: " + (f"{row_title(best_static)} (chosen on validation: "
                                           f"{best_static_from})" if best_static
                                           else "not given (pass a validation run's contexts.json)") + ".")
    return "\n".join(lines) + "\n"


def best_static_method(validation: Mapping[str, Any], objective: str = "use_relevant",
                       among: Sequence[str] | None = None) -> str:
    """The row key of the static method (every method but `auto`) with the highest mean over
    context types of `objective` in a **validation** run's `contexts.json` (its "means", by
    title) or its :meth:`ContextsEvaluation.means` (by row key), among `among` (keys or titles;
    default: all); ties go to the first in the run's method order.

    Raises:
        ValueError: the run has no means of `objective`, or no static method in `among`.
    """
    means = {row_key(m): row for m, row in validation.get("means", {}).get(objective, {}).items()}
    if not means:
        raise ValueError(f"the validation run has no {objective!r} means "
                         "(a contexts.json of `juice evaluate --contexts`)")
    allowed = None if among is None else {row_key(m) for m in among}
    order = [m for m in map(row_key, validation.get("methods", list(means)))
             if m in means and not chooses_per_request(m) and (allowed is None or m in allowed)]
    if not order:
        raise ValueError("the validation run shares no static method with this one")
    return max(order, key=lambda m: (means[m]["mean"], -order.index(m)))


def chooses_per_request(key: str) -> bool:
    """The row (a key or title) is a per-request choice among methods (`auto`, tuned by a policy),
    not a static method."""
    row = row_of(key)
    return row is not None and REGISTRY[row.method].tuned == "policy"


def summarize(results: Sequence[ItemResult], methods: Sequence[str], best_static: str | None = None, *,
              resamples: int = 2000, seed: int = 0) -> dict[str, QuestionBootstrap]:
    """:data:`SUMMARIZED` objective -> the question-resampled summary of every method, with the
    paired differences of each method against Original and against `best_static` (row keys)."""
    pairs = [(m, UNSTEERED) for m in methods if m != UNSTEERED and UNSTEERED in methods]
    if best_static in methods:
        pairs += [(m, best_static) for m in methods if m != best_static]
    return {name: question_bootstrap(results, methods, pairs, value=TABLES[name], resamples=resamples, seed=seed)
            for name in SUMMARIZED}


def evaluate_contexts(lm: LoadedModel, artifacts: Sequence[HeadsArtifact], items: ContextItems | Sequence[ContextItem],
                      names: Sequence[str], *, data: Mapping[str, Any] | None = None, max_rows: int | str = 64,
                      resamples: int = 2000, seed: int = 0, progress: Progress = no_progress,
                      validation: Mapping[str, Any] | None = None, engine: Engine | None = None,
                      ) -> ContextsEvaluation:
    """Evaluate `names` (:data:`juice.methods.REGISTRY`) on context-type items (module docstring).

    Args:
        validation: a validation run's `contexts.json` (other questions: `split="validation"`):
            the best static method is chosen there (:func:`best_static_method`) and every method
            is compared with it here; None: compared with Original only.
        engine: what decodes (:mod:`juice.engine.backend`; None: juice's own; vLLM's hands CAD,
            AdaCAD and auto to juice's).

    Raises:
        ValueError: see :func:`context_methods`; no items; a validation run without means.
    """
    items = items.items if isinstance(items, ContextItems) else list(items)
    if not items:
        raise ValueError("no context-type items to evaluate")
    methods, settings = context_methods(lm, artifacts, names)
    advance = progress(f"contexts: {len(methods)} methods x {len(items)} items", len(methods) * len(items))
    results = evaluate_context_types(lm, items, methods, max_rows=max_rows, on_progress=advance, engine=engine)
    keys = list(methods)
    focus = next((k for k in keys if chooses_per_request(k)),
                 next((k for k in keys if getattr(row_of(k), "method", None) == FOCUS), keys[0]))
    tables = context_type_tables(results, keys, focus=focus, resamples=resamples, seed=seed)
    data = dict(data or {})
    if validation is not None and data.get("split") and validation.get("data", {}).get("split") == data["split"]:
        raise ValueError(f"the validation run is of the {data['split']} split too: choose the best static method "
                         "on the other questions (--split validation)")
    best = best_static_method(validation, among=keys) if validation is not None else None
    if validation is not None:
        data["best_static_from"] = (f"{validation.get('data', {}).get('source', '?')}, split "
                                    f"{validation.get('data', {}).get('split') or 'all'}")
    return ContextsEvaluation(results, tables, keys, settings, data,
                              summarize(results, keys, best, resamples=resamples, seed=seed), best)


__all__ = ["SUMMARIZED", "ContextsEvaluation", "best_static_method", "chooses_per_request", "context_items",
           "context_methods", "evaluate_contexts", "prompt_fits", "summarize", "summary_table"]
