"""Every number the pages publish from a benchmark comes from its committed record
(benchmarks/results/), with the command and the commit that produced it: the pages hold the
record's table as the benchmark renders it."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_main_job  # noqa: E402
import bench_sweep  # noqa: E402


def test_the_engines_comparison_on_the_reproducing_page_is_the_committed_record():
    record = json.loads((ROOT / "benchmarks" / "results" / "main-job-engines.json").read_text(encoding="utf-8"))
    assert record["command"].startswith("python benchmarks/bench_main_job.py --engine vllm")
    assert len(record["commit"]) == 40 and record["model"] == "gemma-3-270m"
    page = (ROOT / "docs" / "reproducing.md").read_text(encoding="utf-8")
    assert bench_main_job.engines_markdown(record) in page
    assert f"`{record['command']}`" in page and record["commit"][:12] in page


def test_the_offline_engines_comparison_on_the_reproducing_page_is_the_committed_record():
    record = json.loads((ROOT / "benchmarks" / "results" / "main-job-offline.json").read_text(encoding="utf-8"))
    assert record["command"].startswith("python benchmarks/bench_main_job.py --engine vllm --vllm-offline")
    assert record["protocol_engine"]["transport"] == "offline" and not record["dirty"] and len(record["commit"]) == 40
    page = (ROOT / "docs" / "reproducing.md").read_text(encoding="utf-8")
    assert bench_main_job.engines_markdown(record) in page
    assert f"`{record['command']}`" in page and record["commit"][:12] in page
    server = json.loads((ROOT / "benchmarks" / "results" / "main-job-engines.json").read_text(encoding="utf-8"))
    assert (f"{record['protocol_engine']['requests']} `LLM.generate` calls in place of "
            f"{server['protocol_engine']['requests']} HTTP requests") in page
    assert f"({record['total_s']['vllm']:.0f} s against {server['total_s']['vllm']:.0f} s)" in page


def test_the_signals_auroc_tables_on_the_when_to_steer_page_are_the_committed_record():
    import gate_classifier

    record = json.loads((ROOT / "benchmarks" / "results" / "gate-classifier.json").read_text(encoding="utf-8"))
    assert record["command"].startswith("python benchmarks/gate_classifier.py") and len(record["commit"]) == 40
    assert not record["dirty"] and set(record["datasets"]) == {"nqswap", "paraconflict"}
    page = (ROOT / "docs" / "when-to-steer.md").read_text(encoding="utf-8")
    assert f"`{record['command']}`" in page and record["commit"][:12] in page
    for dataset in record["datasets"]:
        assert gate_classifier.record_markdown(record, dataset) in page
    for claim in gate_classifier.claims(record):   # every sentence of the verdict that states a number
        assert claim in page
    for name in ("docs/faq.md", "docs/when-to-steer.md"):   # the gate's headline
        assert f"{gate_classifier.headline(record)} (0.5 is chance)" in (ROOT / name).read_text(encoding="utf-8"), name


def test_the_gate_verdict_names_a_best_signal_only_when_no_other_lies_in_its_interval():
    import gate_classifier

    def cell(signal, wrong, mean, low, high):
        return {"signal": signal, "source": "nqswap", "wrong": wrong, "auroc": {"mean": mean, "low": low, "high": high}}

    signals = list(gate_classifier.SIGNAL_TITLES)
    cells = [cell(signals[0], "irrelevant", 0.92, 0.91, 0.93), cell(signals[1], "irrelevant", 0.62, 0.60, 0.63),
             cell(signals[0], "distractor", 0.549, 0.529, 0.569), cell(signals[1], "distractor", 0.547, 0.53, 0.56),
             cell(signals[2], "distractor", 0.51, 0.49, 0.53)]
    record = {"datasets": {"nqswap": {"pooled": "nqswap", "cells": cells}}}
    clear, _, tie, _ = gate_classifier.claims(record)
    assert clear == "NQ-Swap, irrelevant passages: lexical share separates best, AUROC 0.92 [0.91, 0.93]."
    assert tie == ("NQ-Swap, distractor passages: no signal separates better than the others (the highest AUROC, "
                   "the lexical share's, 0.55 [0.53, 0.57], holds 1 other in its interval); "
                   "peakedness (CoCoA) no better than chance.")


def test_the_sweep_on_the_reproducing_page_is_the_committed_record():
    record = json.loads((ROOT / "benchmarks" / "results" / "sweep-embedded.json").read_text(encoding="utf-8"))
    assert record["command"].startswith("python benchmarks/bench_sweep.py") and len(record["commit"]) == 40
    assert not record["dirty"] and record["failed"] == {} and record["again_ran"] == 0
    page = (ROOT / "docs" / "reproducing.md").read_text(encoding="utf-8")
    assert bench_sweep.sweep_record_markdown(record) in page
    assert f"`{record['command']}`" in page and record["commit"][:12] in page


def test_the_deferred_copys_memory_on_the_reproducing_page_is_the_committed_record():
    import bench_deferred_load

    record = json.loads((ROOT / "benchmarks" / "results" / "deferred-load.json").read_text(encoding="utf-8"))
    assert record["command"].startswith("python benchmarks/bench_deferred_load.py") and len(record["commit"]) == 40
    assert not record["dirty"] and not record["deferred"]["loaded"] and record["loaded"]["loaded"]
    page = (ROOT / "docs" / "reproducing.md").read_text(encoding="utf-8")
    assert bench_deferred_load.record_markdown(record) in page


def test_the_when_to_steer_tables_and_claims_are_the_committed_record():
    """docs/when-to-steer.md holds each dataset's test table, auto's policy and its cross-validation
    as the record renders them, with the distractor column; the README and the home page quote
    auto's result against the best static method from the same record."""
    import when_to_steer_study

    record = json.loads((ROOT / "benchmarks" / "results" / "when-to-steer-default.json").read_text(encoding="utf-8"))
    assert record["command"] == when_to_steer_study.COMMAND and record["size"] == "default"
    assert len(record["commit"]) == 40 and set(record["datasets"]) == {"nqswap", "paraconflict"}
    page = (ROOT / "docs" / "when-to-steer.md").read_text(encoding="utf-8")
    assert f"`{record['command']}`" in page and record["commit"][:12] in page
    for dataset, part in record["datasets"].items():
        assert when_to_steer_study.record_markdown(record, dataset) in page
        for cells in part["test"]["use_relevant"]["cells"].values():
            assert cells["distractor"]["n"] > 0
        assert when_to_steer_study.headline(record, dataset) in page


