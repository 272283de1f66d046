"""The when-to-steer numbers of docs/when-to-steer.md: `juice.when_to_steer.study.run_study` on NQ-Swap
or the six built-in ParaConflict domains, with the contextual heads and NQ-Swap's tuned betas of
a `juice reproduce --direction contextual` run (Table 2, the paper's protocol).

    juice reproduce --direction contextual --out juice-output          # heads and betas (Table 2)
    python benchmarks/when_to_steer_study.py nqswap --reproduced juice-output --size published
    python benchmarks/when_to_steer_study.py paraconflict --reproduced juice-output --size published

The same study runs inside `juice reproduce --direction contextual --contexts nqswap,paraconflict`
(`--full`: the published size) after Table 2; this script studies an existing reproduction.

Sizes (distinct questions per source, validation / test): "default" 40 / 40 (NQ-Swap) and 8 / 8
per domain (ParaConflict); "published" 300 / 250 (NQ-Swap) and 55 / 50 per domain (330 / 300 over
the six). NQ-Swap keeps prompts of at most 256 tokens. Resumable: decoding is cached per chunk
in `<out>/cache`, keyed by the decoding code's source. `--decode-only` decodes every method on
both halves and stops (the published size's hours, in as many runs as it takes; kill it
any time: a run loses at most the chunk it was decoding); the same command without it then
fits and routes `auto` and writes the study from the cache in minutes. `--heads FILE` instead of
`--reproduced`: a heads file with NQ-Swap's tuned betas, such as juice's shipped
`src/juice/stage1/shipped/gemma-3-270m.contextual.json` (the heads and betas of the published record).

Each half's outcomes are written as soon as it is decoded (`<out>/outcomes-validation.json`,
`<out>/outcomes-test.json`, with the decoding code's key, the model's and the settings'), and
`--decode-only --half test` decodes one half alone: a study too long for one machine's session is
decoded a half at a time, its halves kept under benchmarks/results/when-to-steer-outcomes/
<dataset>/, and joined only where the same code decoded them. `--shard 0/2` and `--shard 1/2`
(two runs side by side, `--threads 1` each, on a small model busier than one run on 2 threads)
decode into the cache only; the same command without `--shard` then writes the outcomes from it.

`--record FILE --from-reproduced DIR` writes the compact record of a reproduction's studies
(`DIR/when-to-steer-<dataset>/study.json`: the best static method, auto's policy and validation
fit, the cross-validation, every summary table with n and intervals; the command and the commit):
benchmarks/results/when-to-steer-<size>.json, whose tables docs/when-to-steer.md holds as
:func:`record_markdown` renders them (a test keeps them equal).

    juice reproduce --direction contextual --contexts nqswap,paraconflict --out juice-output
    python benchmarks/when_to_steer_study.py --from-reproduced juice-output --size default \
        --record benchmarks/results/when-to-steer-default.json

`--analyze DATASET=DIR` (once per dataset) reads the studies' decoded outcomes
(`DIR/outcomes.json`, written by the decoding alone, or else its two halves' files) and writes the pre-registered record
(:func:`published_record`: the plan and its SHA-256, auto minus the best static method in every
design with intervals, the do-no-harm table and the risk-coverage curves on the test half) and
its figure, in seconds, without a model:

    python benchmarks/when_to_steer_study.py \
        --analyze paraconflict=benchmarks/results/when-to-steer-outcomes/paraconflict \
        --analyze nqswap=benchmarks/results/when-to-steer-outcomes/nqswap \
        --heads src/juice/stage1/shipped/gemma-3-270m.contextual.json \
        --record benchmarks/results/when-to-steer-published.json --figure docs/assets/risk-coverage.png
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def heads_with_table2_betas(reproduced: Path, out: Path) -> Path:
    """`heads_contextual.json` of a contextual reproduction with NQ-Swap's tuned JuICE and JuNE
    betas (its `results_contextual.json`, `choices.nqswap.betas`) written into `tuned`
    (:func:`juice.experiments.table2.table2_heads`)."""
    from juice.experiments.table2 import table2_heads

    heads = json.loads((reproduced / "heads_contextual.json").read_text(encoding="utf-8"))
    betas = json.loads((reproduced / "results_contextual.json").read_text(encoding="utf-8"))["choices"]["nqswap"]["betas"]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(table2_heads(heads, betas, f"{reproduced}/results_contextual.json"), indent=1),
                   encoding="utf-8")
    return out


COMMAND = "juice reproduce --direction contextual --contexts nqswap,paraconflict"

DISPLAY = {"nqswap": "NQ-Swap", "paraconflict": "ParaConflict (juice's templated domains)"}
"""The datasets' names on the pages."""


