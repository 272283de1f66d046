"""juice verified on a GPU in one run (issue 48): a JSON record of the machine, the engine's tests on
the device under two attention implementations, batched = one at a time and cached = uncached in
fp32 and bf16 with the batching guard's decisions, and the speed ratios against their targets.

Sections (each written to the record as soon as it is done, so a run stopped at its time limit
keeps what it finished):

1. `env`: `nvidia-smi`, Python, torch (and its CUDA), transformers, juice's commit.
2. `tests`: pytest on the engine, steering, baselines, sampling, auto and server tests
   (:data:`TEST_FILES`), the tiny random models of all 13 architectures on the device
   (`JUICE_TEST_DEVICE`), once with sdpa and once with eager attention (`JUICE_TEST_ATTENTION`),
   fp32 (the tests' own tolerances); passed / failed / skipped per architecture.
3. `checks`: per architecture x attention (sdpa, eager; Gemma 2 always eager) x dtype (fp32,
   bf16), six streams (Original, JuNE, JuICE over prompts of different lengths) decoded in one
   padded batch and one at a time (batched = alone), and each against the no-cache reference that
   re-runs the whole sequence every step, JuICE as the paper's Alg. 1 with hooks (run 1 saves the
   heads' outputs, run 2 adds beta times them: cached = uncached and JuICE's second run = the hook
   arithmetic). Tolerances from the dtype, the batching guard's (:mod:`juice.guard`): fp32 every
   token equal and first-step probabilities within 1e-5; bf16 probabilities within 5e-2 and at
   most one stream of six with other tokens (a near-tie flipped by rounding). The guard runs with
   `JUICE_BATCH_CHECK=always` on the same batch and its decision is logged (verified, fell back
   to eager, or refused).
4. `bench`: `benchmarks/bench_gpu.py`'s decoding ratios (plain juice / HF `generate` <= 1.0x,
   JuICE / plain <= 1.1x) at batch 1, 16 and 64, exact Stage 1 head scores per second and batched
   evaluation rows per second, for Gemma 3 270M's config and Gemma 2B's (random weights, bf16).

Writes `OUT/gpu-check.json` and a short `OUT/gpu-check.md`. `--device cpu --quick` checks the
script on a machine without a GPU (smaller batches, no Gemma 2B). Exit status 0 when every
section ran (failures are in the record), 1 when a section could not run.

Run (GPU machine, after `bash scripts/gpu-wheels.sh` here): `bash benchmarks/gpu_check.sh OUT`;
here: `python benchmarks/gpu_check.py OUT --device cpu --quick`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
import traceback
import warnings
import xml.etree.ElementTree as ET
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks"), *(str(ROOT / "tests" / d) for d in ("", "unit", "integration"))]

TEST_FILES = tuple(f"tests/integration/test_{m}.py" for m in (
    "engine_batch", "engine_session", "static_cache", "steering", "interventions", "baselines", "sampling", "auto",
    "guard", "server"))
"""The engine, steering, baselines and server tests run on the device."""

ATTENTIONS = ("sdpa", "eager")
TOLERANCE = {"fp32": (1e-5, 0), "bf16": (5e-2, 1)}
"""dtype -> (first-step probability tolerance, streams of six allowed other tokens)."""


def _write(out: Path, record: dict) -> None:
    tmp = out / "gpu-check.json.tmp"
    tmp.write_text(json.dumps(record, indent=1, default=str) + "\n", encoding="utf-8")
    tmp.replace(out / "gpu-check.json")


def environment(device: str) -> dict:
    import transformers

    env = {"python": platform.python_version(), "platform": platform.platform(), "torch": torch.__version__,
           "torch_cuda": torch.version.cuda, "transformers": transformers.__version__, "device": device}
    try:
        env["juice_commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                                             text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        env["juice_commit"] = None
    if torch.cuda.is_available() and device.startswith("cuda"):
        env["gpu"] = torch.cuda.get_device_name(0)
    try:
        env["nvidia_smi"] = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as err:
        env["nvidia_smi"] = f"not available: {err}"
    return env


def _architecture(name: str, known: list[str]) -> str:
    """The tiny architecture a test id names in its parameters (e.g. `test_x[gemma2-3]`), else "-"."""
    params = name.partition("[")[2].rstrip("]")
    for part in re.split(r"[-,]", params):
        if part in known:
            return part
    return "-"


def run_tests(device: str, attention: str, out: Path, timeout: int, files=TEST_FILES) -> dict:
    """pytest on `files` (:data:`TEST_FILES`) under one attention implementation; counts per
    architecture."""
    from conftest import TINY_CONFIGS

    xml = out / f"pytest-{attention}.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow",
           f"--junitxml={xml}", *files]
    try:
        import xdist  # noqa: F401  (the GPU image has pytest-xdist: the tiny models are launch-bound)

        cmd[5:5] = ["-n", "4"]
    except ImportError:
        pass
    env = dict(os.environ, JUICE_TEST_DEVICE=device, JUICE_TEST_ATTENTION=attention)
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        tail, rc = (done.stdout + done.stderr)[-3000:], done.returncode
    except subprocess.TimeoutExpired as err:
        tail, rc = f"timed out after {timeout} s: {str(err.stdout or '')[-2000:]}", None
    result = {"attention": attention, "returncode": rc, "seconds": round(time.perf_counter() - start, 1),
              "output_tail": tail, "per_architecture": {}, "failed": []}
    if xml.exists():
        known = sorted(TINY_CONFIGS)
        for case in ET.parse(xml).getroot().iter("testcase"):
            name = case.get("name", "")
            arch = _architecture(name, known)
            verdict = ("failed" if case.find("failure") is not None or case.find("error") is not None else
                       "skipped" if case.find("skipped") is not None else "passed")
            counts = result["per_architecture"].setdefault(arch, {"passed": 0, "failed": 0, "skipped": 0})
            counts[verdict] += 1
            if verdict == "failed":
                node = case.find("failure") if case.find("failure") is not None else case.find("error")
                result["failed"].append({"test": f"{case.get('classname')}::{name}",
                                         "message": (node.get("message") or "")[:300]})
        xml.unlink()
    return result


def _tiny(model_type: str, device: str, dtype: torch.dtype, attention: str):
    """conftest's tiny model (same seed, drawn in fp32 on the CPU), on `device` in `dtype`."""
    from conftest import build_tiny

    return build_tiny(model_type, device=device, dtype=dtype, attention=attention)


