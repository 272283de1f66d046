"""Every number the pages publish from a benchmark comes from its committed record
(benchmarks/results/), with the command and the commit that produced it: the pages hold the
record's table as the benchmark renders it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_main_job  # noqa: E402


def test_the_engines_comparison_on_the_reproducing_page_is_the_committed_record():
    record = json.loads((ROOT / "benchmarks" / "results" / "main-job-engines.json").read_text(encoding="utf-8"))
    assert record["command"].startswith("python benchmarks/bench_main_job.py --engine vllm")
    assert len(record["commit"]) == 40 and record["model"] == "gemma-3-270m"
    page = (ROOT / "docs" / "reproducing.md").read_text(encoding="utf-8")
    assert bench_main_job.engines_markdown(record) in page
    assert f"`{record['command']}`" in page and record["commit"][:12] in page
