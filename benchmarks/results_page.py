"""The record of docs/results.md (issue 89, item 3): the embedded Gemma 3 270M's Table 1 and
Table 2, each under the paper's protocol and with the degeneration margin, as compact cells (mean,
95% bootstrap bounds, n) with the heads, the per-domain choices and the paired differences; and
the page's tables rendered from that record (:func:`blocks`), which tests/unit/test_published_results.py
finds in the page.

The four runs are `juice reproduce` with the defaults (:data:`RUNS` gives each command), in one
folder RUNS_DIR (their `--out` folders, juice-output/ and juice-output-margin/, beside each other).

Another model's record holds its paper's-protocol runs (the margin runs are optional), each
given with its results file, its command and the commits it started and resumed at
(`record-model`); the page shows its tables under its name, its provenance (:func:`about`) and
every model's accuracy side by side (:func:`side_by_side`).

Run:
  python benchmarks/results_page.py record RUNS_DIR --runs-commit COMMIT --record benchmarks/results/results-gemma-3-270m.json
  python benchmarks/results_page.py record-model --run table1 RESULTS.json "COMMAND" SHA[,SHA...] \
      --run table2 RESULTS_CONTEXTUAL.json "COMMAND" SHA[,...] --runs-env TEXT --record benchmarks/results/results-MODEL.json
  python benchmarks/results_page.py page [--record ...] [--write docs/results.md]
    (prints the blocks; --write replaces each block between its markers in the page; every other
    `results-*.json` beside the record adds its model's tables and its column of the verdict on
    the paper's ordering, :func:`ordering`)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
RECORD = HERE / "results" / "results-gemma-3-270m.json"
PAGE = HERE.parent / "docs" / "results.md"

RUNS = {   # key -> (command, results file under RUNS_DIR)
    "table1": ("juice reproduce --out juice-output", "juice-output/results.json"),
    "table1_margin": ("juice reproduce --degeneration-margin 10 --out juice-output-margin",
                      "juice-output-margin/results.json"),
    "table2": ("juice reproduce --direction contextual --out juice-output", "juice-output/results_contextual.json"),
    "table2_margin": ("juice reproduce --direction contextual --degeneration-margin 10 --out juice-output-margin",
                      "juice-output-margin/results_contextual.json"),
}
SCORES = ("table", "correct_not_degenerate", "degeneration")
"""A run's three interval tables: accuracy (the paper's exact match), correct and not degenerate,
the degenerate share."""
TYPES = ("clean", "substitution", "coherent")


def compact(results: dict) -> dict:
    """One run's record: its methods in table order, its domains in run order, heads, per-domain
    choices and the three interval tables' cells and paired differences, from its results file
    (Table 1: the averages over the domains, as the page shows; Table 2: every dataset too)."""
    table = results["table"]
    methods = list(table["cells"])
    contextual = "context" in table["cells"][methods[0]]["Average"]
    keep = lambda cells: {name: {col: gs for col, gs in cols.items() if contextual or col == "Average"}  # noqa: E731
                          for name, cols in cells.items()}
    choices = {d: {"juice": [c["betas"]["juice"]["beta_plus"], c["betas"]["juice"]["beta_minus"]],
                   "june": [c["betas"]["june"]["beta_plus"], c["betas"]["june"]["beta_minus"]],
                   "ph3_k": {row: p["k"] for row, p in c.get("prune", {}).items()}}
               for d, c in results["choices"].items()}
    return {"methods": methods, "domains": list(results["choices"]), "model": results["model"],
            "heads": results["heads"], "choices": choices,
            "degeneration_margin": results["config"].get("degeneration_margin"),
            "scores": {s: {"cells": keep(results[s]["cells"]),
                           "differences": {name: {"Average": cols["Average"]}
                                           for name, cols in results[s]["differences"].items()}}
                       for s in SCORES}}


def _interval(cell: dict):
    from juice.eval.stats import Interval

    return Interval.from_json(cell)


def _table(score: dict):
    from juice.eval.tables import IntervalTable

    conv = lambda c: {a: {col: {g: _interval(iv) for g, iv in gs.items()} for col, gs in cols.items()}   # noqa: E731
                      for a, cols in c.items()}
    return IntervalTable(conv(score["cells"]), conv(score["differences"]), 2000, 0.95, 0)


def _titles() -> dict[str, str]:
    """Every ParaConflict domain's and contextual dataset's column title."""
    from juice.data.contextual import dataset_titles
    from juice.data.paraconflict import DOMAINS

    return {**{d: DOMAINS[d].title for d in DOMAINS}, **dataset_titles()}


def _betas(run: dict, titles: dict[str, str], ph3_rows: tuple[str, ...]) -> str:
    """'Athlete Sport (0, -2) / (3, -1), ...; PH3-l k = 3, 5, ...' in the run's domain order."""
    pair = lambda b: f"({b[0]:g}, {b[1]:g})"   # noqa: E731
    text = ", ".join(f"{titles.get(d, d)} {pair(run['choices'][d]['juice'])} / {pair(run['choices'][d]['june'])}"
                     for d in run["domains"])
    ks = [f"{row} k = " + ", ".join(str(run["choices"][d]["ph3_k"][row]) for d in run["domains"])
          for row in ph3_rows if all(row in run["choices"][d]["ph3_k"] for d in run["domains"])]
    return text + ("; " + " and ".join(ks) if ks else "")