def record(reproduced: Path, size: str, source: dict | None = None) -> dict:
    """The compact record of a reproduction's when-to-steer studies (module docstring): the
    command, this checkout's commit and whether its tracked files were dirty (`source`:
    :func:`_common.git_state` read when the command started, else now), and the heads as the heads
    file holds them (read by :func:`juice.stage1.load_heads`)."""
    from _common import git_state

    source = source or git_state()
    out = {"command": COMMAND + (" --full" if size == "published" else ""), "size": size,
           "commit": source["commit"], "dirty": source["dirty"],
           "date": time.strftime("%Y-%m-%d"), "model": "gemma-3-270m", "device": "cpu, fp32", "datasets": {}}
    from juice.pipeline.run import selection_to_json
    from juice.stage1 import load_heads

    out["heads"] = selection_to_json(load_heads(reproduced / "heads_contextual.json").selection)
    for folder in sorted(reproduced.glob("when-to-steer-*")):
        study = json.loads((folder / "study.json").read_text(encoding="utf-8"))
        tuned = json.loads((folder / "heads_table2.json").read_text(encoding="utf-8"))["tuned"]
        out["datasets"][folder.name.removeprefix("when-to-steer-")] = {
            "best_static": study["best_static"], "auto": study["auto"], "cross_validation": {
                k: {f: v[f] for f in ("auto", "best_static", "difference", "low", "high", "standard_error",
                                      "qualified", "chosen")} for k, v in study["cross_validation"].items()},
            "betas": {m: tuned[m] for m in ("juice", "june") if m in tuned},
            "test": {k: study["test"][k] for k in ("use_relevant", "trust_memory")},
            "validation": {"use_relevant": study["validation"]["use_relevant"]},
            "seconds": {k: round(v) for k, v in study["timings_s"].items()}}
    return out


def record_markdown(rec: dict, dataset: str) -> str:
    """A dataset's part of docs/when-to-steer.md from the record: the test table (use relevant
    context, by question), auto's policy and its cross-validation, as the study writes them."""
    from juice.when_to_steer.auto import AutoPolicy
    from juice.when_to_steer.evaluation import QuestionBootstrap
    from juice.when_to_steer import summary_table

    part = rec["datasets"][dataset]
    boot = QuestionBootstrap.from_json(part["test"]["use_relevant"])
    lines = [summary_table(boot, list(boot.cells), part["best_static"], "the validation questions")]
    if part["auto"] is not None:
        fit = part["auto"]
        lines.append(f"auto's policy (fitted on validation): {AutoPolicy.from_json(fit).describe()}; validation mean "
                     f"{fit['mean']:.1f}% against " + ", ".join(f"{c} {x:.1f}%" for c, x in fit["static"].items()) + ".")
    for label, c in part["cross_validation"].items():
        lines.append(f"- cross-validation on validation ({label}): auto {c['auto']:.1f}%, best static "
                     f"{c['best_static']:.1f}%, difference {c['difference']:+.1f} [{c['low']:+.1f}, {c['high']:+.1f}], "
                     f"{'qualified' if c['qualified'] else 'not qualified'}")
    return "\n".join(lines) + "\n"


