"""juice's vLLM plugin checked on a GPU in one run (issue 65): each way a user can start vLLM's graphs
and compilation, refused in one line or serving juice's own tokens; PIECEWISE CUDA graphs with
every decode step replayed; the pieces vLLM split the steered model into; the host read of a mixed
batch's run 1 timed.

Sections, each written to the record as soon as it is done:

1. `env`: `nvidia-smi`, vLLM's and torch's versions, juice's commit.
2. `runs`: for each of :data:`CONFIGS` (vLLM's default FULL_AND_PIECEWISE, juice serve's
   PIECEWISE, compilation off by `TORCH_COMPILE_DISABLE=1` and by `-cc.mode=none`, breakable graphs,
   `VLLM_BATCH_INVARIANT=1` in bf16, stock torch.compile, DYNAMO_TRACE_ONCE, Inductor's graph
   partition, `--enforce-eager`; the settings and verdicts of the unit test that checks vLLM's
   own engine configurations), vLLM started offline with the plugin on a tiny random Llama
   (tests/vllm_env/run_offline.py): refused (the plugin's line) or the greedy tokens of Original,
   JuNE, JuICE and pruning requests, mixed in one batch and each alone, against juice's `generate`
   of the same model. Expected: :data:`CONFIGS`' verdict.
3. `piecewise`: juice serve's PIECEWISE with capture sizes up to the batch and a small
   `max_num_batched_tokens`, so that every decode step replays captured pieces; the record of
   `run_offline.py`'s JUICE_TEST_RECORD (the pieces, forwards, run 1's calls, CUDA graph replays,
   the seconds spent building run 1's sub-batch of a mixed batch, its host read included).
4. :data:`BACKEND_RUNS`: PIECEWISE in bf16 with the TRITON_ATTN and FLASH_ATTN attention backends
   under `VLLM_LOGGING_LEVEL=DEBUG` (vLLM then checks each replay's captured input addresses).

Writes `OUT/gpu-check-vllm.json` and `OUT/gpu-check-vllm.md`. Needs a Python with vLLM 0.32's
CUDA build and juice (`VLLM_PYTHON`, default the running one); the device machines lent to this
project have neither vLLM nor its torch (vLLM 0.32's wheel is 326 MB and pins torch 2.13; a call
carries 64 MiB), so the GPU run waits for a machine that has them: `pip install vllm==0.32.0` and
`pip install -e .` there, then `bash benchmarks/gpu_check_vllm.sh OUT` (about 5 minutes on one
H100: ten vLLM starts of a tiny model).

`--dry-run` (any machine with vLLM's CPU build): prints what the GPU run would start, and runs what
a CPU can: juice's reference tokens, vLLM's engine configuration for every config as an H100
builds it with juice's verdict (tests/vllm_env/gpu_engine_configs.py), the eager run's tokens
against the reference, and the piecewise compilation's pieces (vLLM's split on its CPU build,
JUICE_TEST_PIECEWISE_ON_CPU). Exit status 0 when every check passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / d) for d in ("", "unit", "integration", "slow")]

STEERINGS = [None, {"method": "june", "direction": "parametric", "beta_plus": 2.0, "beta_minus": -1.0},
             {"method": "juice", "direction": "parametric", "beta_plus": 2.0, "beta_minus": -1.0},
             {"method": "juice", "direction": "contextual", "beta_plus": 3.0, "beta_minus": 0.0},
             {"method": "ph3", "heads": ["L1H1", "L2H0"]}]
PROMPTS = ["the capital of france is paris", "who wrote the book ? answer :", "japan tokyo spain"]
MAX_TOKENS = 12
PIECEWISE = {"cudagraph_mode": "PIECEWISE"}
BASE = {"enforce_eager": False, "enable_prefix_caching": True, "block_size": 32}

GPU_RUNS = ("vLLM's default (FULL_AND_PIECEWISE)", "juice serve's PIECEWISE", "TORCH_COMPILE_DISABLE=1",
            "-cc.mode=none", "-cc.mode=none, PIECEWISE (vLLM: no graphs)", "VLLM_USE_BREAKABLE_CUDAGRAPH=1",
            "VLLM_BATCH_INVARIANT=1 under juice serve's environment", "-cc.mode=1", "-cc.mode=2",
            "Inductor graph partition", "--enforce-eager")
"""The settings of tests/unit/test_vllm_constraints.py's `GPU_SETTINGS` (environment, vLLM's
arguments, juice's verdict) that the GPU run starts."""


def _configs() -> dict[str, tuple[dict, dict, str]]:
    from test_vllm_constraints import GPU_SETTINGS

    return {name: (env, args, "equal" if refusal is None else "refused")
            for name, (env, args, refusal) in GPU_SETTINGS.items() if name in GPU_RUNS}


CONFIGS = _configs()
"""name: (environment, LLM keywords, what should happen: "refused" or "equal"). The bf16 run's
tokens are compared with juice's fp32 `generate` and may differ by rounding: other tokens there
count as served."""

REPLAYED = {"compilation_config": {**PIECEWISE, "cudagraph_capture_sizes": [1, 2, 4, 8, 16]},
            "max_num_batched_tokens": 64, "max_num_seqs": 16}