def test_the_when_to_steer_verdict_leads_every_page_from_the_published_record():
    """Issue 77: the FAQ and docs/when-to-steer.md state the published size's verdict (the page
    first, after its plain words), every sentence of it as the record renders it (a flipped sign or verdict
    fails), and the page holds the record's tables; the plan in code is the plan the record followed."""
    import when_to_steer_study
    from juice.when_to_steer.auto import AutoPolicy
    from juice.when_to_steer.preregistered import PLAN

    record = json.loads((ROOT / "benchmarks" / "results" / "when-to-steer-published.json").read_text(encoding="utf-8"))
    assert record["command"].startswith("python benchmarks/when_to_steer_study.py --analyze")
    assert len(record["commit"]) == 40 and not record["dirty"] and record["heads"]
    assert record["plan_sha256"] == PLAN.digest() and record["plan"] == json.loads(json.dumps(PLAN.to_json()))
    page = (ROOT / "docs" / "when-to-steer.md").read_text(encoding="utf-8")
    assert f"`{record['command']}`" in page and record["commit"][:12] in page
    assert when_to_steer_study.published_markdown(record) in page
    for part in record["datasets"].values():
        assert AutoPolicy.from_json(part["policy"]).describe() in page
    docs = {name: (ROOT / name).read_text(encoding="utf-8") for name in ("docs/faq.md",)}
    sentences = when_to_steer_study.verdict_sentences(record)
    assert sentences
    for sentence in sentences:
        for name, text in {**docs, "docs/when-to-steer.md": page}.items():
            assert sentence in " ".join(text.split()), (name, sentence)
    verdict = page.index("## The verdict")
    assert verdict < page.index("## The context types") and sentences[0] in page[verdict:page.index("## The context types")]


