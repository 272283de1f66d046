"""The paper's pipeline on vLLM (:mod:`juice.vllm.engine`): `reproduce(..., engine=VllmEngine(...))` on a tiny
Llama gives juice's own engine's Table 1, stage by stage (Stage 1's scores to 1e-4, the same heads
in the same order, the same betas, k and pruned heads, every item's output and verdict, every table
cell), on one vLLM engine and scaled out (data parallel 2 in CI; one engine, tensor parallel 2 and
tensor parallel 2 over Ray `long`), and each of the engine's answers against juice's on one server;
a set-up the plugin refuses stops the run in one line; Table 2 on vLLM (`long`). vLLM runs in its own environment (skipped
without it, as tests/slow/test_vllm_runs.py); the refusals that need no vLLM are
tests/integration/test_reproduce_on_vllm_refusals.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from juice.pipeline.run import ReproduceConfig
from juice.experiments.table1 import reproduce
from juice.pipeline.compare import ENGINE_RECORD, compare_files
from juice.vllm.engine import VllmEngine, VllmEngineError

from helpers.data import write_contextual_data  # noqa: E402
from helpers.reproduce import TINY  # noqa: E402
from helpers.vllm import needs_vllm, ray_head, tiny_llama_dir  # noqa: E402

P_TOLERANCE = 1e-4
"""Largest difference of a first-token probability between the engines: vLLM's CPU kernels (oneDNN
matrix products, its own attention) round fp32 differently from PyTorch's; measured up to 8.3e-6
on this tiny model, whose logits are large (initializer range 0.3). Outputs, verdicts, choices and
table cells must be equal."""


@pytest.fixture(scope="module")
def juice_table(tmp_path_factory):
    """The tiny model's folder, its juice-engine run: (lm, folder, results.json, heads.json)."""
    tmp = tmp_path_factory.mktemp("juice-engine")
    lm, folder = tiny_llama_dir(tmp)
    reproduce(ReproduceConfig(model=folder, out_dir=tmp / "out", **TINY), lm=lm)
    return lm, folder, tmp / "out" / "results.json", tmp / "out" / "heads.json"


def _vllm_table(lm, folder: str, out: Path, args: tuple[str, ...], env: dict | None = None, offline: bool = False):
    with VllmEngine(folder, out / "vllm", args, env={"VLLM_CPU_KVCACHE_SPACE": "1", **(env or {})},
                    log=lambda line: None, offline=offline) as engine:
        reproduce(ReproduceConfig(model=folder, out_dir=out, engine="vllm", vllm_args=args, vllm_offline=offline,
                                  **TINY), lm=lm, engine=engine)
    return engine


def _scores(path: Path) -> dict[str, float]:
    scores = json.loads(path.read_text())["scores"]
    return {f"{sign}/{head}/{t}": v for sign in ("positive", "negative")
            for head, by_type in scores[sign].items() for t, v in by_type.items()}


def assert_same_table(juice_results: Path, juice_heads: Path, out: Path) -> None:
    """The vLLM run in `out` against juice's: Stage 1's scores to 1e-4, then everything else."""
    mine, theirs = _scores(juice_heads), _scores(out / "heads.json")
    assert mine.keys() == theirs.keys()
    assert max(abs(mine[k] - theirs[k]) for k in mine) <= 1e-4
    compared = compare_files(juice_results, out / "results.json", p_tolerance=P_TOLERANCE, skip=ENGINE_RECORD)
    assert compared.same, compared.differences[:10]
    assert compared.compared > 1000


SCALE_OUT = {"one engine": (), "offline": (), "data parallel 2": ("--data-parallel-size=2",),
             "tensor parallel 2": ("--tensor-parallel-size=2",),
             "tensor parallel 2 over Ray": ("--tensor-parallel-size=2", "--distributed-executor-backend=ray")}
"""vLLM's ways to run, as `juice reproduce --engine vllm --vllm-arg=...` passes them (eager: the engine's
default on a CPU); "offline": `--vllm-offline`, vLLM's offline `LLM` in a worker process, no server."""