"""The PIECEWISE run in which every decode step (at most 15 requests) replays captured pieces."""

BACKEND_RUNS = {f"juice serve's PIECEWISE, bf16, {backend}, VLLM_LOGGING_LEVEL=DEBUG": (
    {"VLLM_LOGGING_LEVEL": "DEBUG"},
    {**BASE, "compilation_config": PIECEWISE, "dtype": "bfloat16", "attention_backend": backend})
    for backend in ("TRITON_ATTN", "FLASH_ATTN")}
"""Issue 74: the two attention backends a GPU serves juice's default (the model's dtype) with, under
vLLM's debug logging, in which vLLM asserts that a replayed graph's captured input addresses are
unchanged (the plugin's tables stay at fixed addresses)."""

REFUSAL = re.compile(r"PluginConfigError: (juice's vLLM plugin[^\n]*)")


def _python() -> str:
    """The Python that runs vLLM: `VLLM_PYTHON`, else juice's (:func:`juice.vllm.launch.find_vllm_python`:
    `JUICE_VLLM_PYTHON`, the checkout's `.venv-vllm`, or this one where it imports vLLM)."""
    from juice.vllm.launch import find_vllm_python

    return os.environ.get("VLLM_PYTHON") or find_vllm_python(required=False) or sys.executable


def model_and_reference(tmp: Path) -> dict:
    """The tiny Llama, its heads files and juice's own greedy tokens (mixed batch) for
    :data:`PROMPTS` x :data:`STEERINGS`."""
    from helpers.vllm import CONTEXTUAL, PARAMETRIC, reference_requests, tiny_llama_dir, write_heads

    lm, folder = tiny_llama_dir(tmp)
    selections = {"parametric": PARAMETRIC, "contextual": CONTEXTUAL}
    files = [write_heads(tmp / f"{d}.json", lm.fingerprint(), d, s) for d, s in selections.items()]
    requests, expected = reference_requests(lm, PROMPTS, selections, STEERINGS, MAX_TOKENS)
    return {"folder": folder, "files": files, "requests": requests, "expected": expected}


def start(case: dict, tmp: Path, env: dict, llm: dict, modes=("mixed", "alone"), timeout: int = 600) -> dict:
    """vLLM with the plugin through tests/vllm_env/run_offline.py: {"refused": line} or its output.
    vLLM's piecewise compilation on the CPU (JUICE_TEST_PIECEWISE_ON_CPU, the dry run) captures no
    CUDA graph, so there JuICE's run 1 is made to run separately, as under a GPU's graphs (elsewhere
    the model chooses: shadow rows where no graph replays the forward)."""
    spec = {"model": case["folder"], "requests": case["requests"], "llm": llm, "modes": list(modes),
            "separate_run1": env.get("JUICE_TEST_PIECEWISE_ON_CPU") == "1"}
    (tmp / "in.json").write_text(json.dumps(spec))
    full = {**os.environ, "JUICE_VLLM_HEADS": os.pathsep.join(case["files"]), "VLLM_USE_V2_MODEL_RUNNER": "0",
            "VLLM_LOGGING_LEVEL": "WARNING", **env}
    started = time.perf_counter()
    done = subprocess.run([_python(), str(ROOT / "tests" / "vllm_env" / "run_offline.py"), str(tmp / "in.json"),
                           str(tmp / "out.json")], env=full, capture_output=True, text=True, timeout=timeout)
    seconds = round(time.perf_counter() - started, 1)
    if done.returncode != 0:
        found = REFUSAL.search(done.stderr)
        return {"refused": found.group(1) if found else None, "error": None if found else done.stderr[-2000:],
                "seconds": seconds}
    out = json.loads((tmp / "out.json").read_text())
    return {**out, "seconds": seconds}


def verdict(expected_kind: str, result: dict, reference: list) -> tuple[str, bool]:
    """What happened ("refused", "equal", "served", "other tokens", "error") and whether it is what
    :data:`CONFIGS` expects."""
    if result.get("refused"):
        return "refused", expected_kind == "refused"
    if result.get("error"):
        return "error", False
    same = result.get("mixed") == reference and result.get("alone") == reference
    return ("equal" if same else "other tokens"), expected_kind == "equal" and same


def pieces_text(record: dict) -> list[str]:
    return [f"splitting {'|'.join(ops)}" if splitting else f"compiled  {len(ops)} ops"
            for split in record.get("splits", []) for splitting, ops in split]