NUMBER = re.compile(r"(?<![\d.])[+-]?\d+\.\d+(?: \[[+-]?\d+\.\d+, [+-]?\d+\.\d+\])?")
"""A decimal number in prose, with its interval where one follows ("65.0 [57.1, 71.3]", "-10.1 [-11.8, -8.4]")."""


def verdict_prose() -> dict[str, str]:
    """Where the pages interpret the published when-to-steer verdict in their own words: the page's
    verdict section (to the record's provenance) and the FAQ's bullet on `auto`; white space
    collapsed (the README and the home page state it in words alone:
    test_the_front_pages_teach_first_and_leave_the_numbers_to_their_pages)."""
    def span(name: str, start: str, end: str) -> str:
        text = (ROOT / name).read_text(encoding="utf-8")
        at = text.index(start)
        return " ".join(text[at:text.index(end, at)].split())

    return {"docs/when-to-steer.md": span("docs/when-to-steer.md", "## The verdict",
                                          "The committed record `benchmarks/results/when-to-steer-published.json`"),
            "docs/faq.md": span("docs/faq.md", "- `auto` chooses per request.", "\n\n")}


def test_every_number_in_the_pages_own_verdict_prose_is_in_a_committed_record():
    """Issue 77: the prose around the verdict (not only the rendered sentences) states no number,
    interval or sign the records do not hold: each decimal, with its interval, is in the published
    record or the gate classifier's, as the benchmarks render them (0.5, chance, aside)."""
    import gate_classifier
    import when_to_steer_study

    results = ROOT / "benchmarks" / "results"
    published = json.loads((results / "when-to-steer-published.json").read_text(encoding="utf-8"))
    gate = json.loads((results / "gate-classifier.json").read_text(encoding="utf-8"))
    rendered = [when_to_steer_study.published_markdown(published), gate_classifier.headline(gate),
                *gate_classifier.claims(gate), *(gate_classifier.record_markdown(gate, d) for d in gate["datasets"])]
    source = " ".join(" ".join(rendered).split())
    for name, prose in verdict_prose().items():
        numbers = [m.group(0) for m in NUMBER.finditer(prose)]
        assert numbers, name
        for number in numbers:
            assert number == "0.5" or number in source, (name, number)


def test_the_page_states_every_sensitivity_estimate_the_published_record_holds():
    """Beside the plan's estimates, the page shows each sensitivity analysis's estimate in every
    design the record holds, the fits across datasets included."""
    import when_to_steer_study

    record = json.loads((ROOT / "benchmarks" / "results" / "when-to-steer-published.json").read_text(encoding="utf-8"))
    text = " ".join(when_to_steer_study.sensitivity_sentences(record))
    estimates = [e for part in record["sensitivity"].values() for e in part["estimates"]]
    assert any(" -> " in e["dataset"] for e in estimates)
    for e in estimates:
        assert f"{e['design']} {e['difference']:+.1f} [{e['low']:+.1f}, {e['high']:+.1f}]" in text, e


