"""The command line parses its options and refuses bad ones before loading anything."""

from __future__ import annotations

from typer.testing import CliRunner

from juice.apps.cli import app


def test_reproduce_offers_both_directions_and_the_baseline_options():
    out = CliRunner().invoke(app, ["reproduce", "--help"], terminal_width=200)
    assert out.exit_code == 0
    for option in ("--direction", "--data-root", "--ph3-dev-size", "--max-prompt-tokens", "--max-rows", "--full"):
        assert option in out.output


def test_an_unknown_direction_is_refused():
    out = CliRunner().invoke(app, ["reproduce", "--direction", "sideways"])
    assert out.exit_code != 0
    assert "parametric or contextual" in out.output


def test_stage1_is_exact_by_default_and_the_approximations_say_so():
    out = CliRunner().invoke(app, ["reproduce", "--help"], terminal_width=250)
    text = " ".join(out.output.translate({ord(c): " " for c in "│╭╮╰╯─"}).split())   # rich's box, unwrapped
    assert "exact (the paper's Alg. 2, default)" in text
    assert text.count("APPROXIMATION") >= 2
    assert "--device" in text and "--ph3-knockout" in text


def test_an_unknown_scoring_is_refused():
    out = CliRunner().invoke(app, ["reproduce", "--scoring", "guess"])
    assert out.exit_code != 0 and "exact, hybrid or attribution" in out.output


def test_a_beta_grid_that_is_not_numbers_is_refused_before_anything_loads():
    for command in (["reproduce"], ["tune", "--heads", __file__, "--data", __file__]):
        out = CliRunner().invoke(app, [*command, "--beta-minus-grid", "0,-1,x"])
        assert out.exit_code != 0
        assert "--beta-minus-grid must be comma-separated finite numbers" in " ".join(out.output.split())