@needs_vllm
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="two engines or ranks on the CPU need a core each")
@pytest.mark.parametrize("scale", [pytest.param("data parallel 2"), pytest.param("offline"),
                                   pytest.param("one engine", marks=pytest.mark.long),
                                   pytest.param("tensor parallel 2", marks=pytest.mark.long),
                                   pytest.param("tensor parallel 2 over Ray", marks=pytest.mark.long)])
def test_reproduce_on_vllm_equals_juices_engine_stage_by_stage(juice_table, tmp_path, scale):
    """The same Table 1 from vLLM on one engine, with data parallelism (two engine cores behind one
    server, vLLM balancing the requests: every value equal means both steer), tensor parallelism
    (each rank steers its heads' slice) and tensor parallelism over Ray (a local head started
    without juice's variables, as another node would be), and offline (no server: vLLM's `LLM` in
    a worker process, so the offline path gives the server path's table). CI runs data parallel 2,
    which covers the one engine's path, and offline; the others are `long` (docs/development.md)."""
    lm, folder, results, heads = juice_table
    env = {"VLLM_CPU_OMP_THREADS_BIND": "0|1"} if "tensor" in scale else {}
    if "Ray" in scale:
        with ray_head(2) as ray_env:
            engine = _vllm_table(lm, folder, tmp_path, SCALE_OUT[scale], {**env, **ray_env})
    else:
        engine = _vllm_table(lm, folder, tmp_path, SCALE_OUT[scale], env, offline=scale == "offline")
    assert_same_table(results, heads, tmp_path)
    record = json.loads((tmp_path / "results.json").read_text())["protocol"]["engine"]
    assert record["name"] == "vllm" and len(record["server_starts_s"]) == 2 == len(engine.starts)   # before and
    # after Stage 1's heads are known
    assert record["transport"] == ("offline" if scale == "offline" else "server")
    assert {record["stages"][s] for s in ("data and filter", "stage 1", "tuning", "evaluation")} == {"vllm"}
    assert record["stages"]["PH3-l"].startswith("juice (path patching")
    assert set(record["rows"].values()) == {"vllm"}
    assert engine.server is None   # stopped on exit


@needs_vllm
@pytest.mark.long
def test_a_set_up_the_plugin_refuses_stops_the_run_in_one_line(juice_table, tmp_path):
    """vLLM's server stops at start with the plugin's refusal (LoRA), and the run with it, in that
    line. `long` for CI's time: the refusals themselves are tested without vLLM
    (tests/unit/test_vllm_constraints.py), the line's extraction in tests/unit/test_vllm_engine.py."""
    lm, folder, *_ = juice_table
    with pytest.raises(VllmEngineError) as err:
        _vllm_table(lm, folder, tmp_path, ("--enable-lora",))
    message = str(err.value)
    assert "\n" not in message and "start vLLM without --enable-lora" in message