def test_the_published_when_to_steer_record_is_what_its_committed_outcomes_give():
    """The pre-registered record is re-checkable without a model: every dataset's decoded outcomes
    are committed (benchmarks/results/when-to-steer-outcomes/<dataset>/, a file per half), they
    hash to the record's `outcomes_sha256`, and analyzing them again gives the record's every
    estimate, table and curve (all but the command, commit and date); its heads and betas are
    juice's shipped contextual heads for the model."""
    import when_to_steer_study
    from juice.when_to_steer.outcomes import outcomes_sha256, read_outcomes

    results = ROOT / "benchmarks" / "results"
    record = json.loads((results / "when-to-steer-published.json").read_text(encoding="utf-8"))
    folders = {name: results / "when-to-steer-outcomes" / name for name in record["datasets"]}
    for name, folder in folders.items():
        assert not (folder / "outcomes.json").exists(), "commit the halves' files, which say what decoded them"
        assert outcomes_sha256(read_outcomes(folder)) == record["datasets"][name]["outcomes_sha256"], name
    shipped = ROOT / "src" / "juice" / "stage1" / "shipped" / "gemma-3-270m.contextual.json"
    again = when_to_steer_study.published_record(folders, source={"commit": record["commit"], "dirty": False},
                                                 command=record["command"], heads=shipped)
    assert json.loads(json.dumps({**again, "date": record["date"]})) == record


def test_the_gpu_section_of_the_models_page_quotes_the_newest_gpu_record_and_nothing_older():
    """docs/models.md's GPU section holds the newest benchmarks/results/gpu-check-*.json as
    gpu_check.page_markdown renders it, or, while none is committed, says so and names no GPU."""
    import gpu_check

    page = (ROOT / "docs" / "models.md").read_text(encoding="utf-8")
    section = page[page.index("## GPUs\n"):page.index("## Big models on GPUs")]
    records = sorted((ROOT / "benchmarks" / "results").glob("gpu-check-*.json"))
    if not records:
        assert gpu_check.NO_RECORD in section
        assert not re.search(r"\b[Oo]n (one|an?|that) (H100|H200|A100|L4)\b|ms/step", section)   # nothing ran there
        return
    newest = records[-1]
    assert gpu_check.page_markdown(json.loads(newest.read_text(encoding="utf-8")), newest.name) in section
    assert gpu_check.NO_RECORD not in section
    assert not any(older.name in page for older in records[:-1])


def test_the_embedded_qwen_s_costs_on_the_models_page_are_the_committed_record():
    """Issue 89: what loading and running the embedded Qwen costs, as docs/models.md states it, is
    benchmarks/bench_embedded_cost.py's committed record, rendered, with its command and commit."""
    import bench_embedded_cost

    record = json.loads((ROOT / "benchmarks" / "results" / "embedded-cost-qwen2.5-coder-1.5b.json")
                        .read_text(encoding="utf-8"))
    assert record["command"].startswith("python benchmarks/bench_embedded_cost.py --model qwen2.5-coder-1.5b")
    assert len(record["commit"]) == 40 and record["dirty"] is False and record["assemble"]["bytes"] == 1_117_320_768
    page = (ROOT / "docs" / "models.md").read_text(encoding="utf-8")
    assert bench_embedded_cost.cost_markdown(record) in page
    assert f"`{record['command']}`" in page and record["commit"][:12] in page


def test_the_stage1_dtype_agreement_on_the_models_page_is_the_committed_record():
    """Issue 89, item 2: a whole exact Stage 1 of the embedded Qwen in float32 and in bfloat16, as
    docs/models.md states it, is benchmarks/bench_stage1_dtype.py's committed record, with its
    command and commit; the record's counts are those of its own selections."""
    import bench_stage1_dtype

    record = json.loads((ROOT / "benchmarks" / "results" / "stage1-dtype-qwen2.5-coder-1.5b.json")
                        .read_text(encoding="utf-8"))
    assert record["dirty"] is False and len(record["commit"]) == 40
    for sign in ("positive", "negative"):
        a = record["agreement"][sign]
        assert a["same_selection"] == (set(a["selected_float32"]) == set(a["selected_bfloat16"]))
        assert a["same_order"] == (a["selected_float32"] == a["selected_bfloat16"]) and a["scores"] == 336 * 3
    page = (ROOT / "docs" / "models.md").read_text(encoding="utf-8")
    assert bench_stage1_dtype.agreement_markdown(record) in page
    assert f"`{record['command']}`" in page and record["commit"][:12] in page


