"""The main job on vLLM against juice's engine on the embedded Gemma 3 270M: the same heads in the
same order, Stage 1's scores to 1e-4, and every table cell, choice, output and verdict equal. With
the README's defaults it is `long` (about 40 minutes on 2 cores; `benchmarks/bench_main_job.py
--engine vllm` runs the same comparison and times it); CI runs it short (Stage 1 on one prompt of D
per conflict type, two test items per domain, JuNE and JuICE only), so that every change to the
vLLM path meets the embedded model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from juice.vllm.launch import find_vllm_python

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_main_job  # noqa: E402

pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(find_vllm_python(required=False) is None,
                                 reason="no vLLM environment (run scripts/install-vllm.sh)")]


SHORT = dict(head_set_size=1, validation_size=1, limit=2, domains=("world_capital", "book_author"), baselines=False,
             alphas_positive=(3.0,), alphas_negative=(-1.0,), k=2, beta_plus_grid=(0.0, 2.0), beta_minus_grid=(0.0, -1.0))
"""The main job cut to a few minutes: D is one known World Capital item (its three conflict types),
one validation item and two test items per domain, one alpha per sign, a 2 x 2 beta grid."""


def test_a_short_main_job_on_vllm_gives_juices_table_on_the_embedded_model(real_model, tmp_path):
    from juice.pipeline.run import ReproduceConfig
    from juice.experiments.table1 import reproduce
    from juice.pipeline.compare import ENGINE_RECORD, compare_files
    from juice.vllm.engine import VllmEngine

    juice_out, vllm_out = tmp_path / "juice", tmp_path / "vllm"
    reproduce(ReproduceConfig(model="gemma-3-270m", out_dir=juice_out, **SHORT), lm=real_model)
    with VllmEngine("gemma-3-270m", vllm_out / "vllm", log=lambda line: None) as engine:
        reproduce(ReproduceConfig(model="gemma-3-270m", out_dir=vllm_out, engine="vllm", **SHORT), engine=engine)
    mine, theirs = (bench_main_job._scores(out / "heads.json") for out in (juice_out, vllm_out))
    assert mine.keys() == theirs.keys() and len(mine) == 2 * 18 * 4 * 3   # every head, both signs, three types
    assert max(abs(mine[k] - theirs[k]) for k in mine) <= 1e-4
    heads = [{sign: json.loads((out / "heads.json").read_text())[f"{sign}_heads"] for sign in ("positive", "negative")}
             for out in (juice_out, vllm_out)]
    assert heads[0] == heads[1] and len(heads[0]["positive"]) == 2
    compared = compare_files(juice_out / "results.json", vllm_out / "results.json",
                             p_tolerance=bench_main_job.P_TOLERANCE, skip=ENGINE_RECORD)
    assert compared.same, compared.differences[:10]
    record = json.loads((vllm_out / "results.json").read_text())["protocol"]["engine"]
    assert record["stages"]["stage 1"] == "vllm" and set(record["rows"].values()) == {"vllm"}
    assert record["juice_copy"] == {"loaded": False, "device": "cpu"}   # no stage needed juice's copy's weights


@pytest.mark.long
def test_the_main_job_on_vllm_gives_juices_table_1(real_model, tmp_path):
    times = {engine: bench_main_job._run(tmp_path / engine, real_model, engine, [])[0] for engine in ("juice", "vllm")}
    record = bench_main_job.compare_engines(tmp_path / "juice", tmp_path / "vllm", times, [], [])
    assert record["same_heads"] and record["stage1_max_score_difference"] <= 1e-4
    assert record["differing_cells"] == [] and record["differing_items"] == [], json.dumps(record)[:3000]
    assert record["other_differences"] == [] and record["max_p_difference"] <= bench_main_job.P_TOLERANCE