def headline(rec: dict, dataset: str) -> str:
    """auto against the best static method chosen on validation on a dataset's test questions, as
    the README and the home page quote it: "auto - <best> +x.x [low, high] on N test questions"."""
    part = rec["datasets"][dataset]
    best = part["best_static"]
    key = next(k for k in part["test"]["use_relevant"]["differences"] if k.startswith("auto") and k.endswith(f" - {best}"))
    mean = part["test"]["use_relevant"]["differences"][key]["mean"]
    n = next(iter(part["test"]["use_relevant"]["cells"].values()))["mean"]["n"]
    return (f"auto - {best} {100 * mean['mean']:+.1f} [{100 * mean['low']:+.1f}, {100 * mean['high']:+.1f}] "
            f"on {n} test questions")


def heads_and_betas(heads: Path) -> dict:
    """The heads and the JuICE and JuNE betas of a heads file with NQ-Swap's tuned betas of Table 2
    (`tuned`; juice's shipped contextual heads hold them), as a record states them."""
    from juice.pipeline.run import selection_to_json
    from juice.stage1 import load_heads

    tuned = json.loads(heads.read_text(encoding="utf-8")).get("tuned", {})
    missing = [m for m in ("juice", "june") if m not in tuned]
    if missing:
        raise ValueError(f"{heads}: no tuned betas for {', '.join(missing)} (a heads file with NQ-Swap's tuned betas)")
    return {"heads": selection_to_json(load_heads(heads).selection),
            "betas": {m: {k: tuned[m][k] for k in ("beta_plus", "beta_minus")} for m in ("juice", "june")}}


def published_record(folders: dict[str, Path], reproduced: Path | None = None, source: dict | None = None,
                     command: str = "", heads: Path | None = None) -> dict:
    """The pre-registered record of decoded studies (`folders`: dataset -> a study folder with
    `outcomes.json` or its two halves' files, :func:`juice.when_to_steer.outcomes.read_outcomes`): the plan and its SHA-256, every estimate of
    :func:`juice.when_to_steer.preregistered.analyze`, and per dataset the questions per half,
    `auto`'s policy fitted on validation (the primary procedure), the do-no-harm table of every
    static method and `auto` on the test half (:func:`juice.when_to_steer.harm.harm_table`), their
    risk-coverage curves and areas, and the SHA-256 of the outcomes it read as `outcomes.json`
    holds them (which decoding it analyzed); the heads and betas of `heads` (a heads file,
    :func:`heads_and_betas`) or else of `reproduced`, the command, the commit and the dirty flag
    (`source`, read when the command started)."""
    from _common import git_state
    from juice.methods import row_title
    from juice.when_to_steer.evaluation import QUESTION_ONLY
    from juice.when_to_steer.harm import area_under, auto_bins, harm_table, risk_coverage
    from juice.when_to_steer.outcomes import outcomes_sha256, read_outcomes
    from juice.when_to_steer.preregistered import PLAN, PRIMARY, analyze, with_candidates

    source = source or git_state()
    read = {name: read_outcomes(folder) for name, folder in folders.items()}
    datasets = {name: with_candidates(o) for name, o in read.items()}
    analysis = analyze(datasets)
    rec = {"command": command, "commit": source["commit"], "dirty": source["dirty"], "date": time.strftime("%Y-%m-%d"),
           "model": "gemma-3-270m", "device": "cpu, fp32", **analysis, "datasets": {}}
    if heads is not None:
        rec.update(heads_and_betas(heads))
    elif reproduced is not None:
        from juice.pipeline.run import selection_to_json
        from juice.stage1 import load_heads

        rec["heads"] = selection_to_json(load_heads(reproduced / "heads_contextual.json").selection)
        rec["betas"] = {m: {k: b[k] for k in ("beta_plus", "beta_minus")} for m, b in json.loads(
            (reproduced / "results_contextual.json").read_text(encoding="utf-8"))["choices"]["nqswap"]["betas"].items()}
    rec["sensitivity"] = {label: sensitivity(datasets, without) for label, without in SENSITIVITY.items()}
    for name, o in datasets.items():
        policy, test = primary_on_test(o, PLAN)
        methods = [*o.static, PRIMARY]
        curves = {row_title(m): risk_coverage(test, test.verdicts["use"][m]) for m in o.static if m != QUESTION_ONLY}
        curves[f"{PRIMARY} (its bins)"] = risk_coverage(test, auto_bins(test, policy))
        rec["datasets"][name] = {
            "outcomes_sha256": outcomes_sha256(read[name]),
            "questions": {half: len(set(o.where(half=half).questions())) for half in ("validation", "test")},
            "policy": policy.to_json(), "harm": harm_table(test, methods, resamples=PLAN.resamples, seed=PLAN.seed),
            "risk_coverage": curves, "area_under_risk_coverage": {m: round(area_under(c), 4) for m, c in curves.items()}}
    return rec