PROMPTS = ["the capital of france is paris . the capital of france is", "tennis golf w40 w41 w42 is",
           "the official language of germany is", "w7 w8 w9 w10 w11 w12 w13 w14 w15 w16 w17 w18 the"]


def check_one(model_type: str, device: str, dtype_name: str, attention: str, new: int = 6) -> dict:
    """Batched = alone, cached = uncached (JuICE by Alg. 1 with hooks), and the guard's decision,
    for one tiny architecture (module docstring, section 3)."""
    from juice import guard
    from juice.engine import Stream, generate
    from juice.interventions import Head, HeadSelection
    from juice.reference import greedy_generate_naive
    from juice.steering import ORIGINAL, JuICE, JuNE

    dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32
    lm = _tiny(model_type, device, dtype, attention)
    last = lm.heads.geometry.n_layers - 1
    sel = HeadSelection((Head(last, 0), Head(0, 1)), (Head(1, 1),))
    steerings = [ORIGINAL, JuNE(lm, sel, 1.5, -0.5), JuICE(lm, sel, 2.0, -1.0)]
    streams = [Stream(i % len(PROMPTS), steerings[i % 3]) for i in range(6)]
    probes = torch.tensor([[5, 7]] * len(streams))
    tol, allowed = TOLERANCE[dtype_name]
    os.environ["JUICE_BATCH_CHECK"] = "off"   # the comparison itself first, unguarded
    batched = generate(lm, PROMPTS, streams, new, probe_tokens=probes)
    alone = [generate(lm, PROMPTS, [s], new, probe_tokens=probes[:1]) for s in streams]
    naive = [greedy_generate_naive(lm, PROMPTS[s.prompt], new, s.steering) for s in streams]
    token_diff = [k for k, a in enumerate(alone) if not torch.equal(batched.tokens[k].cpu(), a.tokens[0].cpu())]
    prob_diff = max(float((batched.first_probs[k].float().cpu() - a.first_probs[0].float().cpu()).abs().max())
                    for k, a in enumerate(alone))
    uncached_diff = [k for k, (a, n) in enumerate(zip(alone, naive)) if not torch.equal(a.tokens[0].cpu(), n.cpu())]
    juice_rows = [k for k, s in enumerate(streams) if s.steering.method == "juice"]
    guard.forget_verifications()
    os.environ["JUICE_BATCH_CHECK"] = "always"
    decision, message = "verified", ""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            generate(lm, PROMPTS, streams, new, probe_tokens=probes)
        except guard.BatchingMismatchError as err:
            decision, message = "refused", str(err)[:300]
    fell_back = [str(w.message)[:300] for w in caught if "one-at-a-time" in str(w.message)]
    if fell_back and decision == "verified":
        decision, message = "fell back to eager", fell_back[0]
    if decision == "verified" and guard.combination(lm) not in guard._verified:
        decision = "not checked"
    os.environ["JUICE_BATCH_CHECK"] = "auto"
    ok = (len(token_diff) <= allowed and prob_diff <= tol and len(uncached_diff) <= allowed)
    return {"architecture": model_type, "attention": "eager" if model_type == "gemma2" else attention,
            "dtype": dtype_name, "passed": ok, "streams": len(streams),
            "batched_vs_alone_token_mismatches": token_diff, "batched_vs_alone_max_prob_diff": prob_diff,
            "cached_vs_uncached_token_mismatches": uncached_diff,
            "juice_second_run_vs_hooks_mismatches": [k for k in uncached_diff if k in juice_rows],
            "tolerance": {"prob": tol, "streams_with_other_tokens": allowed},
            "guard": decision, "guard_message": message}


