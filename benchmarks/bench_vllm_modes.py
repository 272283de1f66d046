"""juice's vLLM plugin in vLLM's modes: eager and compiled, prefix caching on and off (issue 36).

Offline (`LLM.generate`, one process per configuration, vLLM's own environment), the embedded
Gemma 3 270M, fp32, greedy, `--tokens` new tokens with `ignore_eos`, batches of 1 / 8 / 32
requests (`--batches`; a batch is what 1 / 8 / 32 concurrent clients give the scheduler):

- stock vLLM (the plugin off) against the plugin with no steering, in eager and compiled mode;
- in each mode with the plugin: every request JuNE, every request JuICE, mixed (1 request in 4
  JuICE, the rest Original), and K distinct steerings per batch (K = 1, 4, 16: JuNE at K
  different betas, each its own tables and cache salt), each against Original in the same run;
- a shared-prefix workload (`--prefix-tokens` shared, a distinct tail, 16 new tokens; the batch
  sent once to fill the cache, then timed with new tails) with prefix caching on and off, for
  Original, JuNE and JuICE.

Each row is the median of `--repeats` runs, the mixes interleaved. Ratios are of tokens/s (or of
wall time for the prefix workload) measured in the same run on the same machine; time it on a
quiet machine (NOTES.md: two cores shared with another job moved vLLM's ratios by 1.25-1.8x).

    python benchmarks/bench_vllm_modes.py                 # about 15 minutes on 2 cores
    python benchmarks/bench_vllm_modes.py --batches 8 --repeats 1

"stock" is vLLM with juice installed and the plugin off (no JUICE_VLLM_HEADS, no juice logits
processor or scheduler named): none of juice's code runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

from vllm_targets import TARGETS, target

HERE = Path(__file__).resolve()
MIXES = ["original", "june", "juice", "mixed", "k4", "k16"]
CONFIGS = {
    "stock-eager": {"plugin": False, "llm": {"enforce_eager": True, "enable_prefix_caching": False}},
    "stock-compiled": {"plugin": False, "llm": {"enforce_eager": False, "enable_prefix_caching": True}},
    "plugin-eager": {"plugin": True, "llm": {"enforce_eager": True, "enable_prefix_caching": False}},
    "plugin-compiled": {"plugin": True, "llm": {"enforce_eager": False, "enable_prefix_caching": True}},
    "plugin-compiled-no-prefix-cache": {"plugin": True, "prefix_only": True,
                                        "llm": {"enforce_eager": False, "enable_prefix_caching": False}},
}


def steering(mix: str, i: int) -> dict | None:
    """Request i's juice fields in a batch of `mix`."""
    if mix == "original":
        return None
    if mix == "june":
        return {"method": "june", "beta_plus": 1, "beta_minus": -1}
    if mix == "juice":
        return {"method": "juice", "beta_plus": 2, "beta_minus": -1}
    if mix == "mixed":
        return {"method": "juice", "beta_plus": 2, "beta_minus": -1} if i % 4 == 0 else None
    k = int(mix[1:])
    return {"method": "june", "beta_plus": 1 + (i % k) / 16, "beta_minus": -1}


# --- the child: one configuration, inside vLLM's environment ---------------------------------------