@needs_vllm
def test_each_question_the_stages_ask_gets_juices_answer_from_one_server(juice_table, tmp_path):
    """The engine's three answers against juice's engine, on one server: greedy continuations
    with first-step probe probabilities, juice's EOS and the five-word stop (texts cut where juice
    cuts them), teacher-forced log-probabilities (MemoTrap's likelihood comparison), Stage 1's
    probabilities under single-head scalings and PH3's knock-out logit differences."""
    import torch

    from juice.engine import Stream
    from juice.engine.backend import JUICE_ENGINE
    from juice.eval.runner import exact_match_decided
    from juice.interventions import Head, HeadSelection
    from juice.steering import JuNE, Prune

    lm, folder, *_ = juice_table
    prompts = ["the capital of france is paris", "who wrote the book ? answer :", "japan tokyo spain"]
    selection = HeadSelection((Head(1, 0), Head(2, 3)), (Head(1, 2),))
    streams = [Stream(0), Stream(1, JuNE(lm, selection, 2.0, -1.0)), Stream(2, Prune(lm, [Head(3, 1)])), Stream(1)]
    probes = torch.tensor([[5, 9], [7, 3], [11, 4], [2, 6]])
    forced = torch.tensor([[5, 9, 12], [7, 3, 3], [11, 4, 8], [2, 6, 2]])
    with VllmEngine(folder, tmp_path / "vllm", env={"VLLM_CPU_KVCACHE_SPACE": "1"}, log=lambda line: None) as vllm:
        for options in ({"probe_tokens": probes}, {"probe_tokens": probes, "stop_at_eos": True,
                                                  "stop_text": exact_match_decided(lm.tokenizer)}):
            mine, theirs = (e.generate(lm, prompts, streams, 8, **options) for e in (JUICE_ENGINE, vllm))
            assert mine.texts == theirs.texts and torch.equal(mine.tokens, theirs.tokens)
            assert torch.allclose(mine.first_probs, theirs.first_probs, rtol=0, atol=P_TOLERANCE)
        mine, theirs = (e.generate(lm, prompts, streams, 3, forced_tokens=forced) for e in (JUICE_ENGINE, vllm))
        assert torch.allclose(mine.forced_logprobs, theirs.forced_logprobs, rtol=0, atol=1e-4)
        scalings = [(Head(layer, head), alpha) for layer in range(4) for head in range(4) for alpha in (3.0, -1.0)]
        for measure, target in (("intervention_probs", 5), ("intervention_logit_differences", (5, 9))):
            (c1, v1), (c2, v2) = (getattr(e, measure)(lm, prompts[0], target, scalings) for e in (JUICE_ENGINE, vllm))
            assert abs(c1 - c2) <= 1e-4 and torch.allclose(v1.double(), v2.double(), rtol=0, atol=1e-4)
        # Stage 1's many prompts at once (issue 75): one request per (head, alpha) for all of them,
        # the per-prompt values
        import juice.vllm.engine as vllm_engine

        sent, send = [], vllm_engine._send
        vllm_engine._send = lambda url, model, batches, progress, **kw: sent.append(len(batches)) or send(
            url, model, batches, progress, **kw)
        try:
            targets = [(p, t) for p, t in zip(prompts, (5, 7, 11))]
            together = vllm.intervention_probs_many(lm, targets, scalings)
            alone = [vllm.intervention_probs(lm, p, t, scalings) for p, t in targets]
        finally:
            vllm_engine._send = send
        assert sent == [1 + len(scalings)] + [1 + len(scalings)] * 3   # 33 requests for three prompts, not 99
        for (c1, v1), (c2, v2), (c3, v3) in zip(together, alone, JUICE_ENGINE.intervention_probs_many(lm, targets,
                                                                                                       scalings)):
            assert abs(c1 - c2) <= 1e-4 and torch.allclose(v1, v2, rtol=0, atol=1e-4)
            assert abs(c1 - c3) <= 1e-4 and torch.allclose(v1.double(), v3.double(), rtol=0, atol=1e-4)
        assert len(vllm.starts) == 1   # no JuICE: one server for all of it


@needs_vllm
@pytest.mark.long
def test_table_2_on_vllm_equals_juices_engine(tmp_path):
    """The contextual direction (Table 2) on vLLM: MemoTrap's likelihood comparison from vLLM's
    prompt log-probabilities, CAD and AdaCAD handed to juice's engine in the same run."""
    from juice.experiments.table2 import reproduce_contextual

    lm, folder = tiny_llama_dir(tmp_path)
    write_contextual_data(tmp_path / "data")
    common = dict(model=folder, data_root=tmp_path / "data", limit=2, validation_per_dataset=1, ph3_dev_size=2,
                  alphas_positive=(1.0,), alphas_negative=(-1.0,), k=2, bootstrap_resamples=1000)
    reproduce_contextual(ReproduceConfig(out_dir=tmp_path / "juice", **common), lm=lm)
    with VllmEngine(folder, tmp_path / "vllm", env={"VLLM_CPU_KVCACHE_SPACE": "1"}, log=lambda line: None) as engine:
        reproduce_contextual(ReproduceConfig(out_dir=tmp_path / "out", engine="vllm", **common), lm=lm, engine=engine)
    compared = compare_files(tmp_path / "juice" / "results_contextual.json", tmp_path / "out" / "results_contextual.json",
                             p_tolerance=P_TOLERANCE, skip=ENGINE_RECORD)
    assert compared.same, compared.differences[:10]
    record = json.loads((tmp_path / "out" / "results_contextual.json").read_text())["protocol"]["engine"]
    assert record["rows"]["CAD"].startswith("juice (CAD and AdaCAD") and record["rows"]["JuICE"] == "vllm"
