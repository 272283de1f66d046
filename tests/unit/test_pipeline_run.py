"""The settings of `juice reproduce` (juice.pipeline.run.ReproduceConfig) check themselves, for the
command line and the Python API alike."""

from __future__ import annotations

import math

import pytest

from juice.pipeline.run import ReproduceConfig


@pytest.mark.parametrize("bad, message", [
    ({"scoring": "exactly"}, "scoring must be exact, hybrid or attribution"),
    ({"degeneration_margin": -1.0}, "degeneration_margin must be a number of percentage points >= 0"),
    ({"degeneration_margin": math.nan}, "degeneration_margin must be"),
    ({"max_rows": 0}, 'max_rows must be a positive number of rows or "auto"'),
    ({"max_rows": "many"}, "max_rows must be"),
])
def test_bad_settings_are_refused_in_one_line(bad, message):
    with pytest.raises(ValueError, match=message):
        ReproduceConfig(**bad)


def test_good_settings_pass():
    for good in ({}, {"scoring": "hybrid", "max_rows": "auto"}, {"degeneration_margin": 10.0, "max_rows": 8}):
        assert ReproduceConfig(**good).scoring in ("exact", "hybrid")


def test_the_cli_says_it_as_a_bad_parameter(tmp_path):
    from typer.testing import CliRunner

    from juice.apps.cli import app

    result = CliRunner().invoke(app, ["reproduce", "--scoring", "exactly", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "scoring must be exact, hybrid or attribution" in result.output
    result = CliRunner().invoke(app, ["reproduce", "--max-rows", "many", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "max_rows must be" in result.output
    result = CliRunner().invoke(app, ["identify", "--scoring", "exactly", "--out", str(tmp_path / "heads.json")])
    assert result.exit_code == 2 and "scoring must be exact, hybrid or attribution" in result.output


def test_the_when_to_steer_study_is_asked_for_by_known_datasets(tmp_path):
    from typer.testing import CliRunner

    from juice.apps.cli import app

    with pytest.raises(ValueError, match="contexts: unknown dataset 'nq'; choose from nqswap, paraconflict"):
        ReproduceConfig(contexts=("nq",))
    with pytest.raises(ValueError, match="study_size must be default or published"):
        ReproduceConfig(study_size="huge")
    result = CliRunner().invoke(app, ["reproduce", "--contexts", "nqswap", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "runs after Table 2" in result.output