def _diff(iv) -> str:
    mean, low, high = (round(100 * v, 1) + 0.0 for v in (iv.mean, iv.low, iv.high))
    mark = "*" if iv.low > 1e-9 or iv.high < -1e-9 else ""
    return f"{mean:+.1f} [{low:+.1f}, {high:+.1f}]{mark}"


def blocks(record: dict) -> dict[str, str]:
    """The page's tables and the lines that state the runs' heads and choices, rendered from the
    record: block name -> Markdown (each held verbatim between the page's markers)."""
    from juice.eval.report import difference_markdown, interval_markdown

    out: dict[str, str] = {}
    one, one_m = record["runs"]["table1"], record["runs"].get("table1_margin")
    two, two_m = record["runs"]["table2"], record["runs"].get("table2_margin")
    titles = _titles()
    avg = [("Average", t) for t in TYPES]
    t = {s: _table(one["scores"][s]) for s in SCORES}
    out["table1-accuracy"] = interval_markdown(t["table"], one["methods"], avg, list(TYPES))
    out["table1-correct-not-degenerate"] = interval_markdown(t["correct_not_degenerate"], one["methods"], avg,
                                                             list(TYPES))
    out["table1-degenerate"] = interval_markdown(t["degeneration"], one["methods"], avg, list(TYPES), bold=False)
    out["table1-differences"] = difference_markdown(t["table"], avg, list(TYPES))
    out["table1-differences-correct-not-degenerate"] = difference_markdown(t["correct_not_degenerate"], avg,
                                                                           list(TYPES))
    heads = lambda run: (f"+ {', '.join(run['heads']['positive'])}; - {', '.join(run['heads']['negative'])}")  # noqa: E731
    out["table1-choices"] = (f"Heads (exact Stage 1 on World Capital's D): {heads(one)}. Per-domain (beta+, beta-) "
                             f"for JuICE / JuNE: {_betas(one, titles, ('PH3-l',))} in the same order.\n")
    if one_m is None:
        return out | table2_blocks(two, two_m, titles, heads)
    tm = {s: _table(one_m["scores"][s]) for s in SCORES}

    def triple(table, m) -> str:
        return " / ".join(f"{100 * table.cells[m]['Average'][g].mean:.1f}" for g in TYPES)

    rows = ["| Method | accuracy 1/2/3, paper | accuracy 1/2/3, margin 10 | degenerate 1/2/3, margin 10 | "
            "correct and not degenerate 1/2/3, margin 10 |", "|---|---|---|---|---|"]
    for m in one["methods"]:
        rows.append(f"| {m} | {triple(t['table'], m)} | {triple(tm['table'], m)} | {triple(tm['degeneration'], m)} | "
                    f"{triple(tm['correct_not_degenerate'], m)} |")
    n = t["table"].cells[one["methods"][0]]["Average"]["clean"].n
    rows.append(f"| n | {n} each | {n} each | {n} each | {n} each |")
    out["table1-margin"] = "\n".join(rows) + "\n"
    juice_orig = tm["table"].differences["JuICE - Original"]["Average"]
    out["table1-margin-choices"] = (
        "JuICE - Original with the margin: " + ", ".join(_diff(juice_orig[g]) for g in TYPES) + " (accuracy);\n"
        f"per-domain (beta+, beta-) for JuICE / JuNE: {_betas(one_m, titles, ('PH3-l',))}.\n")
    return out | table2_blocks(two, two_m, titles, heads)


