"""`juice serve` under load: N concurrent clients against one-at-a-time serving, through the
official `openai` client.

The same requests (greedy, `max_tokens` new tokens, a mix of Original, JuICE and JuNE steering
on parametric and contextual prompts) are sent twice to one in-process server: first one at a time
by a single client (the reference), then by `--clients` concurrent clients. Prints requests/s and
p50/p95 latency of both, the throughput ratio, the server's batch sizes, and the count of lost or
failed requests (must be 0); also checks that every concurrent reply equals its one-at-a-time
reply (batching must not change outputs).

    python benchmarks/bench_server.py                       # embedded Gemma 3 270M, 8 clients x 4 requests
    python benchmarks/bench_server.py --model tiny --clients 16

Heads: `--heads FILE`, else the heads of the README's Table 1 run on Gemma 3 270M (the selection
only matters for what is computed, not for speed).
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from juice.interventions import HeadSelection
from juice.stage1 import HeadsArtifact, load_heads
from juice.interventions import Head  # noqa: E402
from juice.models import load_model  # noqa: E402
from juice.apps.server import create_app  # noqa: E402

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
STEERINGS = [{"method": "original"}, {"method": "juice", "beta_plus": 2, "beta_minus": -1},
             {"method": "june", "beta_plus": 1, "beta_minus": -1}]


def serve(app) -> tuple[uvicorn.Server, int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.01)
    return server, port


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma-3-270m", help="model alias/path, or 'tiny' (random llama)")
    ap.add_argument("--heads", type=Path, default=None)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=4, help="requests per client")
    ap.add_argument("--max-tokens", type=int, default=16)
    args = ap.parse_args()

    if args.model == "tiny":
        from conftest import build_tiny

        lm = build_tiny("llama")
        selection = HeadSelection((Head(1, 2),), (Head(0, 1),))
    else:
        lm = load_model(args.model)
        selection = README_HEADS
    artifact = load_heads(args.heads, lm) if args.heads else HeadsArtifact(
        lm.fingerprint(), "parametric", 5, [], [], selection)
    app = create_app(lm, [artifact], model_name="m")
    server, port = serve(app)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=600)

    n = args.clients * args.requests
    jobs = [(PROMPTS[i % len(PROMPTS)], STEERINGS[i % len(STEERINGS)]) for i in range(n)]

    def ask(i: int) -> tuple[float, str | None]:
        prompt, steering = jobs[i]
        start = time.perf_counter()
        try:
            out = client.completions.create(model="m", prompt=prompt, max_tokens=args.max_tokens, temperature=0,
                                            extra_body={"juice": steering})
            return time.perf_counter() - start, out.choices[0].text
        except Exception as err:   # counted as failed
            print(f"request {i} failed: {type(err).__name__}: {err}", file=sys.stderr)
            return time.perf_counter() - start, None

    ask(0)   # warm-up (first forward, the runtime guard)
    start = time.perf_counter()
    alone = [ask(i) for i in range(n)]
    t_alone = time.perf_counter() - start
    before = len(app.state.engine.batch_sizes)
    start = time.perf_counter()
    with ThreadPoolExecutor(args.clients) as pool:
        together = list(pool.map(ask, range(n)))
    t_together = time.perf_counter() - start
    sizes = app.state.engine.batch_sizes[before:]
    server.should_exit = True

    def summary(name: str, runs, seconds: float) -> str:
        lat = sorted(r[0] for r in runs)
        p95 = lat[min(len(lat) - 1, round(0.95 * (len(lat) - 1)))]
        return (f"{name:<26} {n / seconds:6.2f} req/s  p50 {statistics.median(lat):6.2f} s  p95 {p95:6.2f} s  "
                f"wall {seconds:6.1f} s")

    failed = sum(r[1] is None for r in alone + together)
    differ = sum(a[1] != b[1] for a, b in zip(alone, together) if a[1] is not None and b[1] is not None)
    print(f"model {lm.name}, {n} requests ({args.clients} clients x {args.requests}), max_tokens {args.max_tokens}, "
          f"greedy, steerings {', '.join(s['method'] for s in STEERINGS)}")
    print(summary("one at a time", alone, t_alone))
    print(summary(f"{args.clients} concurrent clients", together, t_together))
    print(f"throughput ratio (concurrent / one at a time): {t_alone / t_together:.2f}x")
    print(f"server batches while concurrent: {len(sizes)}, sizes {sizes}")
    print(f"lost or failed requests: {failed}; concurrent replies that differ from one-at-a-time: {differ}")


if __name__ == "__main__":
    main()
