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
fits and routes `auto` and writes the study from the cache in minutes.

`--record FILE --from-reproduced DIR` writes the compact record of a reproduction's studies
(`DIR/when-to-steer-<dataset>/study.json`: the best static method, auto's policy and validation
fit, the cross-validation, every summary table with n and intervals; the command and the commit):
benchmarks/results/when-to-steer-<size>.json, whose tables docs/when-to-steer.md holds as
:func:`record_markdown` renders them (a test keeps them equal).

    juice reproduce --direction contextual --contexts nqswap,paraconflict --out juice-output
    python benchmarks/when_to_steer_study.py --from-reproduced juice-output --size default \
        --record benchmarks/results/when-to-steer-default.json
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    from juice.pipeline.run import study_sizes

    parser.add_argument("dataset", nargs="?", choices=sorted(study_sizes()))
    parser.add_argument("--reproduced", type=Path, help="a `juice reproduce --direction contextual` output")
    parser.add_argument("--from-reproduced", type=Path, help="with --record: a reproduction that ran --contexts")
    parser.add_argument("--record", type=Path, help="write the compact record of --from-reproduced's studies")
    parser.add_argument("--data", type=Path, default=Path("../shared/data"), help="holds nqswap/ (NQ-Swap only)")
    parser.add_argument("--size", choices=["default", "published"], default="default")
    parser.add_argument("--out", type=Path, default=None, help="default: when-to-steer-<dataset>-<size>")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--decode-only", action="store_true", help="decode into the cache and stop")
    args = parser.parse_args()
    if args.record is not None:
        if args.from_reproduced is None:
            parser.error("--record needs --from-reproduced")
        from _common import git_state

        rec = record(args.from_reproduced, args.size, git_state())
        args.record.write_text(json.dumps(rec, indent=1) + "\n", encoding="utf-8")
        for dataset in rec["datasets"]:
            print(f"## {dataset}\n\n{record_markdown(rec, dataset)}")
        return
    if args.dataset is None or args.reproduced is None:
        parser.error("give a dataset and --reproduced (or --record with --from-reproduced)")

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    import juice
    from juice.when_to_steer.study import run_study
    from juice.experiments.table2 import STUDY_MAX_PROMPT_TOKENS
    from juice.when_to_steer import prompt_fits

    out = args.out or Path(f"when-to-steer-{args.dataset}-{args.size}")
    heads = heads_with_table2_betas(args.reproduced, out / "heads_table2.json")
    lm = juice.load_model("gemma-3-270m", device="cpu")
    artifact = juice.load_heads(heads, lm)
    validation, test = study_sizes()[args.dataset][args.size]
    start = time.perf_counter()
    from juice.apps.progress import plain_progress

    with plain_progress() as progress:
        options = dict(out=out, validation_limit=validation, test_limit=test, decode_only=args.decode_only,
                       progress=progress)
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
