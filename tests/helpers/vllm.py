"""vLLM in the tests: whether its environment is here (:func:`needs_vllm`), the heads files the
tests steer with, a tiny model vLLM's CPU build takes, vLLM run in a subprocess against juice's own
`generate` (:func:`equality_case`), and a local Ray head. vLLM runs in its own environment
(`scripts/install-vllm.sh`); nothing here imports it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch

from juice.engine import Stream, generate
from juice.interventions import Head, HeadSelection
from juice.stage1.heads_file import HeadsArtifact, save_heads
from juice.steering import ORIGINAL, JuICE, JuNE, Prune
from juice.tokens import token_ids
from juice.vllm.launch import find_vllm_python


HERE = Path(__file__).resolve().parents[1]
"""The tests folder (its `vllm_env` holds the scripts vLLM's Python runs)."""
VLLM_PYTHON = find_vllm_python(required=False)
"""The Python of vLLM's environment (:func:`juice.vllm.launch.find_vllm_python`), or None."""
_skip_without_vllm = pytest.mark.skipif(VLLM_PYTHON is None, reason="no vLLM environment (run scripts/install-vllm.sh, "
                                                                   "or set JUICE_VLLM_PYTHON)")


def needs_vllm(test):
    """Runs vLLM in a subprocess (the slow tier, marker `vllm`); skips without vLLM's environment."""
    return pytest.mark.vllm(_skip_without_vllm(test))


PARAMETRIC = HeadSelection((Head(1, 0), Head(2, 3)), (Head(1, 2),))
"""The heads of the vLLM tests' parametric heads files (models of 4 heads per layer, 3 layers or more)."""
CONTEXTUAL = HeadSelection((Head(2, 1),), (Head(1, 3), Head(2, 3)))
"""The heads of the vLLM tests' contextual heads files."""


def write_heads(path: Path, model: dict, direction: str, selection: HeadSelection, tuned: dict | None = None) -> str:
    """Save a heads file of `selection` for `model` (its fingerprint) at `path`; return the path."""
    save_heads(HeadsArtifact(model, direction, len(selection.positive), [1.0], [-1.0], selection,
                             tuned=tuned or {}), path)
    return str(path)


def steering_for(lm, files: dict[str, HeadSelection], juice: dict | None):
    """The steering a request's `juice` field asks of `lm`, with `files` the heads of each direction."""
    if juice is None or juice["method"] == "original":
        return ORIGINAL
    if juice["method"] == "ph3":
        return Prune(lm, [Head.parse(h) for h in juice["heads"]])
    make = JuICE if juice["method"] == "juice" else JuNE
    return make(lm, files[juice["direction"]], juice.get("beta_plus", 2.0), juice.get("beta_minus", 0.0))


def run_vllm(model_dir: str, requests: list[dict], heads_files: list[str], tmp_path: Path, bad=(), llm=None,
             timeout: int = 900, fails: bool = False, env: dict | None = None, modes=("mixed", "alone"),
             arrive=None, heads_in_config: bool = False, poison: int = 0, separate_run1: bool = False) -> dict | str:
    """vLLM with the plugin on `requests` (tests/vllm_env/run_offline.py): its output, or its log if `fails`.
    `separate_run1`: JuICE's run 1 always runs separately, as on a GPU with CUDA graphs."""
    spec = {"model": model_dir, "requests": requests, "bad": list(bad), "llm": llm or {}, "modes": list(modes),
            "arrive": arrive, "heads_in_config": heads_in_config, "poison": poison, "separate_run1": separate_run1}
    (tmp_path / "in.json").write_text(json.dumps(spec))
    env = {**os.environ, "JUICE_VLLM_HEADS": os.pathsep.join(heads_files), "VLLM_CPU_KVCACHE_SPACE": "1",
           "VLLM_LOGGING_LEVEL": "WARNING", **(env or {})}
    ranks = (llm or {}).get("tensor_parallel_size", 1)
    if ranks > 1:   # vllm-cpu binds each rank's threads to its NUMA node; one node here: one core per rank
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(str(i) for i in range(ranks)))
    done = subprocess.run([VLLM_PYTHON, str(HERE / "vllm_env" / "run_offline.py"), str(tmp_path / "in.json"),
                           str(tmp_path / "out.json")], env=env, capture_output=True, text=True, timeout=timeout)
    if fails:   # vLLM refused to start: its log
        assert done.returncode != 0
        return done.stdout + done.stderr
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads((tmp_path / "out.json").read_text())


def reference_requests(lm, prompts: list[str], selections: dict[str, HeadSelection], steerings: list[dict | None],
                       max_tokens: int) -> tuple[list[dict], list[list[int]]]:
    """Each prompt under each steering as a request to vLLM (token ids, `juice` fields, max_tokens),
    and juice's own greedy tokens for them, all in one batch (`generate`)."""
    requests, streams = [], []
    for i, prompt in enumerate(prompts):
        ids = token_ids(lm.tokenizer, prompt)
        for juice in steerings:
            requests.append({"prompt_token_ids": ids, "juice": juice, "max_tokens": max_tokens})
            streams.append(Stream(i, steering_for(lm, selections, juice)))
    return requests, generate(lm, prompts, streams, max_new_tokens=max_tokens).tokens.tolist()


