"""`juice evaluate`: methods on your test rows, on context types (`--contexts`, `--study`), or on
TriState-Bench (`--data` its folder)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from juice.apps.commands.common import (CONTEXT_LIMIT, ENGINE_HELP, VLLM_ARG_HELP, console, engine_for,
                                       engine_kind, load_for, progress)
from juice.models import DEFAULT_MODEL

if TYPE_CHECKING:
    from juice.engine.backend import Engine


def evaluate(
    data: Optional[Path] = typer.Option(None, exists=True, help=(
        "test rows (the formats of `juice tune --data`); with --contexts: an NQ-Swap file or folder, your own "
        "JSONL/CSV rows (question, context, answer, optional context_answer), a ParaConflict JSON file or the "
        "authors' folder of domains (absent: the built-in domains); TriState-Bench's data/TriState/ folder: "
        "that benchmark, screened for the model (docs/tristate.md; resumable in --out)")),
    heads: list[Path] = typer.Option([], exists=True, dir_okay=False, help=(
        "a heads file (needed for juice, june, ph3); with --contexts one per direction (repeat)")),
    methods: Optional[str] = typer.Option(None, help=(
        "comma-separated: original, prompt, juice, june, cad, adacad, ckplug, cocoa, coiecd, grd (rows need "
        "question), ph3 (after "
        "`juice tune --methods ph3`), auto (with --contexts, after `juice tune --methods auto`); default original,"
        "prompt,juice,june (with --contexts: original,prompt,cad,adacad,ckplug,june,juice, and ph3 and auto where a "
        "heads file holds them)")),
    direction: Optional[str] = typer.Option(None, help="parametric | contextual (default: the heads file's)"),
    beta_plus: Optional[float] = typer.Option(None, help="override the heads file's tuned beta+"),
    beta_minus: Optional[float] = typer.Option(None, help="override the heads file's tuned beta-"),
    limit: Optional[int] = typer.Option(None, min=1, help="evaluate the first N rows (with --contexts: items per "
                                                           f"source, default {CONTEXT_LIMIT}; TriState-Bench: facts "
                                                           "per state and half) only"),
    full: bool = typer.Option(False, "--full", help="with --contexts: every item and every prompt length"),
    max_prompt_tokens: int = typer.Option(256, help="with --contexts: drop items whose prompts are longer "
                                                    "(NQ-Swap's table passages), unless --full"),
    contexts: Optional[str] = typer.Option(None, help=(
        "when to steer: evaluate on the same questions with these contexts, comma-separated from gold, conflicting, "
        "irrelevant, none (docs/when-to-steer.md)")),
    domain: Optional[str] = typer.Option(None, help="with --contexts: one built-in or authors' domain"),
    split: Optional[str] = typer.Option(None, help=(
        "with --contexts: the questions of one half, validation or test (by question, seeded: "
        "juice.data.context_types.split_of); default every question")),
    validation: Optional[Path] = typer.Option(None, exists=True, dir_okay=False, help=(
        "with --contexts: a validation run's contexts.json (--split validation): the best static method is "
        "chosen there and every method compared with it")),
    study: bool = typer.Option(False, "--study", help=(
        "with --contexts and one heads file: the whole study: split the questions, choose the best static "
        "method and fit auto on validation, evaluate every method and auto on test (--limit: test questions "
        "per source; cached in --out/cache, resumable)")),
    validation_limit: Optional[int] = typer.Option(None, min=1, help="with --study: validation questions per source "
                                                                      "(default: as --limit)"),
    out: Path = typer.Option(Path("juice-evaluation"), help="folder for evaluation.json and evaluation.md "
                                                            "(with --contexts: contexts.json, .md, .png)"),
    model: str = typer.Option(DEFAULT_MODEL),
    device: str = typer.Option("auto", help="auto | cpu | cuda | cuda:N | mps"),
    engine: str = typer.Option("juice", help=ENGINE_HELP + "; not with --study (auto's fit runs on juice's engine)"),
    vllm_arg: list[str] = typer.Option([], help=VLLM_ARG_HELP),
):
    """Evaluate methods on your test rows: exact match per conflict-type label and their mean,
    with n and 95% bootstrap intervals, and paired differences; printed and saved. With
    --contexts: every method on gold, conflicting, irrelevant and no context, under both
    objectives (use relevant context, trust memory) and the rate of answers that follow the passage.

    With --contexts the default is the first 40 items per source whose prompts hold at most
    --max-prompt-tokens tokens (about 15 minutes on 2 cores); --full runs them all.

    Examples:

        juice evaluate --heads heads.json --data test.jsonl \\
            --methods original,prompt,juice,june,cad
        juice evaluate --contexts gold,conflicting,irrelevant,none \\
            --data nqswap/ --heads heads_contextual.json
        juice evaluate --data conflict-aware-decoding/data/TriState \\
            --limit 20
    """
    kind = engine_kind(engine)   # the name read once; below, what the engine can do
    if study and not kind.every_stream:
        raise typer.BadParameter("--study fits auto, which decides per request from a second, question-only "
                                 "sequence that vLLM cannot run: drop --engine vllm", param_hint="--engine")
    if contexts is not None and study:
        _study(data, heads, methods, domain, None if full else (limit or CONTEXT_LIMIT),
               None if full else (validation_limit or limit or CONTEXT_LIMIT), out, model, device,
               None if full else max_prompt_tokens)
        return
    if study:
        raise typer.BadParameter("--study is for the context-type evaluation: add --contexts", param_hint="--study")
    if contexts is not None:
        _evaluate_contexts(data, heads, methods, contexts, domain, None if full else (limit or CONTEXT_LIMIT),
                           out, model, device, None if full else max_prompt_tokens, split, validation, kind,
                           vllm_arg)
        return
    from juice.data.tristate import is_tristate_folder

    if data is not None and is_tristate_folder(data):
        if not kind.every_stream:
            raise typer.BadParameter("TriState-Bench tunes auto and runs GRD, which juice's engine decodes: drop "
                                     "--engine vllm", param_hint="--engine")
        _evaluate_tristate(data, heads, methods, limit, out, model, device)
        return
    _evaluate_rows(data, heads, methods, direction, beta_plus, beta_minus, limit, out, model, device, kind,
                   vllm_arg)


def _evaluate_tristate(data: Path, heads: list[Path], methods: Optional[str], limit: Optional[int], out: Path,
                       model: str, device: str) -> None:
    """`juice evaluate --data <TriState-Bench's data/TriState/>` (:func:`juice.pipeline.tristate.run_benchmark`)."""
    from juice.data.tristate import load_tristate
    from juice.io import write_json_atomic
    from juice.methods import lookup, names as method_names
    from juice.models import load_model
    from juice.pipeline.tristate import DEFAULT_METHODS, benchmark_markdown, run_benchmark, verdict_markdown
    from juice.stage1 import load_heads
    from juice.stage1.shipped import shipped_heads

    try:   # bad input fails before the model loads
        facts = load_tristate(data)
        chosen = methods.split(",") if methods else [*DEFAULT_METHODS, *method_names(tuned="policy")]   # and auto
        specs = [lookup(m) for m in chosen if m.strip()]
    except (ValueError, FileNotFoundError) as err:
        raise typer.BadParameter(str(err), param_hint="--methods" if "method" in str(err) else "--data") from None
    for path in heads:
        load_heads(path)
    lm = load_model(model, device=device)
    needs_heads = any(spec.heads for spec in specs)
    artifacts = ([load_heads(p, lm) for p in heads] if heads or not needs_heads
                 else [shipped_heads(lm, d) for d in ("parametric", "contextual")])
    try:
        with progress() as task:
            result = run_benchmark(lm, facts, artifacts, out / "state",   # auto: tuned on the validation facts
                                   names=[s.name for s in specs if s.tuned != "policy"],
                                   auto=any(s.tuned == "policy" for s in specs), limit=limit, progress=task)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--heads") from None
    report = (f"# TriState-Bench on {lm.name}\n\nExact match, % [95% interval], on the test facts; "
              f"degenerate outputs, %.\n\n{benchmark_markdown(result)}\n\n{verdict_markdown(result)}\n")
    write_json_atomic(out / "tristate.json", result)
    (out / "tristate.md").write_text(report, encoding="utf-8")
    console.print(report)
    console.print(f"wrote {out / 'tristate.json'}, {out / 'tristate.md'}")


def _evaluate_rows(data: Optional[Path], heads: list[Path], methods: Optional[str], direction: Optional[str],
                   beta_plus: Optional[float], beta_minus: Optional[float], limit: Optional[int], out: Path,
                   model: str, device: str, kind: "type[Engine]", vllm_args: list[str] = ()) -> None:
    """`juice evaluate` on your test rows (:func:`juice.workflow.evaluate_file`), on the engine of class `kind`."""
    from juice.apps.terminal import interval_rich
    from juice.eval.report import degeneration_markdown, difference_markdown, interval_markdown
    from juice.stage1 import load_heads
    from juice.io import write_json_atomic
    from juice.userdata import load_rows
    from juice.workflow import check_methods, evaluate_file, parse_direction

    if data is None or data.is_dir():
        raise typer.BadParameter("give a file of test rows (a folder is for --contexts)", param_hint="--data")
    if len(heads) > 1:
        raise typer.BadParameter("one heads file (two, one per direction, with --contexts)", param_hint="--heads")
    names = [m.strip().lower() for m in (methods or "original,prompt,juice,june").split(",") if m.strip()]
    artifact = load_heads(heads[0]) if heads else None   # malformed input fails before the model loads
    chosen = parse_direction(direction or (artifact.direction if artifact else "parametric"))
    load_rows(data, chosen)
    check_methods(names, artifact)
    lm = load_for(kind, model, device)
    artifact = load_heads(heads[0], lm) if heads else None
    with engine_for(kind, model, out / "vllm", vllm_args) as runner, progress() as task:
        runner.check(lm)
        report = evaluate_file(lm, artifact, data, names, direction=chosen, beta_plus=beta_plus,
                               beta_minus=beta_minus, limit=limit, progress=task, engine=runner).titled()
    columns = report.columns()
    headers = [c for c, _ in columns]
    console.print(interval_rich(report.table, report.methods, columns, headers,
                                title=f"{data.name}: exact match, % (95% interval half-width)"))
    console.print(interval_rich(report.degeneration, report.methods, columns, headers,
                                title="degenerate outputs, % (lower is better; juice's measure)", bold=False))
    console.print(interval_rich(report.correct_not_degenerate, report.methods, columns, headers,
                                title="correct and not degenerate, % (juice's second score)"))
    for name, setting in report.settings.items():
        console.print(f"{name}: " + ", ".join(f"{k} {v}" for k, v in setting.items()))
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "evaluation.json", report.to_json())
    (out / "evaluation.md").write_text(
        f"# {data.name} ({chosen} direction)\n\nExact match, % (95% bootstrap interval half-width); "
        f"bold: interval wholly above the runner-up's.\n\n" + interval_markdown(report.table, report.methods, columns, headers)
        + "\nPaired differences, percentage points [95% interval]:\n\n" + difference_markdown(report.table, columns, headers)
        + "\n".join(degeneration_markdown(report.degeneration, report.correct_not_degenerate, report.methods, columns,
                                           headers, columns, headers)), encoding="utf-8")
    console.print(f"wrote {out / 'evaluation.json'}, {out / 'evaluation.md'}")


def _study(data: Optional[Path], heads: list[Path], methods: Optional[str], domain: Optional[str],
           test_limit: Optional[int], validation_limit: Optional[int], out: Path, model: str, device: str,
           max_prompt_tokens: Optional[int]) -> None:
    """`juice evaluate --contexts --study` (:mod:`juice.when_to_steer.study`)."""
    from juice.methods import names as method_names, row_title
    from juice.when_to_steer.study import run_study
    from juice.models import load_model
    from juice.stage1 import load_heads
    from juice.when_to_steer.evaluation import MEAN
    from juice.when_to_steer.contexts import context_items, prompt_fits

    if len(heads) != 1:
        raise typer.BadParameter("--study takes one heads file", param_hint="--heads")
    try:   # bad input fails before the model loads
        context_items(data, domain=domain, limit=1, split="test")
    except (ValueError, FileNotFoundError) as err:
        raise typer.BadParameter(str(err), param_hint="--data") from None
    names = [m.strip().lower() for m in (methods or "original,prompt,cad,adacad,ckplug,june,juice,auto").split(",")
             if m.strip()]
    load_heads(heads[0])
    lm = load_model(model, device=device)
    artifact = load_heads(heads[0], lm)
    try:
        with progress() as task:
            policies = method_names(tuned="policy")   # auto: the study fits it on validation items
            result = run_study(lm, artifact, data, out=out, names=[n for n in names if n not in policies],
                               auto=any(n in policies for n in names), validation_limit=validation_limit,
                               test_limit=test_limit,
                               keep=None if max_prompt_tokens is None else prompt_fits(lm.tokenizer, max_prompt_tokens),
                               domain=domain, progress=task)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--methods") from None
    boot = result.test.summary["use_relevant"]
    console.print(f"best static method on validation: {row_title(result.test.best_static)}")
    console.print("test, use relevant context, mean over context types (by question): " + "; ".join(
        f"{row_title(m)} {boot.cells[m][MEAN].format()}" for m in result.test.methods if m in boot.cells))
    console.print(f"wrote {out / 'study.md'}, {out / 'study.json'}, {out / 'validation'}, {out / 'test'}")


def _evaluate_contexts(data: Optional[Path], heads: list[Path], methods: Optional[str], contexts: str, domain: Optional[str],
                       limit: Optional[int], out: Path, model: str, device: str,
                       max_prompt_tokens: Optional[int], split: Optional[str],
                       validation: Optional[Path], kind: "type[Engine]", vllm_args: list[str] = ()) -> None:
    """`juice evaluate --contexts` (:mod:`juice.when_to_steer.contexts`), on the engine of class `kind`."""
    from juice.apps.terminal import interval_rich
    from juice.io import write_json_atomic
    from juice.methods import row_title
    from juice.plots import have_matplotlib
    from juice.stage1 import load_heads
    from juice.when_to_steer.contexts import TITLES, context_items, evaluate_contexts

    try:   # bad input fails before the model loads
        kinds = [c.strip().lower() for c in contexts.split(",") if c.strip()]
        items, where = context_items(data, domain=domain, limit=limit, contexts=kinds, split=split)
        chosen_on = None if validation is None else json.loads(validation.read_text(encoding="utf-8"))
    except (ValueError, FileNotFoundError) as err:
        hint = next((h for h in ("--contexts", "--split") if h in str(err)), "--data")
        raise typer.BadParameter(str(err), param_hint=hint) from None
    except json.JSONDecodeError as err:
        raise typer.BadParameter(f"{validation}: not JSON ({err.msg})", param_hint="--validation") from None
    files = [load_heads(path) for path in heads]
    if methods is None:   # every method; PH3 and auto where a heads file holds them tuned
        methods = ("original,prompt,cad,adacad,ckplug" + (",ph3" if any(f.tuned.ph3 for f in files) else "")
                   + ",june,juice" + (",auto" if any(f.tuned.auto for f in files) else ""))
    names = [m.strip().lower() for m in methods.split(",") if m.strip()]
    lm = load_for(kind, model, device)
    if max_prompt_tokens is not None:   # the first `limit` items whose prompts fit
        from juice.when_to_steer.contexts import prompt_fits

        items, where = context_items(data, domain=domain, limit=limit, contexts=kinds, split=split,
                                     keep=prompt_fits(lm.tokenizer, max_prompt_tokens))
        where["max_prompt_tokens"] = max_prompt_tokens
    artifacts = [load_heads(path, lm) for path in heads]
    try:
        with engine_for(kind, model, out / "vllm", vllm_args) as runner, progress() as task:
            runner.check(lm)
            report = evaluate_contexts(lm, artifacts, items, names, data=where, progress=task, validation=chosen_on,
                                       engine=runner)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--validation" if "validation" in str(err) else "--methods") from None
    columns = report.columns()
    for name, table in report.tables.items():
        cols = [(c, g) for c, g in columns if name != "follows_context" or g != "none"]
        console.print(interval_rich(table.titled(), [row_title(m) for m in report.methods], cols, [g for _, g in cols],
                                    title=f"{TITLES[name]}, % (95% interval half-width)",
                                    bold=name not in ("follows_context", "degenerate")))
    from juice.when_to_steer.evaluation import MEAN

    for name, boot in report.summary.items():
        console.print(f"{TITLES[name]}, mean over context types (by question): " + "; ".join(
            f"{row_title(m)} {boot.cells[m][MEAN].format()}" for m in report.methods if m in boot.cells))
    console.print(f"items {where['counts']}, skipped {where['skipped']}"
                  + (f", {where['dropped']} dropped (prompts over {where['max_prompt_tokens']} tokens; --full keeps them)"
                     if where.get("dropped") else ""))
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "contexts.json", report.to_json())
    (out / "contexts.md").write_text(report.markdown(), encoding="utf-8")
    written = [out / "contexts.json", out / "contexts.md"]
    if have_matplotlib():
        written.append(report.figure(out / "contexts.png"))
    console.print("wrote " + ", ".join(map(str, written)))