def table2_blocks(two: dict, two_m: dict | None, titles: dict[str, str], heads) -> dict[str, str]:
    """Table 2's blocks of :func:`blocks`: the paper's protocol, and with the margin where the
    record has that run (`two_m`)."""
    from juice.eval.report import interval_markdown

    out: dict[str, str] = {}
    cols2 = [(d, "context") for d in two["domains"]]
    u = {s: _table(two["scores"][s]) for s in SCORES}
    rows = ["| Method | accuracy | correct and not degenerate | degenerate |", "|---|---|---|---|"]
    for m in two["methods"]:
        rows.append(f"| {m} | " + " | ".join(u[s].cells[m]["Average"]["context"].format() for s in SCORES) + " |")
    n2 = u["table"].cells[two["methods"][0]]["Average"]["context"].n
    rows.append(f"| n | {n2} | {n2} | {n2} |")
    out["table2-average"] = "\n".join(rows) + "\n"
    heads2 = [titles.get(d, d) for d in two["domains"]]
    out["table2-accuracy"] = interval_markdown(u["table"], two["methods"], cols2, heads2, bold=False)
    out["table2-degenerate"] = interval_markdown(u["degeneration"], two["methods"], cols2, heads2, bold=False)
    out["table2-correct-not-degenerate"] = interval_markdown(u["correct_not_degenerate"], two["methods"], cols2,
                                                             heads2, bold=False)
    rows = ["| Comparison | accuracy | correct and not degenerate |", "|---|---|---|"]
    for name, cols in u["table"].differences.items():
        rows.append(f"| {name} | {_diff(cols['Average']['context'])} | "
                    f"{_diff(u['correct_not_degenerate'].differences[name]['Average']['context'])} |")
    out["table2-differences"] = "\n".join(rows) + "\n"
    out["table2-choices"] = (f"Heads: {heads(two)}. Per-dataset (beta+, beta-) for JuICE / JuNE: "
                             f"{_betas(two, titles, ('PH3-l', 'PH3-s'))} in the same order.\n")
    if two_m is None:
        return out | {"table2-validation": validation_block(two, titles)}
    um = {s: _table(two_m["scores"][s]) for s in SCORES}
    for s, name in (("table", "accuracy"), ("correct_not_degenerate", "correct-not-degenerate"),
                    ("degeneration", "degenerate")):
        rows = ["| Method | paper's protocol | margin 10 |", "|---|---|---|"]
        for m in two["methods"]:
            rows.append(f"| {m} | {u[s].cells[m]['Average']['context'].format()} | "
                        f"{um[s].cells[m]['Average']['context'].format()} |")
        rows.append(f"| n | {n2} | {n2} |")
        out[f"table2-margin-{name}"] = "\n".join(rows) + "\n"
    d = {s: um[s].differences for s in ("table", "correct_not_degenerate")}
    pick = lambda s, m: _diff(d[s][f"{m} - Original"]["Average"]["context"])   # noqa: E731
    out["table2-margin-choices"] = (
        f"With the margin, against Original: JuICE {pick('table', 'JuICE')} on accuracy and "
        f"{pick('correct_not_degenerate', 'JuICE')} on correct and not degenerate; JuNE {pick('table', 'JuNE')} and "
        f"{pick('correct_not_degenerate', 'JuNE')}. Chosen (beta+, beta-) for JuICE / JuNE: "
        f"{_betas(two_m, titles, ('PH3-l', 'PH3-s'))}.\n")
    out["table2-validation"] = validation_block(two, titles)
    out["table2-margin-validation"] = validation_block(two_m, titles)
    return out


def validation_block(run: dict, titles: dict[str, str]) -> str:
    """Per dataset and steering method, the chosen setting's degenerate share on validation (with
    its 95% interval) beside Original's and the test split's."""
    rows = ["| Dataset | Method | (beta+, beta-) | Validation [95%] | Original (validation) | Test |",
            "|---|---|---|---|---|---|"]
    for r in run["validation_degeneration"]:
        low, high = r["validation_interval"]
        rows.append(f"| {titles.get(r['domain'], r['domain'])} | {r['method']} | ({r['beta_plus']:g}, "
                    f"{r['beta_minus']:g}) | {r['validation']:.1f} [{low:.1f}, {high:.1f}] | "
                    f"{r['original_validation']:.1f} | {r['test']:.1f} |")
    return "\n".join(rows) + "\n"