def equality_case(lm, model_dir: str, tmp_path: Path, prompts: list[str], selections: dict[str, HeadSelection],
                  steerings: list[dict | None], max_tokens: int, bad=(), llm: dict | None = None,
                  heads_in_config: bool = False, env: dict | None = None, **run) -> dict:
    """vLLM's tokens for each prompt under each steering beside juice's own (`expected`), and the
    requests; `run` goes to :func:`run_vllm` (modes, poison)."""
    files = [write_heads(tmp_path / f"{d}.json", lm.fingerprint(), d, s) for d, s in selections.items()]
    requests, expected = reference_requests(lm, prompts, selections, steerings, max_tokens)
    out = run_vllm(model_dir, requests, files, tmp_path, bad=bad, llm=llm, heads_in_config=heads_in_config, env=env,
                   **run)
    return {"expected": expected, **out, "requests": requests}


def tiny_llama_dir(tmp_path: Path, model_type: str = "llama"):
    """A tiny random model that vLLM's CPU attention takes (head_dim 32), saved with its tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from conftest import COMMON, make_tokenizer
    from juice.models import wrap_model

    extra = {"head_dim": 32, "sliding_window": 6, "attn_logit_softcapping": 5.0, "final_logit_softcapping": 30.0,
             "query_pre_attn_scalar": 32} if model_type == "gemma2" else {"head_dim": 32} if model_type == "qwen3" else {}
    config = AutoConfig.for_model(model_type, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                                  num_attention_heads=4, num_key_value_heads=2,
                                  **{**COMMON, "initializer_range": 0.3}, **extra)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32,
                                             **({"attn_implementation": "eager"} if model_type == "gemma2" else {}))
    folder = tmp_path / f"tiny-{model_type}"
    model.save_pretrained(folder)
    tokenizer = make_tokenizer()
    tokenizer.save_pretrained(folder)   # vLLM detokenizes with it; the prompts go in as token ids
    return wrap_model(model.eval(), tokenizer, name=str(folder)), str(folder)


RAY_ON_CPU = HERE / "vllm_env" / "ray_on_cpu"
"""A test-only vLLM platform plugin (vLLM's public `vllm.platform_plugins` entry point, found on
`PYTHONPATH`) for the Ray tests on a CPU: vllm-cpu's platform names no Ray resource, so vLLM
refuses its Ray executors there ("current platform cpu does not support ray"). The plugin is
vLLM's CPU platform placing its workers on Ray's "GPU" resource; the models still run on the CPU.
Only the processes of those tests see it."""


@contextlib.contextmanager
def ray_head(ranks: int):
    """A local Ray head started as a separate node would be: from an environment without any
    `JUICE_` variable. Yields the environment a vLLM process needs to use it (its address; on
    vLLM's CPU platform, :data:`RAY_ON_CPU`'s plugin, the head declaring `ranks` "GPU"
    resources); stops it after. Skips where vLLM's environment has no Ray."""
    found = subprocess.run([VLLM_PYTHON, "-c", "import ray; from vllm.platforms import current_platform as p; "
                            "print(p.device_name, p.ray_device_key)"], capture_output=True, text=True)
    if found.returncode:
        pytest.skip("ray is not installed in vLLM's environment (pip install ray there to run this test)")
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")   # Ray's socket paths must stay under 108 bytes
    env, resources = {}, []
    if len(found.stdout.split()) < 2:   # vllm-cpu 0.32: "current platform cpu does not support ray"
        env = {"PYTHONPATH": os.pathsep.join(p for p in (str(RAY_ON_CPU), os.environ.get("PYTHONPATH", "")) if p)}
        resources = ["--num-gpus", str(ranks)]
    env["RAY_AUTH_MODE"] = "disabled"   # a token in ~/.ray (another local Ray made one) would turn auth on, and
    # vLLM's Ray executor then fails to connect
    clean = {**{k: v for k, v in os.environ.items() if not k.startswith("JUICE_")}, **env}
    ray = [VLLM_PYTHON, "-m", "ray.scripts.scripts"]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    started = subprocess.run([*ray, "start", "--head", "--port", port, "--num-cpus", "2", *resources,
                              "--disable-usage-stats", "--include-dashboard=false", "--temp-dir", temp],
                             env=clean, capture_output=True, text=True, timeout=180)
    assert started.returncode == 0, started.stderr[-2000:]
    try:
        yield {**env, "RAY_ADDRESS": f"127.0.0.1:{port}"}
    finally:
        subprocess.run([*ray, "stop", "--force"], env=clean, capture_output=True, timeout=120)
        shutil.rmtree(temp, ignore_errors=True)