def primary_on_test(o, plan):
    """`plan`'s primary procedure fitted on `o`'s validation half: (its policy, `o`'s test half with
    the policy's routed verdicts as method :data:`juice.when_to_steer.preregistered.PRIMARY`)."""
    from juice.when_to_steer.preregistered import PRIMARY, fit, routed

    policy = fit(o.where(half="validation"), plan.procedures[PRIMARY]).policy
    test = o.where(half="test")
    return policy, test.with_method(PRIMARY, routed(test, policy))


SENSITIVITY = {"without Prompt-mem among auto's candidates": "prompt-mem"}
"""Label -> the candidate of the plan a sensitivity analysis leaves out (labelled as such beside the
plan's estimates: the plan otherwise unchanged)."""


def sensitivity(datasets: dict, without: str) -> dict:
    """The primary procedure's estimates in every design, and per dataset its policy and do-no-harm
    verdict on the test half, with auto choosing among the plan's candidates but `without`
    (:data:`juice.when_to_steer.preregistered.PLAN` otherwise)."""
    from dataclasses import replace

    from juice.when_to_steer.harm import KEEPS, harm_table
    from juice.when_to_steer.preregistered import PLAN, PRIMARY, analyze, with_candidates

    candidates = tuple(c for c in PLAN.candidates if c != without)
    plan = replace(PLAN, candidates=candidates)
    part = analyze(datasets, plan)
    out = {"candidates": list(candidates), "plan_sha256": part["plan_sha256"],
           "estimates": [e for e in part["estimates"] if e["procedure"] == PRIMARY], "datasets": {}}
    for name, o in datasets.items():
        policy, test = primary_on_test(with_candidates(o, plan), plan)
        harm = harm_table(test, [PRIMARY], resamples=plan.resamples, seed=plan.seed)
        out["datasets"][name] = {"policy": policy.to_json(), "keeps known answers": harm["rows"][PRIMARY].get(KEEPS),
                                 "verdict": harm["verdicts"][PRIMARY]}
    return out


def dataset_title(name: str) -> str:
    """A record's dataset name as the pages show it, a fit across datasets included
    ("paraconflict -> nqswap": "ParaConflict (juice's templated domains) -> NQ-Swap")."""
    return " -> ".join(DISPLAY.get(d, d) for d in name.split(" -> "))


def sensitivity_sentences(rec: dict) -> list[str]:
    """The sensitivity analyses (:data:`SENSITIVITY`), one sentence per analysis and dataset, then one
    per fit across datasets, as docs/when-to-steer.md quotes them."""
    out = []
    for label, part in rec.get("sensitivity", {}).items():
        for name, d in part["datasets"].items():
            shown = [e for e in part["estimates"] if e["dataset"] == name]
            keeps, verdict = d["keeps known answers"], d["verdict"]
            out.append(f"{DISPLAY.get(name, name)}, {label}: auto minus the best static method "
                       + "; ".join(f"{e['design']} {e['difference']:+.1f} [{e['low']:+.1f}, {e['high']:+.1f}]"
                                   for e in shown)
                       + (" points; no known answer meets a misleading passage" if keeps is None else
                          f" points; auto keeps {100 * keeps['mean']:.1f} [{100 * keeps['low']:.1f}, "
                          f"{100 * keeps['high']:.1f}] % of known answers under misleading passages")
                       + " and " + ("does no measurable harm" if verdict["no measurable harm"] else "harms") + ".")
        for e in part["estimates"]:
            if " -> " in e["dataset"]:   # fitted on one dataset, scored on the other
                out.append(f"{dataset_title(e['dataset'])}, {label}: auto minus the best static method {e['design']} "
                           f"{e['difference']:+.1f} [{e['low']:+.1f}, {e['high']:+.1f}] points.")
    return out


