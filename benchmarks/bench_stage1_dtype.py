"""Stage 1 in float32 against bfloat16 on the CPU (issue 89, item 2): the exact Stage 1 (paper
Alg. 2-3, `scoring="exact"`) of `juice identify` on World Capital's D, filtered for the model, run
once per dtype, each in a process of its own (its time and peak memory its own), and how far the
two agree: the K heads selected per sign, the sign of every head's score per conflict type (what
Alg. 3's filter reads), the largest score difference, and the rank correlation of the summed scores.

Each dtype's heads file is written as soon as its Stage 1 ends (`<out>/heads-<dtype>.json`, with
its time and memory beside it), and a run skips a dtype whose file is there: a killed run resumes
at the prompt it was in (each prompt's scores are saved as they are computed, in
`<out>/state-<dtype>/units.json`), and the two dtypes can run on different machines (copy the files
into one `--out`). The record is written when both are there. `--reference RUN` takes float32's Stage 1
from a `juice reproduce` run's folder instead (its `heads.json`, the same exact Stage 1 on the same
D, resumable per prompt), so the reference is computed once, by the run that needs it anyway.

Run (the record committed under benchmarks/results/):
    python benchmarks/bench_stage1_dtype.py --model qwen2.5-coder-1.5b --threads 1 \
        --out stage1-dtype-qwen --record benchmarks/results/stage1-dtype-qwen2.5-coder-1.5b.json
    # float32 from a protocol run instead of a Stage 1 of its own:
    python benchmarks/bench_stage1_dtype.py --model qwen2.5-coder-1.5b --out stage1-dtype-qwen \
        --reference qwen-output --record benchmarks/results/stage1-dtype-qwen2.5-coder-1.5b.json
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import git_state  # noqa: E402

DTYPES = ("bfloat16", "float32")


def _child(model: str, dtype: str, out: Path, threads: int) -> None:
    """One dtype's Stage 1 in this process: writes `heads-<dtype>.json` and `cost-<dtype>.json`."""
    import resource

    import torch

    from juice.io import StageFiles, UnitCheckpoint, write_json_atomic
    from juice.models import load_model
    from juice.pipeline.run import ReproduceConfig
    from juice.pipeline.stages import identify_on_domain
    from juice.stage1 import save_heads

    torch.set_num_threads(threads)
    started = time.perf_counter()
    lm = load_model(model, dtype=getattr(torch, dtype), device="cpu")
    lm.model   # a deferred model loads its weights here
    loaded = time.perf_counter()
    cfg = ReproduceConfig(model=model, dtype=dtype, scoring="exact", device="cpu")
    state = out / f"state-{dtype}"
    artifact = identify_on_domain(lm, cfg, StageFiles(state), command="bench_stage1_dtype",
                                  checkpoint=UnitCheckpoint(state / "units.json", lm.fingerprint()))
    done = time.perf_counter()
    save_heads(artifact, out / f"heads-{dtype}.json")
    write_json_atomic(out / f"cost-{dtype}.json", {
        "load_s": round(loaded - started, 1), "stage1_s": round(done - loaded, 1), "threads": threads,
        "rows": artifact.data.get("rows"), "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)})


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    for rank, i in enumerate(order):
        ranks[i] = float(rank)
    return ranks


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation of two equally long lists (ties broken by position)."""
    ra, rb = _ranks(a), _ranks(b)
    n = len(a)
    mean = (n - 1) / 2
    cov = sum((x - mean) * (y - mean) for x, y in zip(ra, rb))
    var = sum((x - mean) ** 2 for x in ra)
    return cov / var


def reference_run(folder: Path) -> tuple[dict, dict]:
    """float32's heads file and cost from a `juice reproduce` run's folder: its `heads.json` and
    the Stage 1 time of its `results.json` (None until the run has finished)."""
    heads = json.loads((folder / "heads.json").read_text(encoding="utf-8"))
    results = folder / "results.json"
    timings = json.loads(results.read_text(encoding="utf-8"))["timings_s"] if results.is_file() else {}
    return heads, {"from": str(folder), "stage1_s": timings.get("stage1_heads"), "dtype": "float32"}


def agreement(reference: dict, other: dict) -> dict:
    """How far `other`'s heads file (bfloat16) agrees with `reference`'s (float32): per sign the
    selected heads (same set, overlap), every head's per-type score sign (as Alg. 3's filter
    reads it: non-negative or not), the largest absolute score difference, and the Spearman
    correlation of the summed scores over all heads."""
    out: dict = {"same_head_set": reference["head_set"] == other["head_set"]}   # the same D, else not comparable
    for sign, key in (("positive", "positive_heads"), ("negative", "negative_heads")):
        ref, oth = reference["scores"][sign], other["scores"][sign]
        heads = sorted(ref)
        pairs = [(ref[h][t], oth[h][t]) for h in heads for t in ref[h]]
        flips = sum((a >= 0) != (b >= 0) for a, b in pairs)
        kept_ref = {h for h in heads if all(v >= 0 for v in ref[h].values())}
        kept_oth = {h for h in heads if all(v >= 0 for v in oth[h].values())}
        out[sign] = {
            "selected_float32": reference[key], "selected_bfloat16": other[key],
            "same_selection": set(reference[key]) == set(other[key]),
            "same_order": reference[key] == other[key],
            "overlap": len(set(reference[key]) & set(other[key])), "k": len(reference[key]),
            "scores": len(pairs), "sign_flips": flips,
            "kept_by_filter": {"float32": len(kept_ref), "bfloat16": len(kept_oth),
                               "differ": len(kept_ref ^ kept_oth)},
            "max_abs_diff": round(max(abs(a - b) for a, b in pairs), 6),
            "spearman_summed": round(spearman([sum(ref[h].values()) for h in heads],
                                              [sum(oth[h].values()) for h in heads]), 4),
        }
    return out


def agreement_markdown(record: dict) -> str:
    """What docs/models.md states of a record: per sign, whether the two dtypes select the same K
    heads in the same order, the sign flips among the scores, the heads the filter keeps in each and
    how many differ, and the rank correlation of the summed scores; then which weights the float32
    arm ran on, read from the record's fingerprint (:func:`weights_sentence`)."""
    rows = ["| sign | heads selected (float32) | bfloat16 selects | scores changing sign | kept by the filter, "
            "float32 / bfloat16 (differ) | Spearman, summed scores |", "|---|---|---|---|---|---|"]
    for sign in ("positive", "negative"):
        a = record["agreement"][sign]
        same = ("the same, in the same order" if a["same_order"] else "the same, in another order"
                if a["same_selection"] else f"{a['overlap']} of {a['k']}")
        kept = a["kept_by_filter"]
        rows.append(f"| {sign} | {', '.join(a['selected_float32'])} | {same} | {a['sign_flips']} of {a['scores']} | "
                    f"{kept['float32']} / {kept['bfloat16']} ({kept['differ']}) | {a['spearman_summed']} |")
    return "\n".join(rows) + "\n\n" + weights_sentence(record["fingerprint"]) + "\n"


def weights_sentence(fingerprint: dict) -> str:
    """Which weights a float32 run had, from its fingerprint: where the exact checksum equals the
    bfloat16 one, the weights were already rounded to bfloat16 (juice 0.4.0 cached a GGUF's
    conversion at the dtype of the model's first load; :data:`juice.models.CONVERSION_DTYPE`)."""
    from juice.models import rounded_to_bfloat16

    if not rounded_to_bfloat16(fingerprint):
        return "The float32 arm ran on the GGUF's weights dequantized at float32."
    return ("Both arms ran on the GGUF's weights rounded to bfloat16 (the fingerprint's exact and bfloat16 "
            f"checksums are both `{fingerprint['weights_sha256_16']}`): juice 0.4.0 cached the conversion "
            "at the dtype of the model's first load, here bfloat16's. So the comparison measures the "
            "arithmetic's precision, not the rounding of the weights (a conversion cached today is "
            "float32, whatever the first load asks).")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--out", type=Path, default=Path("stage1-dtype"))
    parser.add_argument("--threads", type=int, default=1, help="torch threads per Stage 1 (1 leaves a core free)")
    parser.add_argument("--record", type=Path, default=None)
    parser.add_argument("--reference", type=Path, default=None,
                        help="a juice reproduce run's folder (float32): its heads.json is float32's Stage 1")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.model, args.child, args.out, args.threads)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    source = git_state()
    dtypes = [d for d in DTYPES if not (args.reference and d == "float32")]
    for dtype in dtypes:   # bfloat16 first: the faster one gives its answer first
        if (args.out / f"heads-{dtype}.json").is_file():
            print(f"{dtype}: done before, kept", flush=True)
            continue
        print(f"{dtype}: Stage 1 on World Capital's D ...", flush=True)
        subprocess.run([sys.executable, __file__, "--model", args.model, "--out", str(args.out),
                        "--threads", str(args.threads), "--child", dtype], check=True)
    heads = {d: json.loads((args.out / f"heads-{d}.json").read_text()) for d in dtypes}
    cost = {d: json.loads((args.out / f"cost-{d}.json").read_text()) for d in dtypes}
    if args.reference:
        heads["float32"], cost["float32"] = reference_run(args.reference)
    import torch
    import transformers

    record = {"command": "python " + " ".join(sys.argv), **source, "date": time.strftime("%Y-%m-%d"),
              "machine": {"cpus": len(__import__("os").sched_getaffinity(0)), "processor": platform.processor()},
              "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
              "model": args.model, "fingerprint": heads["float32"]["model"],
              "head_set": heads["float32"]["data"], "alphas": {"positive": heads["float32"]["alphas_positive"],
                                                               "negative": heads["float32"]["alphas_negative"]},
              "cost": cost, "agreement": agreement(heads["float32"], heads["bfloat16"])}
    print(json.dumps(record["agreement"], indent=1), flush=True)
    if args.record:
        from juice.io import write_json_atomic

        write_json_atomic(args.record, record)
        print(f"wrote {args.record}")


if __name__ == "__main__":
    main()