def run_checks(device: str) -> list[dict]:
    from conftest import TINY_CONFIGS

    rows = []
    for dtype_name in ("fp32", "bf16"):
        for attention in ATTENTIONS:
            for model_type in sorted(TINY_CONFIGS):
                if model_type == "gemma2" and attention == "sdpa":
                    continue   # always eager (its sdpa path drops the soft-capping): checked once
                try:
                    rows.append(check_one(model_type, device, dtype_name, attention))
                except Exception as err:   # recorded, and the next combination goes on
                    rows.append({"architecture": model_type, "attention": attention, "dtype": dtype_name,
                                 "passed": False, "error": f"{type(err).__name__}: {err}"[:500],
                                 "traceback": traceback.format_exc()[-1500:]})
    return rows


def run_bench(device: str, quick: bool) -> list[dict]:
    import bench_gpu

    out = []
    configs = ("gemma-3-270m",) if quick else ("gemma-3-270m", "gemma-2b")
    batches = [1, 4] if quick else [1, 16, 64]
    new = 4 if quick else 32
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    for name in configs:
        entry: dict = {"config": name, "dtype": str(dtype).replace("torch.", ""), "new_tokens": new}
        try:
            lm = bench_gpu.config_model(name, device, dtype)
            paths = ("dynamic", "static") if quick else ("dynamic", "static", "compiled")
            entry["decoding"] = bench_gpu.decoding(lm, batches, new, paths, emit=lambda s: print(s, flush=True))
            entry["stage1"] = bench_gpu.stage1_rate(lm, 1 if quick else 4)
            entry["evaluation"] = bench_gpu.evaluation_rate(lm, 2 if quick else 16, batches)
            del lm
        except Exception as err:
            entry["error"] = f"{type(err).__name__}: {err}"[:500]
            entry["traceback"] = traceback.format_exc()[-1500:]
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
        out.append(entry)
    return out