def test_the_front_pages_teach_first_and_leave_the_numbers_to_their_pages():
    """Issue 92: the README and the home page open with what juice does and the quick start with
    its output, then point to Results and When to steer; they state the findings in words, with
    no interval and no verdict sentence (those are on their pages, from the records)."""
    import when_to_steer_study

    record = json.loads((ROOT / "benchmarks" / "results" / "when-to-steer-published.json").read_text(encoding="utf-8"))
    for name, links in (("README.md", ("docs/results.md", "docs/when-to-steer.md")),
                        ("docs/index.md", ("results.md", "when-to-steer.md"))):
        text = (ROOT / name).read_text(encoding="utf-8")
        assert text.index("for method, direction in runs:") < text.index(f"]({links[0]})"), name   # teach, then point
        assert not re.search(r"\[[+-]?\d+\.\d+, [+-]?\d+\.\d+\]|±", text), name   # no interval on a front page
        flat = " ".join(text.split())
        assert not any(s in flat for s in when_to_steer_study.verdict_sentences(record)), name
        for link in links:
            assert f"]({link})" in text, (name, link)
    page = (ROOT / "docs" / "when-to-steer.md").read_text(encoding="utf-8")
    verdict = page[page.index("## The verdict"):]
    plain = verdict[:verdict.index(when_to_steer_study.verdict_sentences(record)[0][:40])]
    assert "In plain words" in plain and not NUMBER.search(plain)   # words first, then the numbers


def test_the_tristate_parity_table_on_its_page_is_the_committed_record():
    """docs/tristate.md's parity table (juice's CAD, AdaCAD, CoCoA, COIECD and GRD against the
    benchmark's own decoding functions) is the committed record's, with its command and commit;
    the page gives the number of outputs of juice's default AdaCAD that differ (bits against their
    nats), and with nats none does."""
    import tristate_parity

    record = json.loads((ROOT / "benchmarks" / "results" / "tristate-parity-gemma-3-270m.json")
                        .read_text(encoding="utf-8"))
    assert record["command"].startswith("python benchmarks/tristate_parity.py") and len(record["commit"]) == 40
    assert not record["dirty"] and record["theirs"]["commit"].startswith("581a4d5")
    assert all(r["n"] == 50 for per_state in record["results"].values() for r in per_state.values())
    page = (ROOT / "docs" / "tristate.md").read_text(encoding="utf-8")
    assert tristate_parity.parity_markdown(record) in page
    command = record["command"].replace("../shared/data/tristate", "conflict-aware-decoding/data/TriState")
    assert f"`{command}`" in page and record["commit"][:12] in page   # the data as a user's clone names it
    differ = {name: sum(len(r["differ"]) for r in per_state.values()) for name, per_state in record["results"].items()}
    first_line = sum(d["juice"].split("\n")[0].strip() != d["theirs"].split("\n")[0].strip()
                     for r in record["results"]["adacad"].values() for d in r["differ"])
    assert (f"with\nbits, {differ['adacad']} of 150 outputs differ, {first_line} of them on the first line"
            in page and differ["adacad-nats"] == 0)