def engine_config_verdicts(tmp: Path) -> dict:
    """vLLM's engine configuration for each of :data:`CONFIGS` as an H100 builds it, with juice's
    verdict (tests/vllm_env/gpu_engine_configs.py): what the GPU run will meet, checked on a CPU."""
    from test_vllm_constraints import gpu_engine_configs

    return gpu_engine_configs(_python(), tmp, CONFIGS)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--dry-run", action="store_true", help="on a CPU: the plan and the CPU-possible checks")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="gpu-check-vllm-"))
    record: dict = {"dry_run": args.dry_run, "ok": True}

    def save(section: str, value) -> None:
        record[section] = value
        (args.out / "gpu-check-vllm.json").write_text(json.dumps(record, indent=1))

    env = {"commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                    text=True).stdout.strip()}
    env["versions"] = subprocess.run([_python(), "-c", "import torch, vllm; print(vllm.__version__, torch.__version__,"
                                      " torch.cuda.is_available())"], capture_output=True, text=True).stdout.strip()
    env["nvidia_smi"] = subprocess.run("nvidia-smi -L", shell=True, capture_output=True, text=True).stdout.strip()
    save("env", env)
    case = model_and_reference(tmp)
    lines = [f"# juice's vLLM plugin {'(dry run on a CPU)' if args.dry_run else 'on a GPU'}", "",
             f"commit {env['commit']}; vLLM, torch, CUDA: {env['versions']}; {env['nvidia_smi'] or 'no GPU'}", ""]
    if args.dry_run:
        plan = [{"config": name, "env": e, "llm": {**BASE, **llm}, "expected": kind}
                for name, (e, llm, kind) in CONFIGS.items()]
        plan.append({"config": "PIECEWISE, every decode step replayed", "env": {"JUICE_TEST_RECORD": "1"},
                     "llm": {**BASE, **REPLAYED}, "expected": "equal"})
        save("plan", plan)
        lines += ["## What the GPU run starts", "", "| config | expected |", "|---|---|"]
        lines += [f"| {p['config']} | {p['expected']} |" for p in plan]
        verdicts = engine_config_verdicts(tmp)
        rows = {}
        for name, (_, _, kind) in CONFIGS.items():
            got = verdicts[name]
            agrees = (got["refusal"] is not None) == (kind == "refused")
            rows[name] = {**got, "expected": kind, "agrees": agrees}
            record["ok"] &= agrees
        save("engine_configs", rows)
        lines += ["", "## vLLM's engine configuration as an H100 builds it, and juice's verdict", "",
                  "| config | mode | cudagraph_mode | juice | as expected |", "|---|---|---|---|---|"]
        lines += [f"| {n} | {r['mode']} | {r['cudagraph_mode']} | {'refused' if r['refusal'] else 'passes'} | "
                  f"{'yes' if r['agrees'] else 'NO'} |" for n, r in rows.items()]
        runs = {"eager (CPU)": ({}, {"enforce_eager": True, "enable_prefix_caching": False}),
                "piecewise split (CPU)": ({"JUICE_TEST_PIECEWISE_ON_CPU": "1"}, {"enforce_eager": False,
                                                                               "enable_prefix_caching": False})}
    else:
        runs = {name: (e, {**BASE, **llm}) for name, (e, llm, _) in CONFIGS.items()}
        runs["PIECEWISE, every decode step replayed"] = ({"JUICE_TEST_RECORD": "1"}, {**BASE, **REPLAYED})
        runs.update(BACKEND_RUNS)
    results, pieces = {}, []
    lines += ["", "## Runs", "", "| config | what happened | as expected | seconds |", "|---|---|---|---|"]
    for name, (e, llm) in runs.items():
        result = start(case, tmp, e, llm)
        kind = CONFIGS[name][2] if name in CONFIGS else "equal"
        happened, fine = verdict(kind, result, case["expected"])
        if "bfloat16" in str(llm.get("dtype")) and happened == "other tokens":
            fine = True   # bf16 against juice's fp32: rounding may flip a near-tie
        results[name] = {"happened": happened, "as_expected": fine, **{k: v for k, v in result.items()
                                                                       if k in ("refused", "error", "seconds",
                                                                                "compilation")}}
        record["ok"] &= fine
        save("runs", results)
        lines.append(f"| {name} | {happened} | {'yes' if fine else 'NO'} | {result['seconds']} |")
        compilation = result.get("compilation")
        if compilation:
            run1 = [(s, ops) for split in compilation["splits"] for s, ops in split
                    if any("clean_run" in o for o in ops)]
            split_alone = bool(run1) and all(s and len(ops) == 1 for s, ops in run1)
            counted = compilation["run1"] == compilation["forwards_with_juice"] > 0
            replayed = args.dry_run or compilation["graph_replays"] > 0
            results[name].update(run1_split_alone=split_alone, run1_once_per_juice_forward=counted,
                                 graphs_replayed=replayed)
            record["ok"] &= split_alone and counted and replayed
            save("runs", results)
            mean = compilation["sub_batch_s"] / compilation["sub_batches"] if compilation["sub_batches"] else None
            pieces += ["", f"## {name}: the pieces", "", "```", *pieces_text(compilation), "```", "",
                       f"forwards {compilation['forwards']}, with a JuICE row {compilation['forwards_with_juice']}, "
                       f"run 1's body {compilation['run1']}, CUDA graph replays {compilation['graph_replays']}; "
                       f"run 1's sub-batch of a mixed batch built {compilation['sub_batches']} times, "
                       + (f"{mean * 1e6:.0f} us each (host read included)" if mean else "never")]
    lines += [*pieces, "", f"all as expected: {'yes' if record['ok'] else 'NO'}"]
    (args.out / "gpu-check-vllm.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if record["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
