"""The command line parses its options and refuses bad ones before loading anything."""

from __future__ import annotations

from typer.testing import CliRunner

from juice.cli import app


def test_reproduce_offers_both_directions_and_the_baseline_options():
    out = CliRunner().invoke(app, ["reproduce", "--help"], terminal_width=200)
    assert out.exit_code == 0
    for option in ("--direction", "--data-root", "--ph3-dev-size", "--max-prompt-tokens", "--max-rows", "--full"):
        assert option in out.output


def test_an_unknown_direction_is_refused():
    out = CliRunner().invoke(app, ["reproduce", "--direction", "sideways"])
    assert out.exit_code != 0
    assert "parametric or contextual" in out.output