def test_the_tristate_screening_on_its_page_is_the_committed_record():
    """Issue 90, item 1: docs/tristate.md's screening of Gemma 3 270M (label counts, state sizes
    and the sentence that reads them) is the committed record's, whose counts and states follow
    from its own per-fact labels (every screened fact has both passages: correction holds the
    facts labelled wrong, resistance and agreement those labelled right)."""
    import tristate_screening

    record = json.loads((ROOT / "benchmarks" / "results" / "tristate-screening-gemma-3-270m.json")
                        .read_text(encoding="utf-8"))
    assert record["command"].startswith("python benchmarks/tristate_screening.py") and len(record["commit"]) == 40
    assert not record["dirty"] and record["model"] == "gemma-3-270m"
    priors = [label["prior"] for label in record["labels"].values()]
    counts = record["counts"]
    assert len(priors) == record["facts_screened"] == counts["total"] == 696
    assert {k: priors.count(k) for k in ("P_right", "P_wrong", "P_uncertain")} == {
        k: counts[k] for k in ("P_right", "P_wrong", "P_uncertain")}
    assert sum(t["total"] for t in counts["by_type"].values()) == counts["total"]
    assert record["states"] == {"correction": counts["P_wrong"], "resistance": counts["P_right"],
                                "agreement": counts["P_right"]}
    page = (ROOT / "docs" / "tristate.md").read_text(encoding="utf-8")
    assert tristate_screening.screening_markdown(record) in page
    command = record["command"].replace("../shared/data/tristate", "conflict-aware-decoding/data/TriState")
    assert f"`{command}`" in page and record["commit"][:7] in page
    right, total = counts["P_right"], counts["total"]
    assert (f"The model's prior is right on {right} of the {total} facts, so resistance and agreement hold {right} "
            f"facts each\nand correction {counts['P_wrong']}") in page


def test_the_tristate_measurement_on_its_page_is_the_committed_record():
    """Issue 90, item 3: docs/tristate.md's table and verdict for Gemma 3 270M are the committed
    record's, as juice.pipeline.tristate renders them; each cell's exact match is the share of 1s
    in its per-fact string, over the state's test facts; the states are the screening record's."""
    from juice.pipeline.tristate import benchmark_markdown, verdict_markdown

    results = ROOT / "benchmarks" / "results"
    record = json.loads((results / "tristate-gemma-3-270m.json").read_text(encoding="utf-8"))
    screening = json.loads((results / "tristate-screening-gemma-3-270m.json").read_text(encoding="utf-8"))
    assert record["command"].startswith("python benchmarks/tristate_measurement.py") and len(record["commit"]) == 40
    assert not record["dirty"] and record["fingerprint"] == screening["fingerprint"]
    assert {s: v["all"] for s, v in record["states"].items()} == screening["states"]
    for state, rows in record["table"].items():
        assert all(v["validation"] + v["test"] == v["all"] for v in record["states"].values())
        for method, row in rows.items():
            em = row["em_by_fact"]
            assert len(em) == row["em"]["n"] == record["states"][state]["test"], (state, method)
            assert row["em"]["mean"] == pytest.approx(em.count("1") / len(em)), (state, method)
    page = (ROOT / "docs" / "tristate.md").read_text(encoding="utf-8")
    assert benchmark_markdown(record) in page and verdict_markdown(record) in page
    command = record["command"].replace("../shared/data/tristate", "conflict-aware-decoding/data/TriState")
    assert f"`{command}`" in page and record["commit"][:7] in page
    # the page's sentences: JuNE and JuICE below GRD on correction, auto level with it, no best on every state
    versus = record["verdict"]["versus"]
    for name in ("JuNE-mem", "JuNE-ctx", "JuICE-mem", "JuICE-ctx"):
        assert versus[f"{name} - GRD"]["correction"]["high"] < 0, name
    auto = versus["auto-mem - GRD"]["correction"]
    assert auto["low"] <= 0 <= auto["high"]
    assert len(set(record["verdict"]["best"].values())) == 3
    assert {"CoCoA", "COIECD", "AdaCAD", "CK-PLUG", "GRD", "Original"} <= set(record["verdict"]["within"]["correction"])


