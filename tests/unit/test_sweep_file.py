"""The sweep file (:func:`juice.experiments.sweep.load_sweep`): its jobs, and one line for each mistake."""

from __future__ import annotations

import pytest

from juice.experiments.sweep import SweepError, load_sweep, sweep_markdown

GOOD = """[grid]
models = ["a", "org/b"]
directions = ["parametric", "contextual"]
domains = ["world_capital", "nqswap"]
methods = ["Original", "JuICE"]
[settings]
limit = 3
engine = "vllm"
vllm_args = ["--enforce-eager"]
[ray]
gpus = 1
"""


def test_a_sweep_file_gives_one_job_per_model_and_direction(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(GOOD)
    sweep = load_sweep(path)
    jobs = sweep.jobs()
    assert [(j.name, j.domains) for j in jobs] == [("a-parametric", ("world_capital",)),
                                                   ("a-contextual", ("nqswap",)),
                                                   ("b-parametric", ("world_capital",)),
                                                   ("b-contextual", ("nqswap",))]
    assert sweep.gpus == 1.0 and sweep.cpus == 1.0 and dict(jobs[0].settings)["vllm_args"] == ("--enforce-eager",)
    assert len({j.key() for j in jobs}) == 4
    assert dict(jobs[0].settings)["baselines"] is False   # no baseline among the methods: none run
    assert sweep.methods == ("original", "juice")   # rows by key (juice.methods.Row)
    path.write_text(GOOD.replace('"Original", "JuICE"', '"Original", "PH3-l"'))
    assert "baselines" not in dict(load_sweep(path).jobs()[0].settings)   # ReproduceConfig's default: they run
    path.write_text(GOOD.replace('"Original", "JuICE"', '"original", "ph3-s", "JuNE"'))   # names or titles
    assert load_sweep(path).methods == ("original", "ph3-s", "june")
    path.write_text(GOOD.replace('"Original", "JuICE"', '"Original", "JuICE-ctx"'))
    with pytest.raises(SweepError, match="'JuICE-ctx' is not a table row \\(Original, JuNE, JuICE, Prompt"):
        load_sweep(path)


@pytest.mark.parametrize("change, words", [
    (("directions = [\"parametric\", \"contextual\"]", "directions = [\"sideways\"]"), "'sideways' is not parametric"),
    (("methods = [\"Original\", \"JuICE\"]", "methods = []"), "methods must be a non-empty list"),
    (("limit = 3", "out_dir = \"x\""), "out_dir is not a setting a sweep takes"),
    (("limit = 3", "scoring = \"guess\""), "scoring must be exact"),
    (("domains = [\"world_capital\", \"nqswap\"]", "domains = [\"nqswap\"]"), "none for the parametric direction"),
    (("gpus = 1", "gpus = \"one\""), "[ray] cpus and gpus must be numbers"),
    (("[grid]", "[grid"), "not TOML"),
    (("\"org/b\"", "\"org/a\""), "would share the job folder 'a-contextual'"),
    (("\"JuICE\"]", "\"JuCIE\"]"), "'JuCIE' is not a table row"),
])
def test_a_bad_sweep_file_is_refused_in_one_line(tmp_path, change, words):
    path = tmp_path / "s.toml"
    path.write_text(GOOD.replace(*change))
    with pytest.raises(SweepError) as err:
        load_sweep(path)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_the_table_has_a_line_per_domain_and_method_and_a_column_per_group():
    rows = [{"model": "m", "direction": "parametric", "domain": d, "method": meth, "group": g, "n": n,
             "mean": 50.0, "low": 25.0, "high": 75.0}
            for d, n in (("Average", 4), ("world_capital", 2)) for meth in ("JuICE", "Original")
            for g in ("clean", "substitution")]
    lines = sweep_markdown(rows, ["Original", "JuICE"]).splitlines()
    assert lines[0] == "| model | direction | domain | method | clean | substitution | n |"
    assert [line.split(" | ")[2:4] for line in lines[2:]] == [["world_capital", "Original"], ["world_capital", "JuICE"],
                                                              ["Average", "Original"], ["Average", "JuICE"]]
    assert lines[2].endswith("| 50.0 [25.0, 75.0] | 50.0 [25.0, 75.0] | 2 |")