ORDERING = (("table1", "JuNE", ("substitution", "coherent")), ("table1", "PH3-l", ("substitution", "coherent")),
            ("table1", "PH3-s", ("substitution", "coherent")), ("table2", "CAD", ("context",)),
            ("table2", "JuNE", ("context",)))
"""The paper's ordering (Sec. 5, Tables 1 and 2) as paired comparisons: JuICE above JuNE and PH3 (both of
juice's variants) on substitution and coherent conflicts (Table 1, the average over the domains), and
above CAD and JuNE on the contextual average (Table 2): (table, method JuICE is compared with, groups)."""


def ordering(record: dict) -> list[dict]:
    """Each comparison of :data:`ORDERING` in one record's runs under the paper's protocol: the paired
    difference JuICE - method (accuracy, the average column) with its 95% bootstrap interval and
    its reading: "above" (the interval lies above 0), "below" (under 0) or "level" (it holds 0).

    Raises:
        KeyError: a run or comparison the record lacks."""
    rows = []
    for table, against, groups in ORDERING:
        diffs = record["runs"][table]["scores"]["table"]["differences"][f"JuICE - {against}"]["Average"]
        for group in groups:
            iv = _interval(diffs[group])
            reading = "above" if iv.low > 1e-9 else "below" if iv.high < -1e-9 else "level"
            rows.append({"table": table, "against": against, "group": group, "interval": iv, "reading": reading})
    return rows


def ordering_verdict(rows: list[dict]) -> str:
    """"holds" where JuICE is above in every comparison, "contradicted" where it is below in one,
    else "not shown" (an interval holds 0: these n cannot tell)."""
    readings = [r["reading"] for r in rows]
    return "holds" if all(r == "above" for r in readings) else "contradicted" if "below" in readings else "not shown"


def ordering_block(records: list[dict]) -> str:
    """The page's verdict on the paper's ordering, one column per model (:func:`ordering`), then one
    line per model with its verdict (:func:`ordering_verdict`) and its counts."""
    names = [r["model"]["name"] for r in records]
    per = [ordering(r) for r in records]
    where = {"table1": "Table 1", "table2": "Table 2"}
    rows = ["| JuICE minus | conflict | " + " | ".join(f"`{n}`" for n in names) + " |",
            "|---|---|" + "---|" * len(names)]
    for k, row in enumerate(per[0]):
        group = "contextual average" if row["group"] == "context" else row["group"]
        rows.append(f"| {row['against']} | {group} ({where[row['table']]}) | "
                    + " | ".join(f"{_diff(p[k]['interval'])} {p[k]['reading']}" for p in per) + " |")
    lines = []
    for name, p in zip(names, per):
        counts = {r: sum(x["reading"] == r for x in p) for r in ("above", "level", "below")}
        lines.append(f"- `{name}`: **{ordering_verdict(p)}** (JuICE above in {counts['above']} of {len(p)} "
                     f"comparisons, level in {counts['level']}, below in {counts['below']}).")
    return "\n".join(rows) + "\n\n" + "\n".join(lines) + "\n"


def side_by_side(records: list[dict]) -> str:
    """Every model's accuracy under the paper's protocol, one column pair per record: Table 1's
    average over the domains per conflict type (clean / substitution / coherent) and Table 2's
    contextual average, each mean with n; "-" where a model's run lacks the method."""
    names = [r["model"]["name"] for r in records]
    methods = list(dict.fromkeys(m for r in records for t in ("table1", "table2") for m in r["runs"][t]["methods"]))
    rows = ["| Method | " + " | ".join(f"`{n}` Table 1, 1/2/3 | `{n}` Table 2" for n in names) + " |",
            "|---|" + "---|---|" * len(names)]

    def mean(record: dict, table: str, m: str, group: str) -> str:
        cells = record["runs"][table]["scores"]["table"]["cells"]
        return f"{100 * cells[m]['Average'][group]['mean']:.1f}" if m in cells else "-"

    for m in methods:
        rows.append(f"| {m} | " + " | ".join(" / ".join(mean(r, "table1", m, g) for g in TYPES) + " | "
                                             + mean(r, "table2", m, "context") for r in records) + " |")
    ns = []
    for r in records:
        first = lambda t: r["runs"][t]["scores"]["table"]["cells"][r["runs"][t]["methods"][0]]["Average"]  # noqa: E731
        ns.append(f"{first('table1')['clean']['n']} each | {first('table2')['context']['n']}")
    rows.append("| n | " + " | ".join(ns) + " |")
    return "\n".join(rows) + "\n"