def test_the_results_page_is_the_committed_record_of_its_four_runs():
    """Issue 89, item 3: every table of docs/results.md (Table 1 and Table 2, under the paper's
    protocol and with the degeneration margin: accuracy, correct and not degenerate, the degenerate
    share, the paired differences, the heads, the choices, the validation-vs-test shares) is the
    record's, as benchmarks/results_page.py renders it; the page names each run's command and the
    commit the runs came from."""
    import results_page

    record = json.loads(results_page.RECORD.read_text(encoding="utf-8"))
    assert record["model"]["name"] == "gemma-3-270m" and len(record["runs_commit"]) == 40
    assert set(record["runs"]) == set(results_page.RUNS)
    page = results_page.PAGE.read_text(encoding="utf-8")
    records = results_page.records()
    assert records[0] == record
    rendered = results_page.page_blocks(records)
    others = records[1:]   # each another model's tables, its provenance; one verdict; the models side by side
    assert len(results_page.blocks(record)) == 20
    assert len(rendered) == 21 + sum(len(results_page.blocks(r)) + 1 for r in others) + (len(others) > 0)
    for name, text in rendered.items():
        assert results_page.marked(name, text) in page, name
    assert results_page.write_page(page, rendered) == page   # no marked block the record does not render
    unclosed = page.replace("<!-- /record -->", "", 1)   # a lost closing marker replaces nothing
    with pytest.raises(KeyError, match="do not pair up"):
        results_page.write_page(unclosed, rendered)
    for command, _ in results_page.RUNS.values():
        assert f"`{command}`" in page, command
    assert record["runs_commit"][:12] in page


def test_another_models_record_holds_both_tables_with_each_runs_command_and_commits():
    """Issue 89, item 3: the 1.5B model's record (and any other `results-*.json`) holds Table 1 and
    Table 2 under the paper's protocol, each with the command it ran and the full commits it
    started and resumed at, of one model named as its file; the page states which weights the
    runs had, read from the fingerprint."""
    import results_page

    others = results_page.records()[1:]
    assert [r["model"]["name"] for r in others] == ["qwen2.5-coder-1.5b"]
    for record in others:
        assert {"table1", "table2"} <= set(record["runs"]) <= set(results_page.RUNS)
        assert len(record["record"]["commit"]) == 40 and record["record"]["dirty"] is False
        for run in record["runs"].values():
            assert run["command"].startswith(f"juice reproduce --model {record['model']['name']}")
            assert run["commits"] and all(re.fullmatch(r"[0-9a-f]{40}", c) for c in run["commits"])
            assert run["degeneration_margin"] is None   # the paper's protocol
        assert results_page.weights_line(record["model"]) in results_page.about(record)
    rounded = {"weights_sha256_16": "ab", "weights_bf16_sha256_16": "ab"}
    assert "rounded to bfloat16" in results_page.weights_line(rounded)
    assert "rounded" not in results_page.weights_line({**rounded, "weights_sha256_16": "cd"})


def test_the_weights_rounding_on_the_results_page_is_the_committed_record():
    """Issue 89: the 1.5B model's runs had bfloat16-rounded weights; docs/results.md states what
    float32 weights change on one domain's test split, as benchmarks/bench_weights_rounding.py's
    committed record has it, and the record's counts are within its prompts."""
    import bench_weights_rounding

    record = json.loads((ROOT / "benchmarks" / "results" / "weights-rounding-qwen2.5-coder-1.5b.json")
                        .read_text(encoding="utf-8"))
    assert record["dirty"] is False and len(record["commit"]) == 40
    rounded, exact = record["fingerprints"]["bfloat16-rounded"], record["fingerprints"]["float32"]
    assert rounded["weights_sha256_16"] == record["run_fingerprint"]["weights_sha256_16"] != exact["weights_sha256_16"]
    for part in ("float32_vs_rounded", "rounded_vs_run"):
        for c in record[part].values():
            assert 0 <= c["outputs_equal"] <= c["exact_match_equal"] <= c["prompts"]
    page = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    assert bench_weights_rounding.sentence(record) in page