def verdict_sentences(rec: dict) -> list[str]:
    """The record's verdict, one sentence per dataset and claim, as the pages quote it: the primary
    estimate in every design, then which methods do no measurable harm and use relevant passages
    (:mod:`juice.when_to_steer.harm`'s rule)."""
    from juice.when_to_steer.preregistered import PRIMARY

    out = []
    for e in rec["estimates"]:
        if e["procedure"] != PRIMARY:
            continue
        chosen = e["best_static"] if isinstance(e["best_static"], str) else "the best static method of each fold"
        out.append(f"{dataset_title(e['dataset'])}, {e['design']}: auto - {chosen} {e['difference']:+.1f} "
                   f"[{e['low']:+.1f}, {e['high']:+.1f}] points on {e['questions']} questions.")
    for name, part in rec["datasets"].items():
        verdicts = part["harm"]["verdicts"]
        both = [m for m, v in verdicts.items() if v["no measurable harm"] and v["uses relevant passages"]]
        out.append(f"{dataset_title(name)} (test half, {part['questions']['test']} questions): "
                   + (f"{', '.join(both)} {'does' if len(both) == 1 else 'do'} no measurable harm and "
                      f"{'uses' if len(both) == 1 else 'use'} relevant passages." if both else
                      "no method does no measurable harm while using relevant passages."))
    return out


