"""`juice serve` under load and faults, through the official `openai` client (and raw HTTP where
the client hides what is measured).

Cases, each on one in-process server (uvicorn in a thread), greedy decoding, a mix of Original,
JuICE and JuNE steering:

1. one at a time: `--requests` short requests (`--short` new tokens) sent by one client: p50 /
   p95 latency (the reference of the ratios below).
2. head of line: one long request (`--long` new tokens), then, once it has started, 8 short
   requests: their p50 against case 1's (target <= 2x: a short request must not wait for the
   long one to finish) and against the same 8 sent without the long one (what batching itself
   costs on this machine); the long request's own latency.
3. concurrency: 32 and 64 clients (`--clients`), one short request each: p50 / p95, requests/s,
   generated tokens/s; every reply equal to the one-at-a-time reply of the same request.
4. a client that goes away: a streaming request of `--long` tokens whose client closes the
   connection after the first chunk, then 32 concurrent short requests: their p50 against case
   3's (a cancelled stream must stop costing).
5. a burst past the queue: `--burst` requests at once against a server started with
   `max_queued` = `--queue` (`juice serve --max-queued`): answered (200), refused (429 with
   Retry-After) and anything else (must be 0); every 200 equal to its one-at-a-time reply,
   no reply id twice.

    python benchmarks/bench_server.py                          # embedded Gemma 3 270M
    python benchmarks/bench_server.py --model tiny --long 300  # random tiny llama, seconds

The numbers are wall-clock on this machine; read the ratios (measured in the same run), not the
seconds, when other jobs share the cores. Heads: `--heads FILE`, else the heads of the README's
Table 1 run on Gemma 3 270M (the selection only matters for what is computed, not for speed).
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import http.client
import openai
import uvicorn

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "tests" / d) for d in ("", "unit", "integration")]

from juice.apps.server import create_app  # noqa: E402
from juice.interventions import Head, HeadSelection  # noqa: E402
from juice.models import load_model  # noqa: E402
from juice.stage1 import HeadsArtifact, load_heads  # noqa: E402

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


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma-3-270m", help="model alias/path, or 'tiny' (random llama)")
    ap.add_argument("--heads", type=Path, default=None)
    ap.add_argument("--requests", type=int, default=6, help="one-at-a-time requests (case 1)")
    ap.add_argument("--short", type=int, default=16, help="new tokens of a short request")
    ap.add_argument("--long", type=int, default=200, help="new tokens of the long request (cases 2, 4)")
    ap.add_argument("--clients", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--burst", type=int, default=48, help="requests sent at once in case 5")
    ap.add_argument("--queue", type=int, default=16, help="the server's max_queued in case 5")
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

    def start(**limits):
        try:   # an older server (before its limits) runs case 5 without a queue limit
            from juice.apps.openai_schema import ServerLimits

            app = create_app(lm, [artifact], model_name="m", limits=ServerLimits(**limits))
        except ImportError:
            app = create_app(lm, [artifact], model_name="m")
        server, port = serve(app)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=900)
        return app, server, port, client

    app, server, port, client = start()
    jobs = [(PROMPTS[i % len(PROMPTS)], STEERINGS[i % len(STEERINGS)]) for i in range(max(args.clients + [64]))]

    def ask(i: int, max_tokens: int | None = None) -> tuple[float, str | None, int]:
        prompt, steering = jobs[i]
        t0 = time.perf_counter()
        try:
            out = client.completions.create(model="m", prompt=prompt, max_tokens=max_tokens or args.short,
                                            temperature=0, extra_body={"juice": steering})
            text = out.choices[0].text
            used = out.usage.completion_tokens if out.usage else len(lm.tokenizer(text, add_special_tokens=False).input_ids)
            return time.perf_counter() - t0, text, used
        except Exception as err:   # counted as failed
            print(f"request {i} failed: {type(err).__name__}: {err}", file=sys.stderr)
            return time.perf_counter() - t0, None, 0

    print(f"model {lm.name}; short requests {args.short} new tokens, long {args.long}; greedy; steerings "
          f"{', '.join(s['method'] for s in STEERINGS)}")
    ask(0)   # warm-up
    # 1. one at a time
    alone = {i: ask(i) for i in range(max(args.clients + [64]))}
    lat1 = [alone[i][0] for i in range(args.requests)]
    p50_alone = statistics.median(lat1)
    print(f"1. one at a time ({args.requests} requests): p50 {p50_alone:6.2f} s  p95 {pct(lat1, 0.95):6.2f} s")

    # 2. head of line (the reference: the same 8 short requests without the long one)
    with ThreadPoolExecutor(8) as pool:
        eight = list(pool.map(ask, range(2, 10)))
    p50_eight = statistics.median(r[0] for r in eight)
    long_result = {}
    long_thread = threading.Thread(target=lambda: long_result.update(r=ask(1, args.long)))
    long_thread.start()
    time.sleep(max(0.5, 2 * p50_alone / args.short))   # the long request is decoding
    with ThreadPoolExecutor(8) as pool:
        short = list(pool.map(ask, range(2, 10)))
    long_thread.join()
    p50_hol = statistics.median(r[0] for r in short)
    print(f"2. head of line: 8 short requests beside one of {args.long} tokens: p50 {p50_hol:6.2f} s "
          f"= {p50_hol / p50_alone:.2f}x one alone (target <= 2x), {p50_hol / p50_eight:.2f}x the 8 without the long "
          f"one (p50 {p50_eight:.2f} s); the long one {long_result['r'][0]:.2f} s; "
          f"replies differing from alone: {sum(r[1] != alone[i][1] for i, r in zip(range(2, 10), short))}")

    # 3. concurrency
    p50_conc = {}
    for n in args.clients:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(n) as pool:
            together = list(pool.map(ask, range(n)))
        wall = time.perf_counter() - t0
        lat = [r[0] for r in together]
        p50_conc[n] = statistics.median(lat)
        print(f"3. {n:3d} concurrent clients: p50 {p50_conc[n]:6.2f} s  p95 {pct(lat, 0.95):6.2f} s  "
              f"{n / wall:6.2f} req/s  {sum(r[2] for r in together) / wall:7.1f} tokens/s  wall {wall:6.1f} s  "
              f"failed {sum(r[1] is None for r in together)}  differ from alone "
              f"{sum(r[1] != alone[i][1] for i, r in enumerate(together))}")

    # 4. a client that goes away
    body = {"model": "m", "prompt": PROMPTS[0], "max_tokens": args.long, "temperature": 0, "stream": True}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    while not response.readline().startswith(b"data:"):   # the first chunk
        pass
    conn.close()   # the client goes away
    n = args.clients[0]
    with ThreadPoolExecutor(n) as pool:
        after = list(pool.map(ask, range(n)))
    p50_after = statistics.median(r[0] for r in after)
    print(f"4. {n} concurrent clients after a {args.long}-token stream was abandoned: p50 {p50_after:6.2f} s "
          f"= {p50_after / p50_conc[n]:.2f}x case 3")
    server.should_exit = True

    # 5. a burst past the queue
    app, server, port, client = start(max_queued=args.queue)
    codes: list[tuple[int, str | None, str | None, str | None, int]] = []

    def raw(i: int) -> None:
        prompt, steering = jobs[i % len(jobs)]
        body = {"model": "m", "prompt": prompt, "max_tokens": args.short, "temperature": 0, "juice": steering}
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        data = json.loads(r.read())
        conn.close()
        codes.append((r.status, data.get("id"), (data.get("choices") or [{}])[0].get("text"),
                      r.getheader("retry-after"), i))
        if r.status not in (200, 429):
            print(f"burst request {i}: {r.status} {json.dumps(data)[:200]}", file=sys.stderr)

    with ThreadPoolExecutor(args.burst) as pool:
        list(pool.map(raw, range(args.burst)))
    server.should_exit = True
    ok = [c for c in codes if c[0] == 200]
    refused = [c for c in codes if c[0] == 429]
    print(f"5. burst of {args.burst} against max_queued {args.queue}: {len(ok)} answered, {len(refused)} refused "
          f"(429; Retry-After on {sum(c[3] is not None for c in refused)}), "
          f"{len(codes) - len(ok) - len(refused)} other, {len(ok) - len({c[1] for c in ok})} duplicate ids, "
          f"{sum(c[2] != alone[c[4] % len(jobs)][1] for c in ok)} answers differing from alone")


if __name__ == "__main__":
    main()