def summary(record: dict) -> str:
    """The record as a short Markdown page (device, versions, checks, ratios)."""
    env = record.get("env", {})
    lines = [f"# GPU check {record.get('started', '')}", "",
             f"Device {env.get('gpu', env.get('device'))}; Python {env.get('python')}, torch {env.get('torch')} "
             f"(CUDA {env.get('torch_cuda')}), transformers {env.get('transformers')}; juice {env.get('juice_commit')}.", ""]
    for t in record.get("tests", []):
        counts = t.get("per_architecture", {})
        total = {k: sum(c[k] for c in counts.values()) for k in ("passed", "failed", "skipped")}
        lines.append(f"- tests, {t['attention']}: {total['passed']} passed, {total['failed']} failed, "
                     f"{total['skipped']} skipped ({t['seconds']} s, rc {t['returncode']})"
                     + "".join(f"\n  - failed: {f['test']}" for f in t.get("failed", [])[:20]))
    checks = record.get("checks", [])
    if checks:
        lines += ["", "| dtype | attention | passed | failed | guard fired on |", "|---|---|---|---|---|"]
        for dtype in ("fp32", "bf16"):
            for attention in ATTENTIONS:
                rows = [c for c in checks if c["dtype"] == dtype and c["attention"] == attention]
                fired = [c["architecture"] for c in rows if c.get("guard") not in ("verified", None)]
                lines.append(f"| {dtype} | {attention} | {sum(c['passed'] for c in rows)} | "
                             f"{sum(not c['passed'] for c in rows)} "
                             f"({', '.join(c['architecture'] for c in rows if not c['passed']) or '-'}) | "
                             f"{', '.join(fired) or 'none'} |")
    for b in record.get("bench", []):
        lines += ["", f"{b['config']} ({b['dtype']}, {b['new_tokens']} new tokens):"]
        if "error" in b:
            lines.append(f"- error: {b['error']}")
        for d in b.get("decoding", []):
            lines.append(f"- batch {d['batch']}, {d['path']}: plain/HF {d['plain_over_hf']:.2f}x (target <= 1.0), "
                         f"JuICE/plain {d['juice_over_plain']:.2f}x (target <= 1.1)")
        if "stage1" in b:
            lines.append(f"- exact Stage 1: {b['stage1']['scores_per_s']:.0f} head scores/s")
        for e in b.get("evaluation", []):
            lines.append(f"- evaluation, max_rows {e['max_rows']}: {e['rows_per_s']:.1f} rows/s")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder for gpu-check.json and gpu-check.md")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="small batches, no Gemma 2B (a check of the script)")
    parser.add_argument("--skip", default="", help="comma-separated sections to skip: tests,checks,bench")
    parser.add_argument("--test-timeout", type=int, default=150, help="seconds per pytest run")
    parser.add_argument("--test-files", default=",".join(TEST_FILES), help="comma-separated test files")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here (pass --device cpu to check the script on the CPU)", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    skip = {s for s in args.skip.split(",") if s}
    record: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "quick": args.quick,
                    "env": environment(args.device)}
    _write(args.out, record)
    status = 0
    files = [f for f in args.test_files.split(",") if f]
    sections = [("tests", lambda: [run_tests(args.device, a, args.out, args.test_timeout, files) for a in ATTENTIONS]),
                ("checks", lambda: run_checks(args.device)), ("bench", lambda: run_bench(args.device, args.quick))]
    for name, run in sections:
        if name in skip:
            continue
        start = time.perf_counter()
        print(f"gpu_check: {name} ...", flush=True)
        try:
            record[name] = run()
        except Exception as err:
            record[name + "_error"] = f"{type(err).__name__}: {err}\n{traceback.format_exc()[-2000:]}"
            status = 1
        record.setdefault("seconds", {})[name] = round(time.perf_counter() - start, 1)
        _write(args.out, record)
        (args.out / "gpu-check.md").write_text(summary(record), encoding="utf-8")
    print(summary(record))
    return status


if __name__ == "__main__":
    sys.exit(main())
