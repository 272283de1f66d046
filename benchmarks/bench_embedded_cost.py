"""What an embedded model costs on this machine: assembling its GGUF, the first load (GGUF ->
juice's converted cache), a cached load, and per dtype the peak memory, a forward of a 21-token
prompt, the time per decoded token and the greedy answer on a conflict prompt; with `--agreement`,
the largest difference between float32 and bfloat16 in Stage 1's read-out (the target token's
probability under a head scaled by each alpha) over a few heads of the middle layer.

Each step runs in a fresh process, so its peak resident memory is its own (`ru_maxrss`). The
cached GGUF and conversion are deleted first (`--fresh`) to time the first run as a new user meets it.

Run: python benchmarks/bench_embedded_cost.py --model qwen2.5-coder-1.5b --fresh --agreement \
       --record benchmarks/results/embedded-cost-qwen2.5-coder-1.5b.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

CONFLICT = "The capital of France is Rome. The capital of France is"
PROMPT_21 = "The Eiffel Tower is in Paris, the capital of France. The Colosseum is in Rome, the capital of"


def _child(step: str, model: str, dtype: str) -> dict:
    """One step in this process (module docstring); returns its measurements."""
    import resource

    import torch

    from juice.models import EMBEDDED_MODELS, load_model

    started = time.perf_counter()
    if step == "assemble":
        path = EMBEDDED_MODELS[model][1]()
        return {"seconds": time.perf_counter() - started, "bytes": path.stat().st_size,
                "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    lm = load_model(model, dtype=getattr(torch, dtype), device="cpu")
    lm.model   # a deferred model loads its weights here
    out = {"load_s": time.perf_counter() - started}
    if step == "run":
        from juice.engine import Stream, generate
        from juice.steering import ORIGINAL
        from juice.tokens import token_ids

        ids = torch.tensor([token_ids(lm.tokenizer, PROMPT_21)])
        with torch.inference_mode():
            lm.model(input_ids=ids)   # warm-up
            times = []
            for _ in range(3):
                t = time.perf_counter()
                lm.model(input_ids=ids)
                times.append(time.perf_counter() - t)
        out["prompt_tokens"] = int(ids.shape[1])
        out["forward_s"] = sorted(times)[1]
        t = time.perf_counter()
        gen = generate(lm, [CONFLICT], [Stream(0, ORIGINAL)], max_new_tokens=17)
        out["decode_s_per_token"] = (time.perf_counter() - t) / 17
        out["greedy"] = lm.tokenizer.decode(gen.tokens[0].tolist())
    if step == "agreement":
        from juice.interventions import Head
        from juice.readout import intervention_probs

        g = lm.heads.geometry
        layer = g.n_layers // 2
        interventions = [(Head(layer, h), a) for h in range(min(4, g.n_heads)) for a in (2.0, -1.0)]
        target = lm.tokenizer(" Paris", add_special_tokens=False)["input_ids"][0]
        clean, probs = intervention_probs(lm, CONFLICT, target, interventions)
        out["probs"] = [clean, *(float(p) for p in probs.flatten())]
        out["interventions"] = ["clean", *(f"{h} a={a:+g}" for h, a in interventions)]
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def _run(step: str, model: str, dtype: str = "float32") -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", step, "--model", model, "--dtype", dtype],
                          capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{step} ({dtype}) failed: {done.stderr.strip().splitlines()[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def cost_markdown(record: dict) -> str:
    """The record as docs/models.md shows it (a test keeps the page equal to it)."""
    gib = 1 << 30
    fp32, bf16 = record["float32"], record["bfloat16"]
    rows = [("assemble the GGUF from its parts (once)", f"{record['assemble']['seconds']:.0f} s",
             f"{record['assemble']['bytes'] / gib:.2f} GiB on disk"),
            ("first load: convert the GGUF into juice's cache (once)", f"{record['first_load']['load_s']:.0f} s",
             f"peak {record['first_load']['peak_rss_mib'] / 1024:.1f} GiB; {record['converted_bytes'] / gib:.2f} GiB "
             "on disk"),
            ("a later load and the runs below, float32", f"{fp32['load_s']:.0f} s",
             f"peak {fp32['peak_rss_mib'] / 1024:.1f} GiB"),
            ("a later load and the runs below, bfloat16", f"{bf16['load_s']:.0f} s",
             f"peak {bf16['peak_rss_mib'] / 1024:.1f} GiB"),
            (f"a forward of {fp32['prompt_tokens']} tokens", f"{fp32['forward_s']:.2f} s (bfloat16 "
             f"{bf16['forward_s']:.2f} s)", ""),
            ("a decoded token (greedy, one stream)", f"{fp32['decode_s_per_token']:.2f} s (bfloat16 "
             f"{bf16['decode_s_per_token']:.2f} s)", "")]
    lines = ["| step | time | memory, disk |", "|---|---|---|", *(f"| {a} | {b} | {c} |" for a, b, c in rows)]
    if "agreement" in record:
        lines.append("")
        a = record["agreement"]
        fp32_scores = [p - a["float32"][0] for p in a["float32"][1:]]
        bf16_scores = [p - a["bfloat16"][0] for p in a["bfloat16"][1:]]
        flips = sum((x > 0) != (y > 0) for x, y in zip(fp32_scores, bf16_scores))
        lines.append(f"Stage 1's read-out (the target token's probability, clean and with {len(fp32_scores)} "
                     f"interventions on layer {a['interventions'][1].split('H')[0][1:]}'s heads) differs by up to "
                     f"{a['max_abs_diff']:.4f} between float32 and bfloat16, and {flips} of the {len(fp32_scores)} "
                     "scores (the change from clean) change sign.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--child", default=None)
    parser.add_argument("--fresh", action="store_true", help="delete the cached GGUF and conversion first")
    parser.add_argument("--agreement", action="store_true", help="Stage 1 read-outs, float32 against bfloat16")
    parser.add_argument("--record", type=Path, default=None)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.model, args.dtype)))
        return
    from juice.models import QWEN_GGUF, cache_dir

    record: dict = {"model": args.model, "command": " ".join(["python", "benchmarks/bench_embedded_cost.py",
                                                              *sys.argv[1:]])}
    if args.fresh:
        if args.model == "qwen2.5-coder-1.5b":
            for path in (cache_dir() / "gguf").glob(QWEN_GGUF["file"] + "*"):
                path.unlink()
        shutil.rmtree(cache_dir() / "models" / args.model, ignore_errors=True)
    record["assemble"] = _run("assemble", args.model)
    print("assemble", record["assemble"], flush=True)
    record["first_load"] = _run("load", args.model)
    print("first load (converts)", record["first_load"], flush=True)
    folder = cache_dir() / "models" / args.model
    record["converted_bytes"] = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    for dtype in ("float32", "bfloat16"):
        record[dtype] = _run("run", args.model, dtype)
        print(dtype, record[dtype], flush=True)
    if args.agreement:
        fp32, bf16 = _run("agreement", args.model, "float32"), _run("agreement", args.model, "bfloat16")
        record["agreement"] = {"interventions": fp32["interventions"], "float32": fp32["probs"],
                               "bfloat16": bf16["probs"],
                               "max_abs_diff": max(abs(a - b) for a, b in zip(fp32["probs"], bf16["probs"]))}
        print("agreement", record["agreement"], flush=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                text=True).stdout.strip())
    record.update({"commit": commit, "dirty": dirty, "cpus": len(__import__("os").sched_getaffinity(0))})
    if args.record:
        from juice.io import write_json_atomic

        write_json_atomic(args.record, record)


if __name__ == "__main__":
    main()
