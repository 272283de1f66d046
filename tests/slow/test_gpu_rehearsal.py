"""The GPU check rehearsed on the CPU (scripts/gpu-rehearse.sh; issue 73): on a copy of the GPU
node's Python (3.12, torch 2.11, transformers 5.17, no server stack) with only the carried wheels,
installed as benchmarks/gpu_check.sh installs them, the check's dry run resolves every requirement,
uses every carried wheel and runs every section to the end. The node's image is built once into
~/.cache/juice (a minute or two; about 5 GB) and reused.

In the `long` tier (about 6 minutes, a tenth of CI's time, for a script that runs only on a lent
GPU): run it before the device call of a session that has a GPU,
`python -m pytest -m long tests/slow/test_gpu_rehearsal.py` (docs/models.md, "The GPU check").
Its tests section has a time share, so on a heavily shared machine it can stop short."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.long
def test_the_rehearsal_of_the_gpu_check_passes_with_only_the_carried_wheels(tmp_path):
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-rehearse.sh"), str(tmp_path)],
                          capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    record = json.loads((tmp_path / "gpu-check.json").read_text())
    env, req = record["env"], record["requirements"]
    assert env["python"].startswith("3.12") and env["torch"].startswith("2.11.0")
    assert Path(env["transformers_from"]).resolve() == (tmp_path / "carried-site").resolve()
    image = (tmp_path / "image-packages.txt").read_text()
    assert "transformers==5.17.0" in image and "pydantic==" not in image and "fastapi==" not in image
    assert req["unmet"] == [] and req["carried_unused"] == []
    assert {"transformers", "fastapi", "pydantic", "openai", "uvicorn"} <= set(req["carried"])
    assert all(s["status"] == "done" for s in record["sections"].values()) and set(record["sections"]) == {
        "checks", "tests", "bench"}
    assert record["checks"]["rows"] and all(row["passed"] for row in record["checks"]["rows"])
    (tests,) = record["tests"]
    counts = tests["per_architecture"]
    assert tests["returncode"] == 0 and sum(c["failed"] for c in counts.values()) == 0
    assert sum(c["passed"] for c in counts.values()) > 50
    for bench in record["bench"]:
        assert "error" not in bench and bench["decoding"] and bench["stage1"]["max_prob_diff"] < 1e-4
    assert "none missing" in (tmp_path / "gpu-check.md").read_text()
    carried = re.search(r"gpu-wheels\.sh: (\d+ wheels, \d+ MiB)", done.stdout).group(1)
    assert f"is {carried}:" in (ROOT / "docs" / "models.md").read_text()   # the size the page states
