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


def _commands():
    """Every command of `juice` as (its words, its click command), groups and their commands included."""
    import typer.main

    root = typer.main.get_command(app)
    found = [((), root)]
    for name, command in root.commands.items():
        found.append(((name,), command))
        found += [((name, sub), c) for sub, c in getattr(command, "commands", {}).items()]
    return found


def test_every_help_reads_whole_at_80_columns_with_an_example():
    """Issue 92: at 80 columns no help line is wider, nothing is cut (no ellipsis), every command
    shows at least one example that runs it, and `juice --help` gives each command its whole
    first sentence."""
    from juice.apps.help_format import summary

    top = CliRunner().invoke(app, ["--help"], terminal_width=80).output
    for words, command in _commands():
        out = CliRunner().invoke(app, [*words, "--help"], terminal_width=80)
        assert out.exit_code == 0, words
        lines = out.output.splitlines()
        assert max(map(len, lines)) <= 80, (words, max(lines, key=len))
        assert "…" not in out.output, words
        if words:   # the group `juice` itself names its commands instead
            examples = out.output.split("Examples:", 1)[-1].split("Options:")[0]
            assert "Examples:" in out.output and f"juice {' '.join(words)}" in examples, words
        if len(words) == 1:
            line = command.short_help or summary(command.help)   # `analyze` says its own
            assert " ".join(line.split()) in " ".join(top.split()), words


def test_summary_is_the_first_sentence_past_the_papers_abbreviations():
    from juice.apps.help_format import summary

    assert summary("App. D paraphrase table: per domain. More.") == "App. D paraphrase table: per domain."
    assert summary("Fig. 3: knock out each layer\n    on D. Then") == "Fig. 3: knock out each layer on D."
    assert summary("One sentence, no period") == "One sentence, no period"


def test_every_page_or_section_a_help_names_exists():
    """Issue 92: a help text that sends the reader to a page (`docs/vllm.md`) or a section of one
    (`docs/reproducing.md, "On vLLM"`, `README, "..."`) names one that exists."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    texts = []
    for _, command in _commands():
        texts.append(command.help or "")
        texts += [getattr(p, "help", None) or "" for p in command.params]
    named = re.findall(r"(README|docs/[\w./-]+\.md),? ?(?:\"([^\"]+)\")?", " ".join(" ".join(texts).split()))
    assert len(named) >= 5, named   # the helps do name pages: the check below is not empty
    for page, section in named:
        path = root / ("README.md" if page == "README" else page)
        assert path.is_file(), page
        if section:
            headings = [h.replace("`", "") for h in re.findall(r"^#+ (.+)$", path.read_text(encoding="utf-8"), re.M)]
            assert any(h.startswith(section) for h in headings), (page, section)
