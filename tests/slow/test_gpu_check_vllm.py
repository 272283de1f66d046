"""The vLLM plugin's GPU check on the CPU (benchmarks/gpu_check_vllm.py --dry-run; issue 65): what
the GPU run will start, vLLM's engine configuration for each as an H100 builds it with juice's
verdict, the eager run's tokens against juice's, and the pieces of vLLM's piecewise split. `long`
tier (two vLLM starts, about 2 minutes of CI's time for a script that runs only on a lent GPU; the
constraints and the split it reports are checked in CI by tests/unit/test_vllm_constraints.py and
tests/slow/test_vllm_compiled_split.py): run `python -m pytest -m long tests/slow/test_gpu_check_vllm.py`
before a device call. Skips without vLLM's environment."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.vllm import needs_vllm  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.long
@needs_vllm
def test_the_gpu_checks_dry_run_passes_its_cpu_possible_parts(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check_vllm.py"), str(tmp_path), "--dry-run"],
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    record = json.loads((tmp_path / "gpu-check-vllm.json").read_text())
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_check_vllm

    assert [p["config"] for p in record["plan"]][:-1] == list(gpu_check_vllm.CONFIGS)
    assert all(row["agrees"] for row in record["engine_configs"].values())
    assert record["engine_configs"]["TORCH_COMPILE_DISABLE=1"]["cudagraph_mode"] == "FULL_DECODE_ONLY"
    runs = record["runs"]
    assert runs["eager (CPU)"]["happened"] == "equal"
    split = runs["piecewise split (CPU)"]
    assert split["happened"] == "equal" and split["run1_split_alone"] and split["run1_once_per_juice_forward"]
    text = (tmp_path / "gpu-check-vllm.md").read_text()
    assert "splitting juice.clean_run\n" in text and "all as expected: yes" in text