def test_the_verdict_on_the_papers_ordering_reads_each_interval_and_names_every_model():
    """Issue 89, item 3: the results page states, from the intervals, whether JuICE is above JuNE
    and PH3 on substitution and coherent conflicts and above CAD and JuNE on the contextual
    average; a second model's record adds its column and its tables under its name."""
    import copy

    import results_page

    record = json.loads(results_page.RECORD.read_text(encoding="utf-8"))
    rows = results_page.ordering(record)
    assert [(r["against"], r["group"]) for r in rows] == [
        ("JuNE", "substitution"), ("JuNE", "coherent"), ("PH3-l", "substitution"), ("PH3-l", "coherent"),
        ("PH3-s", "substitution"), ("PH3-s", "coherent"), ("CAD", "context"), ("JuNE", "context")]
    for r in rows:
        iv = r["interval"]
        assert r["reading"] == ("above" if iv.low > 0 else "below" if iv.high < 0 else "level")
    assert results_page.ordering_verdict(rows) == (
        "holds" if all(r["reading"] == "above" for r in rows)
        else "contradicted" if any(r["reading"] == "below" for r in rows) else "not shown")
    shifted = copy.deepcopy(record)   # every comparison moved well above 0, then one below it
    shifted["model"]["name"] = "bigger"
    for table, against, groups in results_page.ORDERING:
        for g in groups:
            cell = shifted["runs"][table]["scores"]["table"]["differences"][f"JuICE - {against}"]["Average"][g]
            cell.update(mean=0.5, low=0.4, high=0.6)
    assert results_page.ordering_verdict(results_page.ordering(shifted)) == "holds"
    cell["low"], cell["mean"], cell["high"] = -0.3, -0.2, -0.1
    assert results_page.ordering_verdict(results_page.ordering(shifted)) == "contradicted"
    both = results_page.page_blocks([record, shifted])
    assert "bigger-table1-accuracy" in both and both["table1-accuracy"] == results_page.blocks(record)["table1-accuracy"]
    assert "| JuICE minus | conflict | `gemma-3-270m` | `bigger` |" in both["ordering"]
    assert "- `bigger`: **contradicted** (JuICE above in 7 of 8 comparisons, level in 0, below in 1)." in both["ordering"]
    page = results_page.PAGE.read_text(encoding="utf-8")
    with pytest.raises(KeyError, match="bigger-table1-accuracy"):   # its tables need their place on the page
        results_page.write_page(page, both)


def test_the_dual_runs_before_and_after_on_the_vllm_page_is_the_committed_record():
    """Issue 93: JuICE's run 1 run separately against run 1 as shadow rows, each against stock
    vLLM measured in the same run, and the caps from the model's parameter counts."""
    import vllm_dual_run

    record = json.loads((ROOT / "benchmarks" / "results" / "vllm-dual-run-gemma-3-270m.json").read_text(encoding="utf-8"))
    assert len(record["commands"]) == len(record["measured"]["after"]) == len(record["measured"]["before"]) >= 2
    assert all(c.startswith("python benchmarks/bench_vllm_modes.py") for c in record["commands"])
    assert all(len(record["commits"][side]) == 40 for side in ("before", "after"))
    assert {(r["batch"], r["mix"]) for r in record["ratios"] if "after" in r and "before" in r} == {
        (b, m) for b in (1, 8, 32) for m in vllm_dual_run.MIXES}
    page = (ROOT / "docs" / "vllm.md").read_text(encoding="utf-8")
    assert vllm_dual_run.markdown(record) in page
    assert all(f"`{c}`" in page for c in record["commands"])
    assert record["commits"]["before"][:12] in page and record["commits"]["after"][:12] in page
    caps = record["caps"]
    for value in (caps["separate"], caps["shadow_arithmetic_bound"]):
        assert f"{value}x" in page