def child(spec: dict) -> dict:
    from vllm import LLM, SamplingParams

    from juice.vllm import llm_options, offline_request

    started = time.perf_counter()
    llm = LLM(model=spec["folder"], dtype="float32", seed=0, max_model_len=1024, max_num_seqs=32,
              gpu_memory_utilization=0.5, **spec["llm"], **(llm_options() if spec["plugin"] else {}))
    out: dict = {"load_s": round(time.perf_counter() - started, 1), "rows": [], "prefix": []}
    tokenizer = llm.get_tokenizer()

    def run(prompts: list[str], mix: str, tokens: int) -> tuple[float, int]:
        requests = [offline_request(p, steering(mix, i) if spec["plugin"] else None) for i, p in enumerate(prompts)]
        params = [SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True, extra_args=e or None)
                  for _, e in requests]
        t = time.perf_counter()
        results = llm.generate([r[0] for r in requests], params, use_tqdm=False)
        return time.perf_counter() - t, sum(len(r.outputs[0].token_ids) for r in results)

    run(spec["prompts"][:2], "mixed" if spec["plugin"] else "original", 4)   # warm-up
    mixes = (spec.get("mixes") or MIXES) if spec["plugin"] else ["original"]
    if not spec.get("prefix_only"):
        for batch in spec["batches"]:
            prompts = [spec["prompts"][i % len(spec["prompts"])] for i in range(batch)]
            tried: dict[str, list[float]] = {}
            for _ in range(spec["repeats"]):
                for mix in mixes:
                    wall, made = run(prompts, mix, spec["tokens"])
                    tried.setdefault(mix, []).append(made / wall)
            for mix, runs in tried.items():
                out["rows"].append({"batch": batch, "mix": mix, "tok_per_s": round(statistics.median(runs), 2),
                                    "runs": [round(r, 2) for r in runs]})
                print(f"{spec['name']:32} batch {batch:3} {mix:9} {statistics.median(runs):8.2f} tok/s", flush=True)
    if spec["plugin"] and not spec.get("no_prefix"):   # the shared-prefix workload
        words = " ".join(f"fact {i}: the city number {i} lies on the river {i % 7}." for i in range(200))
        ids = tokenizer.encode(words)[: spec["prefix_tokens"]]
        prefix = tokenizer.decode(ids)
        for mix in ("original", "june", "juice"):
            walls = []
            for r in range(spec["repeats"] + 1):   # the first fills the cache (where it is on)
                prompts = [f"{prefix} Question {r}-{i}: where is city {i}?" for i in range(8)]
                wall, _ = run(prompts, mix, 16)
                if r:
                    walls.append(wall)
            out["prefix"].append({"mix": mix, "wall_s": round(statistics.median(walls), 3),
                                  "runs": [round(w, 3) for w in walls]})
            print(f"{spec['name']:32} shared prefix {mix:9} {statistics.median(walls):7.3f} s", flush=True)
    return out


