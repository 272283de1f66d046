"""juice verified on a GPU in one short run (issues 48, 73): a JSON record of the machine, the
engine's invariants on the device, the GPU-marked tests and the speed ratios against their targets,
written after every step so that a run cut short still returns a complete record of what ran.

Sections, in order, each within its share of the time budget (`--budget-s`, default 480 s; a
section's unused time goes to the next; what did not fit is recorded as skipped, never dropped):

1. `env` (no budget): the device, Python, torch and its CUDA, transformers (and where it was
   imported from: the carried wheels or the image), juice's commit and whether the tree was dirty,
   and `requirements`: every requirement of juice's engine, server and tests and of every carried
   wheel, resolved on this Python (:func:`requirements`), so that an incomplete set of carried
   wheels shows as a list of what is missing, not as an ImportError deep in a section.
2. `checks` (30%): the engine's invariants on the device for each of the 13 tiny architectures x
   attention (sdpa, eager; Gemma 2 always eager) x dtype (fp32, bf16), in the order fp32/sdpa,
   bf16/sdpa, fp32/eager, bf16/eager (:func:`check_one`): batched = one at a time (six streams:
   Original, JuNE, JuICE over prompts of different lengths), cached = uncached (the no-cache
   reference that runs JuICE as the paper's Alg. 1 with hooks), scale 0 = plain (zero alphas leave
   the logits bit for bit; JuNE and JuICE at beta 0 decode Original's tokens) and hook = weight
   edit (H <- H + aH by the hook equals scaling the output projection's input columns by 1 + a; paper
   Eq. 1). Tolerances from the dtype (:data:`TOLERANCE`): fp32 every token equal and probabilities
   within 1e-5; bf16 within 5e-2 and at most one stream of six with other tokens (a near-tie
   flipped by rounding). The batching guard's decision on the same batch is logged.
3. `tests` (30%): pytest on the tests marked `gpu` (`-m "gpu and not slow"`), the tiny models of
   every architecture on the device (`JUICE_TEST_DEVICE`) with sdpa, then eager attention
   (`JUICE_TEST_ATTENTION`);
   passed / failed / skipped per architecture, read from pytest's per-test lines so that a run cut
   short still counts what finished.
4. `bench` (40%): on random-weight models shaped like Gemma 2B and Llama 2 7B (bf16; no weights
   travel; :data:`bench_gpu.CONFIGS`), at batch 1 and 32: JuICE step / plain cached step (target
   <= 1.1x), plain juice decoding / Hugging Face `generate` (target <= 1.0x), both per decoding
   path (dynamic and static KV cache; `--compiled` adds the compiled step); and exact Stage 1
   (:func:`juice.readout.intervention_probs`, the growing batch) against one intervention per
   forward (:func:`juice.reference.intervention_probs_naive`) on three layers x every head x the
   paper's alphas (target >= 10x), with the largest probability difference between the two.

`--dry-run` runs every section on the CPU at the smallest size (every check, as they are tiny; the
tests under sdpa on the tiny Llama only; the two bench configs shrunk to a few narrow layers):
every import and code path of the GPU run, in about a minute, with no GPU.
`scripts/gpu-rehearse.sh` runs it on a copy of the GPU node's Python with only the carried wheels.

Writes `OUT/gpu-check.json` and `OUT/gpu-check.md` (and `gpu_check.sh` the log). Exit status 0
when every section ran (failures are in the record), 1 when a section could not run or a
requirement is missing.

Run (GPU machine, after `bash scripts/gpu-wheels.sh` here): `bash benchmarks/gpu_check.sh OUT`;
here: `python benchmarks/gpu_check.py OUT --dry-run`.
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
from pathlib import Path
from typing import Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks"), *(str(ROOT / "tests" / d) for d in ("", "unit", "integration"))]

SHARES = {"checks": 0.3, "tests": 0.3, "bench": 0.4}
"""Each section's share of the time budget (module docstring)."""

