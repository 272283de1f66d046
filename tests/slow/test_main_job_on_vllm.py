"""The main job on vLLM against juice's engine on the embedded Gemma 3 270M, with the README's
defaults (`long`: about 40 minutes on 2 cores; `benchmarks/bench_main_job.py --engine vllm`
runs the same comparison and times it): the same heads in the same order, Stage 1's scores to
1e-4, and every table cell, choice, output and verdict equal."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from juice.vllm.launch import find_vllm_python

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_main_job  # noqa: E402

pytestmark = [pytest.mark.long, pytest.mark.vllm,
              pytest.mark.skipif(find_vllm_python(required=False) is None,
                                 reason="no vLLM environment (run scripts/install-vllm.sh)")]


def test_the_main_job_on_vllm_gives_juices_table_1(real_model, tmp_path):
    times = {engine: bench_main_job._run(tmp_path / engine, real_model, engine, [])[0] for engine in ("juice", "vllm")}
    record = bench_main_job.compare_engines(tmp_path / "juice", tmp_path / "vllm", times, [], [])
    assert record["same_heads"] and record["stage1_max_score_difference"] <= 1e-4
    assert record["differing_cells"] == [] and record["differing_items"] == [], json.dumps(record)[:3000]
    assert record["other_differences"] == [] and record["max_p_difference"] <= bench_main_job.P_TOLERANCE