# --- the driver ------------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma-3-270m")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prefix-tokens", type=int, default=512)
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS),
                        help="in the order given (alternate the order across runs to balance drift)")
    parser.add_argument("--mixes", nargs="+", choices=MIXES, help="the plugin's mixes to time (default: all)")
    parser.add_argument("--no-prefix", action="store_true", help="skip the shared-prefix workload")
    parser.add_argument("--out", type=Path, default=Path("bench_vllm_modes.json"))
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        spec = json.loads(args.child.read_text())
        Path(spec["out"]).write_text(json.dumps(child(spec)))
        return

    from bench_vllm import PROMPTS, README_HEADS   # the server benchmark's heads and prompts

    from juice.models import load_model
    from juice.stage1 import HeadsArtifact, save_heads
    from juice.vllm.launch import find_vllm_python, served_folder, usable_cpus

    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / "bench_vllm_modes"
    workdir.mkdir(parents=True, exist_ok=True)
    lm = load_model(args.model, device="cpu")
    heads = workdir / "heads.json"
    save_heads(HeadsArtifact(lm.fingerprint(), "parametric", 5, [1.0], [-1.0], README_HEADS), heads)
    del lm
    folder, python = served_folder(args.model), find_vllm_python()
    report: dict = {"model": args.model, "tokens": args.tokens, "cpu_count": os.cpu_count(), "configs": {}}
    for name in args.configs:
        config = CONFIGS[name]
        spec = {"name": name, "folder": folder, "prompts": PROMPTS, "plugin": config["plugin"], "llm": config["llm"],
                "prefix_only": config.get("prefix_only", False), "batches": args.batches, "tokens": args.tokens,
                "repeats": args.repeats, "prefix_tokens": args.prefix_tokens, "out": str(workdir / f"{name}.json"),
                "mixes": args.mixes, "no_prefix": args.no_prefix}
        (workdir / f"{name}.in.json").write_text(json.dumps(spec))
        env = {k: v for k, v in os.environ.items() if not k.startswith("JUICE_VLLM")}
        env.update({"VLLM_LOGGING_LEVEL": "WARNING", "VLLM_CPU_KVCACHE_SPACE": env.get("VLLM_CPU_KVCACHE_SPACE", "2")})
        if len(usable_cpus()) < 8 and not {"VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU"} & set(env):
            env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"   # as juice serve --engine vllm: the model on every core
        if config["plugin"]:
            env["JUICE_VLLM_HEADS"] = str(heads)
        done = subprocess.run([python, str(HERE), "--child", str(workdir / f"{name}.in.json")], env=env,
                              stderr=open(workdir / f"{name}.log", "w"))
        if done.returncode:
            raise SystemExit(f"{name} failed: see {workdir / f'{name}.log'}")
        report["configs"][name] = json.loads((workdir / f"{name}.json").read_text())

    def tps(name: str, batch: int, mix: str) -> float | None:
        rows = report["configs"].get(name, {}).get("rows", [])
        return next((r["tok_per_s"] for r in rows if r["batch"] == batch and r["mix"] == mix), None)

    def runs(name: str, batch: int, mix: str) -> list[float]:
        rows = report["configs"].get(name, {}).get("rows", [])
        return next((r["runs"] for r in rows if r["batch"] == batch and r["mix"] == mix), [])

    def spread(a: list[float], b: list[float]) -> list[float] | None:
        """The ratio's run-to-run spread: the extremes of each side's runs paired (low: a's
        slowest over b's fastest; high: a's fastest over b's slowest)."""
        return [round(min(a) / max(b), 3), round(max(a) / min(b), 3)] if a and b else None

    ratios = []
    for batch in args.batches:
        for mode in ("eager", "compiled"):
            plugin, stock = f"plugin-{mode}", f"stock-{mode}"
            pairs = [("original / stock", (plugin, "original"), (stock, "original"))]
            for mix in ("june", "juice", "mixed", "k4", "k16"):
                pairs.append((f"{mix} / original", (plugin, mix), (plugin, "original")))
            for label, top, bottom in pairs:
                a, b = tps(top[0], batch, top[1]), tps(bottom[0], batch, bottom[1])
                if a is not None and b is not None:
                    bound = target(label, batch) if label in TARGETS else None
                    ratios.append({"batch": batch, "mode": mode, "ratio": label, "value": round(a / b, 3),
                                   "spread": spread(runs(top[0], batch, top[1]), runs(bottom[0], batch, bottom[1])),
                                   "target": bound})
    for batch in args.batches:
        a, b = tps("stock-compiled", batch, "original"), tps("stock-eager", batch, "original")
        if a and b:
            ratios.append({"batch": batch, "mode": "stock", "ratio": "compiled / eager", "value": round(a / b, 3),
                           "target": None})
    def prefix_walls(name: str) -> dict[str, float]:
        return {r["mix"]: r["wall_s"] for r in report["configs"].get(name, {}).get("prefix", [])}

    on, off = prefix_walls("plugin-compiled"), prefix_walls("plugin-compiled-no-prefix-cache")
    for mix in on:
        if mix in off:
            ratios.append({"batch": 8, "mode": "compiled", "ratio": f"shared prefix {mix}: time off / on",
                           "value": round(off[mix] / on[mix], 3), "target": 1.0})
    report["ratios"] = ratios
    print("\n| batch | mode | ratio | value | spread (low-high) | target (vllm_targets.py) |\n|---|---|---|---|---|---|")
    for r in ratios:
        if "off / on" in r["ratio"]:
            mark = "> 1, met" if r["value"] > 1 else "> 1, missed"
        else:
            mark = "" if r["target"] is None else f">= {r['target']}, {'met' if r['value'] >= r['target'] else 'missed'}"
        low_high = "" if not r.get("spread") else f"{r['spread'][0]:.3f}-{r['spread'][1]:.3f}"
        print(f"| {r['batch']} | {r['mode']} | {r['ratio']} | {r['value']:.3f} | {low_high} | {mark} |")
    args.out.write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