ATTENTIONS = ("sdpa", "eager")
DTYPES = ("fp32", "bf16")
TOLERANCE = {"fp32": (1e-5, 0), "bf16": (5e-2, 1)}
"""dtype -> (probability tolerance, streams of six allowed other tokens)."""

TEST_MARKER = "gpu and not slow and not long"
"""The tests the check runs on the device: those marked `gpu` (pyproject.toml's markers)."""

BENCH_CONFIGS = ("gemma-2b", "llama-2-7b")
BENCH_BATCHES = (1, 32)
NODE_EXTRAS = ("server", "vllm", "contexts")
"""juice's extras the GPU-marked tests need beside its core: the server, the `openai` client, and
BM25 for `auto`'s distractor context items."""
TEST_REQUIREMENTS = ("pytest", "hypothesis")


class Budget:
    """Seconds left of the run, and each section's share of them (:data:`SHARES`)."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def section(self, name: str, still: list[str]) -> float:
        """Seconds for section `name` when the sections `still` (it included) have yet to run: its
        share of what is left, so that time a section did not use goes to the ones after it."""
        return max(0.0, self.left()) * SHARES[name] / sum(SHARES[s] for s in still)


def _write(out: Path, record: dict) -> None:
    """The record as JSON and Markdown, each written atomically (a temporary file, then a rename)."""
    for name, text in (("gpu-check.json", json.dumps(record, indent=1, default=str) + "\n"),
                       ("gpu-check.md", summary(record))):
        tmp = out / (name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(out / name)


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def environment(device: str, commit: str | None = None) -> dict:
    """The machine and versions (module docstring, section 1). `commit` overrides `git rev-parse`
    (a device machine gets a copy of the working tree without `.git`)."""
    import transformers

    env = {"python": platform.python_version(), "platform": platform.platform(), "torch": torch.__version__,
           "torch_cuda": torch.version.cuda, "transformers": transformers.__version__,
           "transformers_from": str(Path(transformers.__file__).parent.parent), "device": device,
           "juice_commit": commit or _git("rev-parse", "HEAD")}
    status = _git("status", "--porcelain", "--untracked-files=no")
    env["juice_dirty"] = None if status is None else bool(status)
    if device.startswith("cuda") and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    try:
        env["nvidia_smi"] = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                           timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError) as err:
        env["nvidia_smi"] = f"not available: {err}"
    return env


def requirements(carried: str | None = None) -> dict:
    """Every requirement of juice's core, of its extras in :data:`NODE_EXTRAS` and of pytest and
    hypothesis, followed through each distribution's own requirements, resolved on this Python's
    path (carried wheels first, as `gpu_check.sh` puts them).

    Args:
        carried: the folder the carried wheels were installed into (`gpu_check.sh`'s `--target`),
            to tell which resolved distributions came from there.

    Returns:
        `{"unmet": ["name spec (needed by X): found V | not installed"], "resolved": {name:
        version}, "carried": [names resolved from `carried`], "carried_unused": [carried names
        nothing here requires]}`.
    """
    import importlib.metadata as md
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    todo = [(Requirement(r), "juice") for r in project["dependencies"]]
    todo += [(Requirement(r), f"juice[{e}]") for e in NODE_EXTRAS for r in extras[e]]
    todo += [(Requirement(r), "tests") for r in TEST_REQUIREMENTS]
    resolved: dict[str, str] = {}
    origin: dict[str, str] = {}
    unmet: list[str] = []
    seen: set[tuple[str, str]] = set()
    while todo:
        req, by = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        if (name, str(req.specifier)) in seen:
            continue
        seen.add((name, str(req.specifier)))
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            unmet.append(f"{req.name}{req.specifier} (needed by {by}): not installed")
            continue
        version = dist.version
        if req.specifier and not req.specifier.contains(version, prereleases=True):
            unmet.append(f"{req.name}{req.specifier} (needed by {by}): found {version}")
        if name in resolved:
            continue
        resolved[name] = version
        origin[name] = str(dist.locate_file(""))
        for extra in req.extras:
            todo += [(Requirement(r), f"{req.name}[{extra}]") for r in dist.requires or ()
                     if Requirement(r).marker is not None and Requirement(r).marker.evaluate({"extra": extra})]
        todo += [(Requirement(r), req.name) for r in dist.requires or ()]
    out = {"unmet": sorted(set(unmet)), "resolved": dict(sorted(resolved.items()))}
    if carried:
        here = Path(carried).resolve()
        out["carried"] = sorted(n for n, o in origin.items() if Path(o).resolve() == here)
        installed = {canonicalize_name(d.metadata["Name"]) for d in md.distributions(path=[str(here)])}
        out["carried_unused"] = sorted(installed - set(resolved))
    return out


def _architecture(name: str, known: list[str]) -> str:
    """The tiny architecture a test id names in its parameters (e.g. `test_x[gemma2-3]`), else "-"."""
    params = name.partition("[")[2].rstrip("]")
    for part in re.split(r"[-,]", params):
        if part in known:
            return part
    return "-"


_VERDICT = re.compile(r"(?:\[gw\d+\]\s+(?:\[\s*\d+%\]\s+)?(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\s+(\S+::\S+)"
                      r"|(\S+::\S+)\s+(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b)")
_FAILURE = re.compile(r"^(?:FAILED|ERROR) (\S+::\S+)(?: - (.*))?$", re.M)


def parse_pytest(output: str, known: list[str]) -> tuple[dict, list[dict]]:
    """Per-architecture counts and failures from `pytest -v -rfE` output (with or without
    pytest-xdist), read line by line so that a run stopped at its timeout counts what finished."""
    verdicts: dict[str, str] = {}
    for m in _VERDICT.finditer(output):
        word, node = (m.group(1), m.group(2)) if m.group(1) else (m.group(4), m.group(3))
        verdicts[node] = {"PASSED": "passed", "XFAIL": "passed", "SKIPPED": "skipped"}.get(word, "failed")
    counts: dict[str, dict[str, int]] = {}
    for node, verdict in verdicts.items():
        arch = _architecture(node.rpartition("::")[2], known)
        counts.setdefault(arch, {"passed": 0, "failed": 0, "skipped": 0})[verdict] += 1
    messages = {m.group(1): (m.group(2) or "")[:300] for m in _FAILURE.finditer(output)}
    failed = [{"test": n, "message": messages.get(n, "")} for n, v in verdicts.items() if v == "failed"]
    return counts, failed


def run_tests(device: str, attention: str, timeout: float, architectures: str = "") -> dict:
    """pytest on the GPU-marked tests (:data:`TEST_MARKER`) under one attention implementation, the
    `tiny` fixture over `architectures` (comma-separated; all when empty: `JUICE_TEST_ARCHITECTURES`)."""
    from conftest import TINY_CONFIGS

    cmd = [sys.executable, "-m", "pytest", "-v", "-rfE", "-p", "no:cacheprovider", "-m", TEST_MARKER,
           "tests/integration"]
    try:
        import xdist  # noqa: F401  (where the image has pytest-xdist: the tiny models are launch-bound)

        cmd[4:4] = ["-n", "4"]
    except ImportError:
        pass
    env = dict(os.environ, JUICE_TEST_DEVICE=device, JUICE_TEST_ATTENTION=attention,
               JUICE_TEST_ARCHITECTURES=architectures, COLUMNS="400")   # wide: the summary keeps each message
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=max(1.0, timeout))
        output, rc = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as err:
        output = (err.stdout.decode() if isinstance(err.stdout, bytes) else err.stdout or "")
        rc = f"stopped at its time share ({timeout:.0f} s)"
    counts, failed = parse_pytest(output, sorted(TINY_CONFIGS))
    return {"attention": attention, "returncode": rc, "seconds": round(time.perf_counter() - start, 1),
            "per_architecture": counts, "failed": failed, "output_tail": output[-2500:]}


def _tiny(model_type: str, device: str, dtype: torch.dtype, attention: str):
    """conftest's tiny model (same seed, drawn in fp32 on the CPU), on `device` in `dtype`."""
    from conftest import build_tiny

    return build_tiny(model_type, device=device, dtype=dtype, attention=attention)


PROMPTS = ["the capital of france is paris . the capital of france is", "tennis golf w40 w41 w42 is",
           "the official language of germany is", "w7 w8 w9 w10 w11 w12 w13 w14 w15 w16 w17 w18 the"]


def _last_probs(lm, prompts: list[str], model=None) -> torch.Tensor:
    """`[len(prompts), vocab]` float32 next-token probabilities at each prompt's last position."""
    from juice.tokens import encode

    b = encode(lm.tokenizer, prompts).to(lm.device)
    with torch.no_grad():
        logits = (model or lm.model)(input_ids=b.input_ids, attention_mask=b.attention_mask,
                                     position_ids=b.position_ids).logits
    return logits[:, -1].float().softmax(-1).cpu()


def hook_vs_weight_edit(lm, layer: int, head: int, alpha: float) -> float:
    """Largest next-token probability difference between H <- H + alpha H by the hook and the same
    scaling as an edit of the output projection's input columns (paper Eq. 1), on :data:`PROMPTS`."""
    import copy

    from juice.architectures import ModelHeads
    from juice.interventions import Head, head_coefficients, scaled_heads

    with scaled_heads(lm.heads, head_coefficients(lm.heads.geometry, {Head(layer, head): alpha})):
        hooked = _last_probs(lm, PROMPTS)
    edited = copy.deepcopy(lm.model)
    heads = ModelHeads(edited)
    proj, d = heads.projections[layer], heads.geometry.head_dim
    with torch.no_grad():
        if heads.adapter.weight_layout == "conv1d":
            proj.weight[head * d:(head + 1) * d, :] *= 1 + alpha
        else:
            proj.weight[:, head * d:(head + 1) * d] *= 1 + alpha
    diff = float((hooked - _last_probs(lm, PROMPTS, edited)).abs().max())
    del edited
    return diff


def check_one(model_type: str, device: str, dtype_name: str, attention: str, new: int = 6) -> dict:
    """The engine's four invariants and the guard's decision for one tiny architecture (module
    docstring, section 2)."""
    from juice.engine import guard
    from juice.engine import Stream, generate
    from juice.interventions import Head, HeadSelection, scaled_heads
    from juice.reference import greedy_generate_naive
    from juice.steering import ORIGINAL, JuICE, JuNE

    dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32
    lm = _tiny(model_type, device, dtype, attention)
    g = lm.heads.geometry
    last = g.n_layers - 1
    sel = HeadSelection((Head(last, 0), Head(0, 1)), (Head(1, 1),))
    steerings = [ORIGINAL, JuNE(lm, sel, 1.5, -0.5), JuICE(lm, sel, 2.0, -1.0)]
    streams = [Stream(i % len(PROMPTS), steerings[i % 3]) for i in range(6)]
    probes = torch.tensor([[5, 7]] * len(streams))
    tol, allowed = TOLERANCE[dtype_name]
    previous = os.environ.get("JUICE_BATCH_CHECK")
    os.environ["JUICE_BATCH_CHECK"] = "off"   # the comparisons themselves first, unguarded
    try:
        batched = generate(lm, PROMPTS, streams, new, probe_tokens=probes)
        alone = [generate(lm, PROMPTS, [s], new, probe_tokens=probes[:1]) for s in streams]
        naive = [greedy_generate_naive(lm, PROMPTS[s.prompt], new, s.steering) for s in streams]
        token_diff = [k for k, a in enumerate(alone) if not torch.equal(batched.tokens[k].cpu(), a.tokens[0].cpu())]
        prob_diff = max(float((batched.first_probs[k].float().cpu() - a.first_probs[0].float().cpu()).abs().max())
                        for k, a in enumerate(alone))
        uncached_diff = [k for k, (a, n) in enumerate(zip(alone, naive))
                         if not torch.equal(a.tokens[0].cpu(), n.cpu())]
        juice_rows = [k for k, s in enumerate(streams) if s.steering.dual_run]
        # scale 0 = plain: zero alphas leave the logits bit for bit; beta 0 decodes Original's tokens
        plain_probs = _last_probs(lm, PROMPTS)
        with scaled_heads(lm.heads, torch.zeros(g.n_layers, g.n_heads)):
            zero_alpha_equal = torch.equal(plain_probs, _last_probs(lm, PROMPTS))
        zeros = [ORIGINAL, JuNE(lm, sel, 0.0, 0.0), JuICE(lm, sel, 0.0, 0.0)]
        zero_run = generate(lm, PROMPTS, [Stream(0, s) for s in zeros], new)
        zero_beta_diff = [k for k in (1, 2) if not torch.equal(zero_run.tokens[k].cpu(), zero_run.tokens[0].cpu())]
        weight_edit_diff = max(hook_vs_weight_edit(lm, layer, head, alpha)
                               for layer, head, alpha in ((0, 1, -1.0), (last, 0, 2.5)))
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
    finally:
        if previous is None:
            os.environ.pop("JUICE_BATCH_CHECK", None)
        else:
            os.environ["JUICE_BATCH_CHECK"] = previous
    invariants = {
        "batched_equals_alone": len(token_diff) <= allowed and prob_diff <= tol,
        "cached_equals_uncached": len(uncached_diff) <= allowed,
        "scale_zero_equals_plain": zero_alpha_equal and not zero_beta_diff,
        "hook_equals_weight_edit": weight_edit_diff <= tol,
    }
    return {"architecture": model_type, "attention": "eager" if model_type == "gemma2" else attention,
            "dtype": dtype_name, "passed": all(invariants.values()), "invariants": invariants,
            "streams": len(streams),
            "batched_vs_alone_token_mismatches": token_diff, "batched_vs_alone_max_prob_diff": prob_diff,
            "cached_vs_uncached_token_mismatches": uncached_diff,
            "juice_second_run_vs_hooks_mismatches": [k for k in uncached_diff if k in juice_rows],
            "zero_alphas_logits_equal": zero_alpha_equal, "zero_betas_token_mismatches": zero_beta_diff,
            "hook_vs_weight_edit_max_prob_diff": weight_edit_diff,
            "tolerance": {"prob": tol, "streams_with_other_tokens": allowed},
            "guard": decision, "guard_message": message}


def check_plan() -> list[tuple[str, str, str]]:
    """(dtype, attention, architecture) in the order the checks run (module docstring, section 2)."""
    from conftest import TINY_CONFIGS

    order = [("fp32", "sdpa"), ("bf16", "sdpa"), ("fp32", "eager"), ("bf16", "eager")]
    return [(d, a, m) for d, a in order for m in sorted(TINY_CONFIGS) if not (m == "gemma2" and a == "sdpa")]


def run_checks(device: str, seconds: float, save: Callable[[dict], None]) -> dict:
    """Every check of :func:`check_plan` that starts within `seconds`, the section saved after each."""
    end = time.monotonic() + seconds
    rows: list[dict] = []
    plan = check_plan()
    for dtype_name, attention, model_type in plan:
        if time.monotonic() >= end:
            break
        try:
            rows.append(check_one(model_type, device, dtype_name, attention))
        except Exception as err:   # recorded, and the next combination goes on
            rows.append({"architecture": model_type, "attention": attention, "dtype": dtype_name,
                         "passed": False, "error": f"{type(err).__name__}: {err}"[:500],
                         "traceback": traceback.format_exc()[-1500:]})
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
        save({"rows": rows, "planned": len(plan), "skipped_for_time": len(plan) - len(rows)})
    return {"rows": rows, "planned": len(plan), "skipped_for_time": len(plan) - len(rows)}


def bench_config(name: str, dry_run: bool) -> dict:
    """A bench config's fields (:data:`bench_gpu.CONFIGS`); shrunk to a few narrow layers for a dry
    run (the same model class and code path, the head indices of :data:`bench_gpu.SELECTION` valid)."""
    import bench_gpu

    fields = dict(bench_gpu.CONFIGS[name])
    if dry_run:
        fields.update(num_hidden_layers=11, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                      num_key_value_heads=1, head_dim=16, vocab_size=512)
    return fields


def stage1_ratio(lm, emit=print) -> dict:
    """Exact Stage 1's growing batch against one intervention per forward on one prompt of World
    Capital's D, three layers x every head x the paper's alphas (module docstring, section 4)."""
    import bench_gpu

    from juice.data.paraconflict import build_domain
    from juice.interventions import Head
    from juice.reference import intervention_probs_naive
    from juice.stage1 import ALPHAS_NEGATIVE, ALPHAS_POSITIVE, scoring_prompts
    from juice.readout import intervention_probs

    g = lm.heads.geometry
    prompt = scoring_prompts(lm, build_domain("world_capital")[:1], conflict_types=("substitution",))[0]
    subset = [(Head(layer, h), a) for layer in (0, g.n_layers // 2, g.n_layers - 1) for h in range(g.n_heads)
              for a in (*ALPHAS_POSITIVE, *ALPHAS_NEGATIVE)]

    def once(fn):
        fn()   # warm-up (and, for the first call, the kernels' compilation)
        bench_gpu.sync(lm.device)
        start = time.perf_counter()
        value = fn()
        bench_gpu.sync(lm.device)
        return time.perf_counter() - start, value

    exact, (_, fast) = once(lambda: intervention_probs(lm, prompt.prompt, prompt.target_token, subset))
    naive, (_, slow) = once(lambda: intervention_probs_naive(lm, prompt.prompt, prompt.target_token, subset))
    diff = float((fast.float() - slow.float()).abs().max())
    row = {"interventions": len(subset), "exact_s": exact, "naive_s": naive, "exact_over_naive_speed": naive / exact,
           "max_prob_diff": diff, "target": 10.0}
    emit(f"  exact Stage 1 {naive / exact:.1f}x one intervention per forward [target >= 10x] "
         f"({len(subset)} interventions; max |p difference| {diff:.1e})")
    return row


def run_bench(device: str, seconds: float, dry_run: bool, compiled: bool, save: Callable[[list], None]) -> list[dict]:
    """The speed ratios (module docstring, section 4), each config and batch within `seconds`."""
    import bench_gpu

    end = time.monotonic() + seconds
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    batches = (1, 2) if dry_run else BENCH_BATCHES
    new = 4 if dry_run else 32
    paths = ("dynamic", "static", "compiled") if compiled else ("dynamic", "static")
    out: list[dict] = []
    for name in BENCH_CONFIGS:
        entry: dict = {"config": name, "dtype": str(dtype).replace("torch.", ""), "new_tokens": new,
                       "decoding": [], "skipped_for_time": []}
        out.append(entry)
        if time.monotonic() >= end:
            entry["skipped_for_time"] = ["all"]
            save(out)
            continue
        try:
            start = time.perf_counter()
            lm = bench_gpu.config_model(name, device, dtype, bench_config(name, dry_run))
            model = lm.model
            entry["parameters"] = sum(p.numel() for p in model.parameters())
            entry["build_s"] = round(time.perf_counter() - start, 1)
            for b in batches:
                if time.monotonic() >= end:
                    entry["skipped_for_time"].append(f"decoding at batch {b}")
                    continue
                entry["decoding"] += bench_gpu.decoding(lm, [b], new, paths, emit=lambda s: print(s, flush=True))
                save(out)
            if time.monotonic() < end:
                entry["stage1"] = stage1_ratio(lm, emit=lambda s: print(s, flush=True))
            else:
                entry["skipped_for_time"].append("stage1")
            del lm, model
        except Exception as err:
            entry["error"] = f"{type(err).__name__}: {err}"[:500]
            entry["traceback"] = traceback.format_exc()[-1500:]
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
        save(out)
    return out


def _check_counts(rows: list[dict], dtype: str, attention: str) -> str:
    rows = [c for c in rows if c["dtype"] == dtype and c["attention"] == attention]
    fired = [c["architecture"] for c in rows if c.get("guard") not in ("verified", None)]
    failed = [c["architecture"] + ("" if "invariants" not in c else " (" + ", ".join(
        k for k, v in c["invariants"].items() if not v) + ")") for c in rows if not c["passed"]]
    return (f"| {dtype} | {attention} | {sum(c['passed'] for c in rows)} | {len(failed)} "
            f"({'; '.join(failed) or '-'}) | {', '.join(fired) or 'none'} |")


def summary(record: dict) -> str:
    """The record as a short Markdown page (device, versions, each section's verdicts, the ratios)."""
    env = record.get("env", {})
    lines = [f"# GPU check {record.get('started', '')}", "",
             f"Device {env.get('gpu', env.get('device'))}; Python {env.get('python')}, torch {env.get('torch')} "
             f"(CUDA {env.get('torch_cuda')}), transformers {env.get('transformers')}; juice "
             f"{env.get('juice_commit')}{' (dirty tree)' if env.get('juice_dirty') else ''}; "
             f"budget {record.get('budget_s')} s{', dry run' if record.get('dry_run') else ''}.", ""]
    req = record.get("requirements")
    if req is not None:
        lines.append(f"- requirements: {len(req.get('resolved', {}))} resolved, "
                     f"{len(req.get('carried', []))} from the carried wheels, "
                     + (f"missing: {'; '.join(req['unmet'])}" if req.get("unmet") else "none missing"))
    for name, state in record.get("sections", {}).items():
        lines.append(f"- {name}: {state['status']} ({state.get('seconds', 0)} s of {state.get('share_s', 0)} s)")
    checks = record.get("checks")
    if checks:
        rows = checks["rows"]
        lines += ["", f"Invariants: {sum(c['passed'] for c in rows)} of {len(rows)} checks passed "
                  f"({checks['skipped_for_time']} of {checks['planned']} skipped for time).", "",
                  "| dtype | attention | passed | failed | guard fired on |", "|---|---|---|---|---|"]
        lines += [_check_counts(rows, d, a) for d in DTYPES for a in ATTENTIONS
                  if any(c["dtype"] == d and c["attention"] == a for c in rows)]
    for t in record.get("tests", []):
        counts = t.get("per_architecture", {})
        total = {k: sum(c[k] for c in counts.values()) for k in ("passed", "failed", "skipped")}
        lines.append(f"\n- tests, {t['attention']}: {total['passed']} passed, {total['failed']} failed, "
                     f"{total['skipped']} skipped ({t['seconds']} s, rc {t['returncode']})"
                     + "".join(f"\n  - failed: {f['test']}" for f in t.get("failed", [])[:20]))
    for b in record.get("bench", []):
        lines += ["", f"{b['config']} ({b.get('parameters', 0) / 1e9:.3g} B parameters, {b['dtype']}, "
                  f"{b['new_tokens']} new tokens):"]
        if "error" in b:
            lines.append(f"- error: {b['error']}")
        for d in b.get("decoding", []):
            lines.append(f"- batch {d['batch']}, {d['path']}: plain/HF {d['plain_over_hf']:.2f}x (target <= 1.0), "
                         f"JuICE/plain {d['juice_over_plain']:.2f}x (target <= 1.1)")
        if "stage1" in b:
            s = b["stage1"]
            lines.append(f"- exact Stage 1: {s['exact_over_naive_speed']:.1f}x one intervention per forward "
                         f"(target >= 10; {s['interventions']} interventions, max |p difference| "
                         f"{s['max_prob_diff']:.1e})")
        if b.get("skipped_for_time"):
            lines.append(f"- skipped for time: {', '.join(b['skipped_for_time'])}")
    return "\n".join(lines) + "\n"


NO_RECORD = "No GPU record of juice's engine is committed yet"
"""What docs/models.md says while `benchmarks/results/` holds no `gpu-check-*.json`."""


def page_markdown(record: dict, name: str) -> str:
    """What docs/models.md's GPU section quotes of the newest committed record `name` (a test keeps
    them equal): where it came from, then :func:`summary` without its title."""
    env = record.get("env", {})
    return (f"The newest GPU record, `benchmarks/results/{name}`, from juice {str(env.get('juice_commit'))[:12]} "
            f"on {env.get('gpu', env.get('device'))}:\n\n" + summary(record).split("\n", 2)[2])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder for gpu-check.json and gpu-check.md")
    parser.add_argument("--device", default=None, help="default cuda (cpu with --dry-run)")
    parser.add_argument("--budget-s", type=float, default=480.0, help="seconds for the three sections together")
    parser.add_argument("--dry-run", action="store_true", help="every section on the CPU at the smallest size")
    parser.add_argument("--skip", default="", help="comma-separated sections to skip: checks,tests,bench")
    parser.add_argument("--compiled", action="store_true", help="also time the compiled decoding step")
    parser.add_argument("--commit", default=os.environ.get("JUICE_COMMIT"),
                        help="juice's commit, where the tree has no .git (default $JUICE_COMMIT, else git)")
    args = parser.parse_args(argv)
    device = args.device or ("cpu" if args.dry_run else "cuda")
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here (--dry-run checks the script on the CPU)", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    skip = {s for s in args.skip.split(",") if s}
    budget = Budget(args.budget_s)
    record: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "dry_run": args.dry_run,
                    "budget_s": args.budget_s, "env": environment(device, args.commit),
                    "requirements": requirements(os.environ.get("JUICE_CARRIED_SITE")), "sections": {}}
    status = 1 if record["requirements"]["unmet"] else 0
    _write(args.out, record)
    todo = [s for s in SHARES if s not in skip]
    for name in todo:
        share = budget.section(name, todo[todo.index(name):])
        start = time.perf_counter()
        record["sections"][name] = {"status": "running", "share_s": round(share)}
        print(f"gpu_check: {name} ({share:.0f} s) ...", flush=True)

        def save(part, name=name):
            record[name] = part
            record["sections"][name]["seconds"] = round(time.perf_counter() - start, 1)
            _write(args.out, record)

        try:
            if name == "checks":
                save(run_checks(device, share, save))
            elif name == "tests":
                attentions = ATTENTIONS[:1] if args.dry_run else ATTENTIONS
                runs: list[dict] = []
                for k, attention in enumerate(attentions):
                    runs.append(run_tests(device, attention, (share - (time.perf_counter() - start))
                                          / (len(attentions) - k), "llama" if args.dry_run else ""))
                    save(runs)
            else:
                save(run_bench(device, share, args.dry_run, args.compiled, save))
            record["sections"][name]["status"] = "done"
        except Exception as err:
            record["sections"][name]["status"] = f"error: {type(err).__name__}: {err}"[:300]
            record[name + "_traceback"] = traceback.format_exc()[-2000:]
            status = 1
        record["sections"][name]["seconds"] = round(time.perf_counter() - start, 1)
        _write(args.out, record)
    print(summary(record))
    return status


if __name__ == "__main__":
    sys.exit(main())