def weights_line(fingerprint: dict) -> str:
    """What weights a record's runs had, read from its model's fingerprint: equal exact and
    bfloat16 checksums mean the weights were rounded to bfloat16 (juice 0.4.0 cached a GGUF's
    conversion at the dtype of the model's first load; :data:`juice.models.CONVERSION_DTYPE`)."""
    from juice.models import rounded_to_bfloat16

    exact = fingerprint["weights_sha256_16"]
    if not rounded_to_bfloat16(fingerprint):
        return f"float32 weights (checksum `{exact}`), computed in float32"
    return (f"the GGUF's weights rounded to bfloat16, computed in float32 (the fingerprint's exact and "
            f"bfloat16 checksums are both `{exact}`: the machine's cached conversion was made by a first "
            "load at bfloat16, which juice 0.4.0 cached as such). A load today dequantizes at float32: "
            "the same bfloat16 checksum, so the same shipped heads, but weights a rounding apart, so "
            "these cells are not bit for bit what a run today gives")


def about(record: dict) -> str:
    """A non-first record's provenance on the page: its model, weights, runs (command, the commits
    it started and resumed at) and how this record was made."""
    def commits(run: dict) -> list[str]:   # a record of :func:`record_runs` has one commit for all its runs
        return run.get("commits") or [record["runs_commit"]]

    runs = "; ".join(f"`{run['command']}` (started at `{commits(run)[0][:12]}`"
                     + (", resumed at " + ", ".join(f"`{c[:12]}`" for c in commits(run)[1:]) if commits(run)[1:]
                        else "") + ")" for run in record["runs"].values())
    return (f"Model `{record['model']['name']}`: {weights_line(record['model'])}. Runs: {runs}; "
            f"{record['runs_env']}. Record: `{record['command'].split(' --')[0]} ...` (its whole command is in the "
            f"record), at `{record['record']['commit'][:12]}`.\n")


def page_blocks(records: list[dict]) -> dict[str, str]:
    """Every block of the page: the first record's tables (:func:`blocks`), each other record's
    under its model's name (`<name>-table1-accuracy`, ...) with its provenance (`<name>-about`,
    :func:`about`), the verdict on the paper's ordering over all of them (`ordering`,
    :func:`ordering_block`) and, with two or more, their accuracies side by side (`models`,
    :func:`side_by_side`)."""
    out = dict(blocks(records[0]))
    for record in records[1:]:
        name = record["model"]["name"]
        out.update({f"{name}-{k}": v for k, v in blocks(record).items()})
        out[f"{name}-about"] = about(record)
    out["ordering"] = ordering_block(records)
    if len(records) > 1:
        out["models"] = side_by_side(records)
    return out


def records(first: Path = RECORD) -> list[dict]:
    """The page's records: `first` (Gemma 3 270M's), then every other `results-*.json` beside it,
    by name."""
    paths = [first] + sorted(p for p in first.parent.glob("results-*.json") if p != first)
    return [json.loads(p.read_text(encoding="utf-8")) for p in paths]


def marked(name: str, text: str) -> str:
    """A block as the page holds it, between its markers (HTML comments: not shown)."""
    return f"<!-- record {name} -->\n\n{text}\n<!-- /record -->"


def write_page(page: str, rendered: dict[str, str]) -> str:
    """`page` with each marked block replaced by its rendering.

    Raises:
        KeyError: the page marks a block the record does not render, lacks one it renders, marks
            one twice, or has an opening marker without its closing one (nothing is replaced).
    """
    block = re.compile(r"<!-- record ([\w.-]+) -->\n(?:(?!<!-- record ).)*?<!-- /record -->", re.S)
    opened = re.findall(r"<!-- record ([\w.-]+) -->", page)
    closed = [m.group(1) for m in block.finditer(page)]
    if closed != opened or page.count("<!-- /record -->") != len(opened) or len(set(opened)) != len(opened):
        raise KeyError(f"the page's markers do not pair up: opened {opened}, closed {closed}")
    missing = sorted(set(rendered) - set(opened))
    unknown = sorted(set(opened) - set(rendered))
    if missing or unknown:
        raise KeyError(f"blocks the page lacks: {missing}; blocks the record does not render: {unknown}")
    return block.sub(lambda m: marked(m.group(1), rendered[m.group(1)]), page)