def published_markdown(rec: dict) -> str:
    """The record as the page shows it: the verdict sentences, the estimates per design, and per
    dataset the do-no-harm table and the areas under the risk-coverage curves."""
    from juice.when_to_steer.harm import harm_markdown
    from juice.when_to_steer.preregistered import estimate_markdown

    lines = ["\n".join(f"- {s}" for s in verdict_sentences(rec)), "", estimate_markdown(rec, DISPLAY)]
    if rec.get("sensitivity"):
        lines += ["**Sensitivity (beside the plan, not its estimate)**", "",
                  "\n".join(f"- {s}" for s in sensitivity_sentences(rec)), ""]
    for name, part in rec["datasets"].items():
        lines += [f"**{DISPLAY.get(name, name)}: do no harm (test half)**", "", harm_markdown(part["harm"]),
                  "Area under the risk-coverage curve (lower is better): "
                  + ", ".join(f"{m} {a:.3f}" for m, a in part["area_under_risk_coverage"].items()) + ".", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    from juice.pipeline.run import study_sizes

    parser.add_argument("dataset", nargs="?", choices=sorted(study_sizes()))
    parser.add_argument("--reproduced", type=Path, help="a `juice reproduce --direction contextual` output")
    parser.add_argument("--heads", type=Path, help="instead of --reproduced: a heads file with NQ-Swap's tuned "
                        "betas (e.g. juice's shipped src/juice/stage1/shipped/gemma-3-270m.contextual.json)")
    parser.add_argument("--from-reproduced", type=Path, help="with --record: a reproduction that ran --contexts")
    parser.add_argument("--record", type=Path, help="write the compact record of --from-reproduced's studies")
    parser.add_argument("--data", type=Path, default=Path("../shared/data"), help="holds nqswap/ (NQ-Swap only)")
    parser.add_argument("--size", choices=["default", "published"], default="default")
    parser.add_argument("--out", type=Path, default=None, help="default: when-to-steer-<dataset>-<size>")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--decode-only", action="store_true", help="decode into the cache and stop")
    parser.add_argument("--half", choices=["validation", "test"],
                        help="with --decode-only: decode this half only (its outcomes-<half>.json)")
    parser.add_argument("--shard", default="0/1", metavar="K/N",
                        help="with --decode-only: decode chunks k, k+n, ... into the cache only (n runs side by "
                             "side, --threads 1 each; a run without --shard then writes the outcomes)")
    parser.add_argument("--analyze", action="append", default=[], metavar="DATASET=DIR",
                        help="a decoded study's folder (outcomes.json); with --record: the pre-registered record")
    parser.add_argument("--figure", type=Path, help="with --analyze: the risk-coverage curves (PNG)")
    args = parser.parse_args()
    if args.analyze:
        if args.record is None:
            parser.error("--analyze needs --record")
        import sys

        from _common import git_state
        from juice.when_to_steer.harm import risk_coverage_figure

        folders = dict(a.split("=", 1) for a in args.analyze)
        rec = published_record({k: Path(v) for k, v in folders.items()}, args.reproduced, git_state(),
                               "python benchmarks/when_to_steer_study.py " + " ".join(sys.argv[1:]), args.heads)
        args.record.write_text(json.dumps(rec, indent=1) + "\n", encoding="utf-8")
        if args.figure is not None:
            risk_coverage_figure({k: v["risk_coverage"] for k, v in rec["datasets"].items()}, args.figure,
                                 "risk-coverage on the test half (gate: the question's words in the passage)")
        print(published_markdown(rec))
        return
    if args.record is not None:
        if args.from_reproduced is None:
            parser.error("--record needs --from-reproduced")
        from _common import git_state

        rec = record(args.from_reproduced, args.size, git_state())
        args.record.write_text(json.dumps(rec, indent=1) + "\n", encoding="utf-8")
        for dataset in rec["datasets"]:
            print(f"## {dataset}\n\n{record_markdown(rec, dataset)}")
        return
    if args.half and not args.decode_only:
        parser.error("--half needs --decode-only")
    try:
        shard = tuple(int(x) for x in args.shard.split("/"))
        assert len(shard) == 2 and 0 <= shard[0] < shard[1]
    except (ValueError, AssertionError):
        parser.error(f"--shard: {args.shard!r} is not K/N with 0 <= K < N")
    if shard[1] > 1 and not args.decode_only:
        parser.error("--shard needs --decode-only")
    if args.dataset is None or (args.reproduced is None) == (args.heads is None):
        parser.error("give a dataset and --reproduced or --heads (or --record with --from-reproduced)")

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    import juice
    from juice.when_to_steer.study import run_study
    from juice.experiments.table2 import STUDY_MAX_PROMPT_TOKENS
    from juice.when_to_steer import prompt_fits

    out = args.out or Path(f"when-to-steer-{args.dataset}-{args.size}")
    heads = args.heads or heads_with_table2_betas(args.reproduced, out / "heads_table2.json")
    lm = juice.load_model("gemma-3-270m", device="cpu")
    artifact = juice.load_heads(heads, lm)
    validation, test = study_sizes()[args.dataset][args.size]
    start = time.perf_counter()
    from juice.apps.progress import plain_progress

    with plain_progress() as progress:
        options = dict(out=out, validation_limit=validation, test_limit=test, decode_only=args.decode_only,
                       progress=progress, decode_shard=shard, **({"decode_halves": (args.half,)} if args.half else {}))
        if args.dataset == "nqswap":
            study = run_study(lm, artifact, args.data / "nqswap",
                              keep=prompt_fits(lm.tokenizer, STUDY_MAX_PROMPT_TOKENS), **options)
        else:
            study = run_study(lm, artifact, None, **options)
    if study is None:
        print(f"{time.perf_counter() - start:.0f} s; every method decoded into {out / 'cache'}")
        return
    print(f"{time.perf_counter() - start:.0f} s; wrote {out / 'study.md'}; best static on validation: "
          f"{study.test.best_static}")


if __name__ == "__main__":
    main()
