"""`juice sweep` (:mod:`juice.experiments.sweep`) on a local Ray cluster of two nodes (a head and a
worker, one CPU each) with two tiny models: both jobs run, one per node; the sweep killed after the
first job finished resumes without recomputing it or the second job's saved stages, and the table
holds every cell with n and its interval."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray", reason="juice sweep needs the cluster extra (ray)")

SETTINGS = """
[settings]
limit = 2
validation_size = 2
filter = false
alphas_positive = [1.0, 3.0]
alphas_negative = [-1.0]
k = 2
baselines = false
bootstrap_resamples = 1000
"""


def _tiny_folder(tmp: Path, name: str, layers: int, heads: int) -> str:
    """A tiny random Llama saved with its tokenizer (juice loads it by folder, as a job does)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from conftest import COMMON, make_tokenizer

    config = AutoConfig.for_model("llama", hidden_size=16 * heads, intermediate_size=64, num_hidden_layers=layers,
                                  num_attention_heads=heads, num_key_value_heads=heads, **COMMON)
    torch.manual_seed(0)
    folder = tmp / name
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    make_tokenizer().save_pretrained(folder)
    return str(folder)


def _sweep(cmd_out: Path, file: Path, address: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "juice.apps.console", "sweep", str(file), "--out", str(cmd_out),
                             "--address", address], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env={**os.environ, "COLUMNS": "300"})


def _files(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


@pytest.fixture
def cluster(monkeypatch):
    from ray.cluster_utils import Cluster

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")   # no token left in ~/.ray: it would turn token auth on for
    # every later local Ray cluster, vLLM's among them (tests/slow/test_vllm_runs.py)
    c = Cluster(initialize_head=True, connect=False, head_node_args={"num_cpus": 1, "include_dashboard": False})
    c.add_node(num_cpus=1)
    c.wait_for_nodes()
    yield c
    c.shutdown()


def test_a_sweep_on_two_ray_nodes_resumes_after_being_killed(tmp_path, cluster):
    small = _tiny_folder(tmp_path, "small", 2, 2)
    large = _tiny_folder(tmp_path, "large", 4, 8)   # 8x the (head, alpha) interventions: finishes second
    file = tmp_path / "sweep.toml"
    file.write_text(f"""[grid]
models = ["{small}", "{large}"]
directions = ["parametric"]
domains = ["world_capital", "athlete_sport"]
methods = ["Original", "JuNE", "JuICE"]
{SETTINGS}""")
    out = tmp_path / "out"
    first = _sweep(out, file, cluster.address)
    done = out / "jobs" / "small-parametric" / "job.json"
    deadline = time.monotonic() + 600
    while not done.exists() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert done.exists(), first.communicate()[0][-3000:]
    os.killpg(first.pid, signal.SIGKILL)   # the sweep's driver dies; Ray ends its tasks
    first.wait()
    assert not (out / "jobs" / "large-parametric" / "job.json").exists()   # killed part-way
    before = _files(out / "jobs")
    units = out / "jobs" / "large-parametric" / "state" / "units.json"   # one entry per finished unit
    units_before = json.loads(units.read_text())["units"] if units.exists() else {}
    saved_stages = [f for f in before if f.startswith("large-parametric/state/")
                    and not f.endswith(("units.json", ".chunks.json"))]   # checkpoints, not stages
    assert saved_stages   # the killed job had finished stages to resume from

    second = _sweep(out, file, cluster.address)
    log = second.communicate(timeout=600)[0]
    assert second.returncode == 0, log[-3000:]
    assert "small-parametric: finished before" in log and "1 jobs ran, 1 read as finished, 0 failed" in log, log
    after = _files(out / "jobs")
    unchanged = [f for f in before if f.startswith("small-parametric/") or f in saved_stages]   # not rewritten
    assert all(after[f] == before[f] for f in unchanged), [f for f in unchanged if after[f] != before[f]]
    units_after = json.loads(units.read_text())["units"]
    assert all(units_after[u] == v for u, v in units_before.items())   # finished units kept, as they were
    assert not [f for f in after if f.endswith(".chunks.json")]   # a stage's chunks go once it is saved

    record = json.loads((out / "sweep.json").read_text())
    assert record["failed"] == {} and record["ran"] == ["large-parametric"]
    cells = {(r["model"], r["domain"], r["method"], r["group"]): r for r in record["rows"]}
    for model in (small, large):
        for domain in ("world_capital", "athlete_sport", "Average"):
            for method in ("Original", "JuNE", "JuICE"):
                for group in ("clean", "substitution", "coherent"):
                    row = cells[(model, domain, method, group)]
                    assert row["n"] == (4 if domain == "Average" else 2)
                    assert 0 <= row["low"] <= row["mean"] <= row["high"] <= 100
    table = (out / "sweep.md").read_text()
    assert table.count("\n") == 2 + 2 * 3 * 3 and "| n |" in table
    # the killed job's table equals one run start to end, alone, in this process
    from juice.experiments.sweep import load_sweep, run_job

    job = next(j for j in load_sweep(file).jobs() if j.model == large)
    alone = run_job(job, tmp_path / "alone")
    resumed = json.loads((out / "jobs" / "large-parametric" / "job.json").read_text())
    assert resumed["cells"] == alone["cells"] and resumed["heads"] == alone["heads"]
