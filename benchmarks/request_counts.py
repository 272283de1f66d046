"""Registry lookups and steering parses per request on `juice serve` and on vLLM with juice's
plugin (issue 91's count).

`juice serve`: serves a tiny random Llama with a heads file (juice serve's app, in a thread, asked
through the `openai` client) and counts, for one completion request per method, the calls made
while it is answered:
- lookups: `juice.methods.Registry.find` and `Registry.__getitem__` (every way a method's name
  reaches its registry entry);
- scans: the registry listed whole (`Registry.values`, `.items`, iteration: the request
  protocol's vocabularies, `juice.methods.protocol_names` and the like);
- parses: `steering_ask` as the server's admission calls it (the request's `juice` field read
  into a `juice.steering_request.SteeringAsk`).

vLLM (`--vllm`, in vLLM's environment, scripts/install-vllm.sh): the same model and requests
through vLLM's offline `LLM` with the plugin, its engine core and worker in this process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so every call is counted wherever vLLM's processes would
make it. Three roads: `juice serve --engine vllm`'s (the HTTP middleware's check of the body,
:func:`juice.vllm.middleware.check_body`, then vLLM's admission, engine core and worker on the
rewritten `vllm_xargs`), the offline one (:func:`juice.vllm.generate`) and `juice reproduce --engine
vllm`'s (a built steering sent as per-head coefficients, `juice.vllm.engine`, as its offline worker
sends it to the same `LLM`). Parses are
`juice.steering_request.read_steering` calls (the fields read into a steering), split by where
they run: the API process (middleware, admission) and the engine core and worker; the plugin's
resolutions kept from earlier requests (:func:`juice.vllm.options.resolve`) are dropped before
each counted request, so a count is a request whose fields were never seen. The HTTP road is
emulated in-process: the middleware's check of the body, the rewritten body read by vLLM's own
request model (`CompletionRequest`, as its server reads it), and its `vllm_xargs` as the request's
`extra_args`.

Warm-up requests run first, so a count is what a request costs, not the first one's loading.

Run: python benchmarks/request_counts.py [--vllm]
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "tests" / d) for d in ("", "unit", "integration")]

ASKS = {
    "original": {"method": "original"},
    "juice": {"method": "juice", "beta_plus": 2.0, "beta_minus": -1.0},
    "june": {"method": "june", "beta_plus": 2.0, "beta_minus": -1.0},
    "ph3": {"method": "ph3", "heads": ["L0H1"]},
    "no field": None,
}


def counted(owner, name: str, counts: Counter, label) -> None:
    """Replace `owner.name` by a wrapper that adds 1 to `counts[label]` per call (`label`: a key,
    or a function of no argument giving it when the call is made)."""
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        counts[label() if callable(label) else label] += 1
        return original(*args, **kwargs)
    setattr(owner, name, wrapper)


def serve_counts() -> None:
    from conftest import build_tiny
    from helpers.server import serving_client

    import juice
    from juice import methods
    from juice.apps.server import admission, create_app
    from juice.stage1 import HeadsArtifact

    counts: Counter[str] = Counter()
    lm = build_tiny("llama")
    selection = juice.HeadSelection((juice.Head(1, 2),), (juice.Head(0, 1),))
    heads = HeadsArtifact(lm.fingerprint(), "contextual", 1, [1.0], [-1.0], selection)
    counted(methods.Registry, "find", counts, "lookups")
    counted(methods.Registry, "__getitem__", counts, "lookups")
    for scan in ("values", "items", "__iter__"):
        counted(methods.Registry, scan, counts, "scans")
    counted(admission, "steering_ask", counts, "parses")
    rows = []
    with serving_client(create_app(lm, [heads], model_name="tiny")) as client:
        for name, ask in ASKS.items():
            body = {} if ask is None else {"extra_body": {"juice": ask}}
            for warm in (True, False):
                counts.clear()
                client.completions.create(model="tiny", prompt="the capital of france is", max_tokens=2,
                                          temperature=0, **body)
            rows.append((name, counts["lookups"], counts["scans"], counts["parses"]))
    print("| request's juice field | registry lookups by name | registry scans | steering parses |")
    print("|---|---|---|---|")
    for name, lookups, scans, parses in rows:
        print(f"| {name} | {lookups} | {scans} | {parses} |")


def vllm_counts() -> None:
    """The vLLM roads' counts (module docstring): builds the model and heads files here, counts in
    a child in vLLM's environment."""
    from conftest import build_tiny   # noqa: F401  (tests/ on the path: the helpers' imports)
    from helpers.vllm import CONTEXTUAL, tiny_llama_dir, write_heads

    from juice.vllm.launch import find_vllm_python

    python = find_vllm_python(required=True)
    with tempfile.TemporaryDirectory() as tmp:
        lm, folder = tiny_llama_dir(Path(tmp))
        heads = write_heads(Path(tmp) / "contextual.json", lm.fingerprint(), "contextual", CONTEXTUAL,
                            tuned={"juice": {"beta_plus": 1.0, "beta_minus": -1.0},
                                                 "june": {"beta_plus": 1.0, "beta_minus": -1.0}})
        env = {**os.environ, "JUICE_VLLM_HEADS": heads, "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
               "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "ERROR"}
        done = subprocess.run([python, __file__, "--vllm-child", folder], env=env, capture_output=True, text=True,
                              timeout=900)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    print("| road | request's juice field | registry lookups by name | parses in the API process "
          "(middleware + admission) | parses in the engine core and worker |")
    print("|---|---|---|---|---|")
    for road, name, lookups, api, engine in rows:
        print(f"| {road} | {name} | {lookups} | {api} | {engine} |")


def vllm_child(folder: str) -> None:
    """In vLLM's environment: count per request on each road (module docstring); prints JSON rows."""
    import contextvars

    from vllm import LLM, SamplingParams
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    from juice import methods
    from juice.vllm import generate, llm_options, middleware, options, processor

    place = contextvars.ContextVar("place", default="engine")
    counts: Counter[str] = Counter()

    @contextlib.contextmanager
    def in_api():   # what runs in the process that admits requests
        token = place.set("api")
        try:
            yield
        finally:
            place.reset(token)

    def admitting(function):
        def wrapper(*args, **kwargs):
            with in_api():
                return function(*args, **kwargs)
        return wrapper

    counted(options, "read_steering", counts, place.get)   # "api" or "engine"
    counted(methods.Registry, "find", counts, "lookups")
    counted(methods.Registry, "__getitem__", counts, "lookups")
    validate = processor.JuiceSteeringProcessor.validate_params.__func__
    processor.JuiceSteeringProcessor.validate_params = classmethod(admitting(validate))
    options.offline_request = admitting(options.offline_request)   # juice.vllm.generate's check of each prompt

    from juice.architectures import HeadGeometry
    from juice.interventions import Head, HeadSelection
    from juice.steering import ORIGINAL, JuICE, JuNE, Prune
    from juice.vllm.engine import _steering_xargs

    llm = LLM(model=folder, dtype="float32", enforce_eager=True, enable_prefix_caching=False, seed=0,
              max_model_len=64, max_num_seqs=4, **llm_options())
    params = SamplingParams(max_tokens=2, temperature=0)
    geometry, heads = HeadGeometry(4, 4, 32), HeadSelection((Head(2, 1),), (Head(1, 3), Head(2, 3)))
    built = {"original": ORIGINAL, "juice": JuICE(geometry, heads, 2.0, -1.0), "june": JuNE(geometry, heads, 2.0, -1.0),
             "ph3": Prune(geometry, [Head(0, 1)])}
    rows = []
    for name, ask in ASKS.items():
        for road in ("juice serve --engine vllm", "offline", "juice reproduce --engine vllm"):
            if road.startswith("juice reproduce") and name not in built:
                continue
            for _ in (True, False):   # a warm-up request, then the counted one
                counts.clear()
                getattr(options, "_resolved", {}).clear()   # no resolution kept from the warm-up: a new request's cost
                if road == "offline":
                    generate(llm, {"prompt_token_ids": [1, 4, 8, 9], "juice": ask}, params, use_tqdm=False)
                    continue
                if road.startswith("juice reproduce"):   # juice.vllm.engine's offline worker: a built steering sent
                    with in_api():                       # as per-head coefficients (juice/vllm/offline.py)
                        xargs = _steering_xargs(built[name])
                    copy = params.clone()
                    copy.extra_args = xargs
                    llm.generate([{"prompt_token_ids": [1, 4, 8, 9]}], copy, use_tqdm=False)
                    continue
                body = {"prompt": "x", "max_tokens": 2} | ({} if ask is None else {"juice": ask})
                with in_api():
                    middleware.check_body(body)
                rewritten = {"model": folder, **middleware.juice_field_to_xargs(body)}
                xargs = CompletionRequest.model_validate(rewritten).vllm_xargs   # vLLM's request model reads the body
                copy = params.clone()
                copy.extra_args = dict(xargs) if xargs else None
                llm.generate([{"prompt_token_ids": [1, 4, 8, 9]}], copy, use_tqdm=False)
            rows.append([road, name, counts["lookups"], counts["api"], counts["engine"]])
    print(json.dumps(rows))


def main() -> None:
    if "--vllm-child" in sys.argv:
        vllm_child(sys.argv[sys.argv.index("--vllm-child") + 1])
    elif "--vllm" in sys.argv:
        vllm_counts()
    else:
        serve_counts()


if __name__ == "__main__":
    main()
