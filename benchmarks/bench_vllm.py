"""vLLM with juice's plugin against `juice serve`, same prompts and requests, through the `openai` client.

For each server (`juice serve --engine vllm` with the dual run, the same without it, and `juice
serve`), for 1 / 8 / 32 concurrent clients (`--clients`), each sending `--per-client` requests of
`--tokens` new tokens (greedy), with every request Original, every request JuNE, every request
JuICE, and the three mixed: requests/s, generated tokens/s, p50 / p95 latency, each the median of
`--repeats` runs taken in turn with the other mixes (all runs' tokens/s kept in the JSON). Then the ratios
measured in this run: JuNE/Original and JuICE/Original tokens/s inside vLLM, vLLM+plugin against
`juice serve` at the most clients (mixed), and vLLM's KV-cache capacity (tokens, from its start-up
log) with and without the dual run.

    python benchmarks/bench_vllm.py                    # embedded Gemma 3 270M, about 35 minutes here
    python benchmarks/bench_vllm.py --clients 1 8 --per-client 1 --skip-juice
    python benchmarks/bench_vllm.py --only vllm --reuse bench_vllm.json --out new.json   # re-run one server

vLLM runs from its own environment (`scripts/install-vllm.sh`). vLLM gets `ignore_eos` (every
request decodes `--tokens` tokens); `juice serve` stops at EOS, so its tokens/s counts the tokens
it generated. Heads: the README's Table 1 selection on Gemma 3 270M (`--heads FILE` for another).
Numbers are wall-clock on this machine: read the ratios, not the seconds, when other jobs share it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai

from juice.interventions import Head, HeadSelection
from juice.models import load_model
from juice.stage1 import HeadsArtifact, save_heads
from vllm_targets import verdict

README_HEADS = HeadSelection(tuple(map(Head.parse, "L6H3 L10H0 L8H2 L8H3 L9H3".split())),
                             tuple(map(Head.parse, "L8H0 L3H3 L13H2 L16H3 L10H1".split())))
PROMPTS = [
    "The name of the capital city of France is Beijing. The name of the capital city of France is",
    "The official language of Brazil is Japanese. The official language of Brazil is",
    "Roger Federer is a professional athlete who plays the sport of",
    "The headquarters of Toyota are located in the city of Berlin. The headquarters of Toyota are located in",
    "Question: Who wrote Hamlet?\nAnswer:",
    "The name of the capital city of Japan is",
]
STEERINGS = {"original": {"method": "original"}, "june": {"method": "june", "beta_plus": 1, "beta_minus": -1},
             "juice": {"method": "juice", "beta_plus": 2, "beta_minus": -1}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args: list[str], log: Path, env: dict | None = None) -> tuple[subprocess.Popen, int, float]:
    port = free_port()
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "juice.apps.console", "serve", *args, "--port", str(port)],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return proc, port, time.perf_counter() - started
        except OSError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"server exited: see {log}")
        time.sleep(1)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def load(port: int, model: str, clients: int, per_client: int, tokens: int, mix: str, vllm: bool) -> dict:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=3600)
    kinds = list(STEERINGS) if mix == "mixed" else [mix]

    def one(i: int) -> tuple[float, int]:
        steering = STEERINGS[kinds[i % len(kinds)]]
        extra = {"juice": steering, **({"ignore_eos": True} if vllm else {})}
        t = time.perf_counter()
        reply = client.completions.create(model=model, prompt=PROMPTS[i % len(PROMPTS)], max_tokens=tokens,
                                          temperature=0, extra_body=extra)
        return time.perf_counter() - t, reply.usage.completion_tokens

    def worker(c: int) -> list[tuple[float, int]]:
        return [one(c * per_client + k) for k in range(per_client)]

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = [r for rs in pool.map(worker, range(clients)) for r in rs]
    wall = time.perf_counter() - started
    latencies = [r[0] for r in results]
    generated = sum(r[1] for r in results)
    return {"clients": clients, "mix": mix, "requests": len(results), "wall_s": round(wall, 2),
            "req_per_s": round(len(results) / wall, 3), "tok_per_s": round(generated / wall, 2),
            "p50_s": round(statistics.median(latencies), 2), "p95_s": round(pct(latencies, 0.95), 2),
            "tokens": generated}


def kv_tokens(log: Path) -> int | None:
    found = re.findall(r"KV cache size: ([\d,]+) tokens", log.read_text(errors="replace"))
    return int(found[-1].replace(",", "")) if found else None


def cpu_binding(log: Path) -> str | None:
    """vLLM's CPU build's thread binding, from its start-up log: the cores the model's threads run on
    and those kept for the scheduler."""
    text = log.read_text(errors="replace")
    cores, reserved = re.findall(r"core ids=(\[[\d, ]*\])", text), re.findall(r"reserved_cpus=(\[[\d, ]*\])", text)
    return f"model threads on {cores[-1]}, reserved {reserved[-1] if reserved else '[]'}" if cores else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma-3-270m")
    parser.add_argument("--heads", type=Path)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--per-client", type=int, default=1, help="requests per client (one client: 4x this)")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each row, interleaved; the median is kept")
    parser.add_argument("--skip-juice", action="store_true", help="vLLM only")
    parser.add_argument("--reuse", type=Path, help="an earlier run's JSON: take the servers this run skips from it")
    parser.add_argument("--only", choices=["vllm", "vllm-no-dual-run", "juice"], nargs="+",
                        help="run only these servers (with --reuse for the others' rows)")
    parser.add_argument("--out", type=Path, default=Path("bench_vllm.json"))
    args = parser.parse_args()

    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / "bench_vllm"
    workdir.mkdir(parents=True, exist_ok=True)
    heads = args.heads
    if heads is None:
        lm = load_model(args.model, device="cpu")
        heads = workdir / "heads.json"
        save_heads(HeadsArtifact(lm.fingerprint(), "parametric", 5, [1.0], [-1.0], README_HEADS), heads)
        del lm
    mixes = ["original", "june", "juice", "mixed"]
    report: dict = {"model": args.model, "tokens": args.tokens, "cpu_count": os.cpu_count(), "runs": {}}
    servers = [("vllm", ["--engine", "vllm"]), ("vllm-no-dual-run", ["--engine", "vllm", "--no-dual-run"])]
    if not args.skip_juice:
        servers.append(("juice", []))
    earlier = json.loads(args.reuse.read_text())["runs"] if args.reuse else {}
    for name, extra in servers:
        if args.only and name not in args.only:
            if name in earlier:
                report["runs"][name] = {**earlier[name], "from": str(args.reuse)}
            continue
        log = workdir / f"{name}.log"
        proc, port, up_s = start(["--model", args.model, "--heads", str(heads), "--max-total-tokens", "1024", *extra],
                                 log)
        try:
            vllm = name.startswith("vllm")
            load(port, args.model, 1, 1, 4, "mixed" if name != "vllm-no-dual-run" else "june", vllm)   # warm-up
            rows = []
            for clients in args.clients:
                per_client = args.per_client * (4 if clients == 1 else 1)
                tried: dict[str, list[dict]] = {}
                for _ in range(args.repeats):   # the mixes interleaved, so a slow spell hits them alike
                    for mix in mixes if name != "vllm-no-dual-run" else ["original", "june"]:
                        tried.setdefault(mix, []).append(load(port, args.model, clients, per_client, args.tokens,
                                                              mix, vllm))
                for mix, runs in tried.items():
                    row = sorted(runs, key=lambda r: r["tok_per_s"])[len(runs) // 2]   # the median run
                    row = {**row, "tok_per_s_runs": [r["tok_per_s"] for r in runs]}
                    rows.append(row)
                    print(f"{name:17} clients {clients:3} {mix:9} {row['req_per_s']:7.3f} req/s "
                          f"{row['tok_per_s']:8.2f} tok/s  p50 {row['p50_s']:7.2f} s  p95 {row['p95_s']:7.2f} s  "
                          f"(tok/s of the {len(runs)} runs: {', '.join(f'{t:.1f}' for t in row['tok_per_s_runs'])})",
                          flush=True)
            report["runs"][name] = {"up_s": round(up_s, 1), "kv_cache_tokens": kv_tokens(log) if vllm else None,
                                    "cpu_binding": cpu_binding(log) if vllm else None, "rows": rows}
        finally:
            stop(proc)

    def tps(server: str, clients: int, mix: str) -> float | None:
        rows = report["runs"].get(server, {}).get("rows", [])
        return next((r["tok_per_s"] for r in rows if r["clients"] == clients and r["mix"] == mix), None)

    most = max(args.clients)
    # label -> (numerator, denominator, the ratio's name in vllm_targets.TARGETS or None)
    pairs = {"june/original in vLLM": (("vllm", "june"), ("vllm", "original"), "june / original"),
             "juice/original in vLLM": (("vllm", "juice"), ("vllm", "original"), "juice / original"),
             "original, dual-run server / without": (("vllm", "original"), ("vllm-no-dual-run", "original"), None),
             f"vLLM+plugin / juice serve, {most} clients, mixed": (("vllm", "mixed"), ("juice", "mixed"),
                                                                  "vllm / juice serve"),
             f"vLLM+plugin / juice serve, {most} clients, original": (("vllm", "original"), ("juice", "original"),
                                                                     "vllm / juice serve")}
    report["ratios"], verdicts = {}, {}
    for key, (top, bottom, name) in pairs.items():
        a, b = tps(top[0], most, top[1]), tps(bottom[0], most, bottom[1])
        if a is not None and b is not None:   # a server neither run nor reused has no ratio
            report["ratios"][key] = round(a / b, 3)
            verdicts[key] = verdict(name, most, a / b) if name else ""
    kv = [report["runs"].get(name, {}).get("kv_cache_tokens") for name in ("vllm", "vllm-no-dual-run")]
    report["kv_cache_tokens"] = {"dual run": kv[0], "no dual run": kv[1]}
    print(f"\nratios at {most} clients (targets: benchmarks/vllm_targets.py):")
    for key, value in report["ratios"].items():
        print(f"  {key}: {value:.3f}" + (f"  [{verdicts[key]}]" if verdicts[key] else ""))
    print(f"KV cache (tokens, VLLM_CPU_KVCACHE_SPACE={os.environ.get('VLLM_CPU_KVCACHE_SPACE', '2')} GiB): "
          f"dual run {kv[0]}, without {kv[1]}")
    for name in ("vllm", "vllm-no-dual-run"):
        if report["runs"].get(name, {}).get("cpu_binding"):
            print(f"{name}: {report['runs'][name]['cpu_binding']}")
    args.out.write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