def _run_entry(key: str, command: str, file: Path, **extra) -> dict:
    """One run of a record: its command, `extra`, its compact results (:func:`compact`) and, for
    Table 2, the chosen settings' degenerate share on validation and on test."""
    from degeneration_labels import predict

    entry = {"command": command, **extra, **compact(json.loads(file.read_text(encoding="utf-8")))}
    if key.startswith("table2"):
        entry["validation_degeneration"] = predict(file)
    return entry


def _one_model(runs: dict) -> dict:
    """The model all `runs` are of, taken out of each.

    Raises:
        SystemExit: runs of different models."""
    models = {json.dumps(r.pop("model"), sort_keys=True) for r in runs.values()}
    if len(models) != 1:
        raise SystemExit("the runs are not of one model")
    return json.loads(models.pop())


def record_runs(runs_dir: Path, runs_commit: str) -> dict:
    sys.path.insert(0, str(HERE))
    from _common import git_state

    import juice
    import torch

    runs = {key: _run_entry(key, command, runs_dir / file) for key, (command, file) in RUNS.items()}
    model = _one_model(runs)
    return {"command": f"python benchmarks/results_page.py record RUNS_DIR --runs-commit {runs_commit}",
            "runs_commit": runs_commit, "runs_env": "one thread each (OMP_NUM_THREADS=1), in a folder outside the "
            "checkout with JUICE_DATA=../shared/data, two runs side by side on 2 cores", "record": git_state(), "juice": juice.__version__, "torch": torch.__version__,
            "date": date.today().isoformat(), "machine": f"{platform.machine()}, 2 CPU cores, one thread per run",
            "model": model, "runs": runs}


def record_model(runs: list[list[str]], runs_env: str, argv: list[str]) -> dict:
    """A record of another model's runs, each given as (key, results file, its command, the
    commits it started and resumed at, comma-separated); keys as in :data:`RUNS`, at least
    table1 and table2 (the margin runs are optional).

    Raises:
        SystemExit: a key outside :data:`RUNS`, table1 or table2 missing, a commit that is not a
            full hash, or runs of different models."""
    sys.path.insert(0, str(HERE))
    from _common import git_state

    import juice
    import torch

    out = {}
    for key, file, command, commits in runs:
        shas = commits.split(",")
        if key not in RUNS or not all(re.fullmatch(r"[0-9a-f]{40}", c) for c in shas):
            raise SystemExit(f"--run {key}: a key of {', '.join(RUNS)} and full commit hashes, comma-separated")
        out[key] = _run_entry(key, command, Path(file), commits=shas)
    if not {"table1", "table2"} <= set(out):
        raise SystemExit("a record needs the table1 and table2 runs")
    model = _one_model(out)
    return {"command": "python benchmarks/results_page.py " + " ".join(map(_quoted, argv)), "runs_env": runs_env,
            "record": git_state(), "juice": juice.__version__, "torch": torch.__version__,
            "date": date.today().isoformat(), "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} CPU cores",
            "model": model, "runs": out}


def _quoted(arg: str) -> str:
    return f"'{arg}'" if re.search(r"[\s,]", arg) else arg


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("runs_dir", type=Path)
    rec.add_argument("--runs-commit", required=True, help="the commit the four runs started from (clean)")
    rec.add_argument("--record", type=Path, default=RECORD)
    other = sub.add_parser("record-model", help="another model's record: its runs given one by one")
    other.add_argument("--run", nargs=4, action="append", required=True,
                       metavar=("KEY", "RESULTS", "COMMAND", "COMMITS"))
    other.add_argument("--runs-env", required=True, help="how the runs were run (threads, machine, data)")
    other.add_argument("--record", type=Path, required=True)
    page = sub.add_parser("page")
    page.add_argument("--record", type=Path, default=RECORD)
    page.add_argument("--write", type=Path, default=None)
    args = parser.parse_args()
    if args.what == "record":
        from juice.io import write_json_atomic

        write_json_atomic(args.record, record_runs(args.runs_dir, args.runs_commit))
        print(f"wrote {args.record}")
        return 0
    if args.what == "record-model":
        from juice.io import write_json_atomic

        write_json_atomic(args.record, record_model(args.run, args.runs_env, sys.argv[1:]))
        print(f"wrote {args.record}")
        return 0
    rendered = page_blocks(records(args.record))
    if args.write:
        args.write.write_text(write_page(args.write.read_text(encoding="utf-8"), rendered), encoding="utf-8")
        print(f"wrote {len(rendered)} blocks into {args.write}")
    else:
        for name, text in rendered.items():
            print(marked(name, text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
