"""Checking the degeneration measure against outputs labelled by hand (issue 49).

`sample` draws a stratified sample of outputs from `juice reproduce` results (methods x datasets
x flagged / not flagged by the measure; seeded) into a JSONL file with an empty "label" per
line, for a person to fill with "fluent" or "degenerate" (what a reader of the answer would
call it, not what the measure says). `score` reads a labelled file and prints the measure's
precision and recall against the labels (degenerate = the positive class), overall and per
method, with the rule as it stands in `juice.eval.degeneration` (so a changed rule is scored on
the same labels), and lists the disagreements.

The committed labels: `benchmarks/labels/degeneration.jsonl` (tests/integration/test_degeneration.py holds
the measure to them).

`predict` reads `juice reproduce` results and prints, per dataset (domain) and steering method,
the chosen setting's share of degenerate validation outputs (what tuning saw) beside its share on
the test split, and for each the binomial 95% interval of the validation estimate: whether the
validation split is large enough for tuning to see what the test split shows.

Run: python benchmarks/degeneration_labels.py sample OUT.jsonl RESULTS.json [RESULTS.json ...] [--per-cell 3]
     python benchmarks/degeneration_labels.py score [LABELS.jsonl]
     python benchmarks/degeneration_labels.py predict RESULTS.json [RESULTS.json ...]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import defaultdict
from pathlib import Path

from juice.eval.degeneration import is_degenerate, repeated_share, word_run

LABELS = Path(__file__).resolve().parent / "labels" / "degeneration.jsonl"
CLASSES = ("fluent", "degenerate")


def sample(results: list[Path], per_cell: int, seed: int) -> list[dict]:
    """Up to `per_cell` flagged and `per_cell` unflagged outputs per (method, dataset) of every
    results file, distinct texts only, seeded."""
    rng = random.Random(seed)
    cells: dict[tuple, list[dict]] = defaultdict(list)
    seen: set[str] = set()
    for path in results:
        data = json.loads(path.read_text(encoding="utf-8"))
        direction = "contextual" if path.name.startswith("results_contextual") else "parametric"
        for r in data["items"]:
            text = r["output"]
            if text in seen or not text.strip():
                continue
            seen.add(text)
            flagged = is_degenerate(text)
            cells[direction, r["method"], r["domain"], flagged].append(
                {"direction": direction, "method": r["method"], "domain": r["domain"], "item": r.get("item") or r["subject"],
                 "conflict_type": r["conflict_type"], "output": text, "flagged": flagged, "label": ""})
    out = []
    for key in sorted(cells):
        rows = cells[key]
        rng.shuffle(rows)
        out += rows[:per_cell]
    return out


def read_labels(path: Path) -> list[dict]:
    """The labelled rows.

    Raises:
        ValueError: a row without a label of :data:`CLASSES` (the message names the line).
    """
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        if row.get("label") not in CLASSES:
            raise ValueError(f"{path}:{n}: label must be one of {CLASSES}, not {row.get('label')!r}")
        rows.append(row)
    return rows


def agreement(rows: list[dict]) -> dict:
    """Precision and recall of :func:`juice.eval.degeneration.is_degenerate` against the labels
    (degenerate = positive), with the counts behind them."""
    tp = sum(is_degenerate(r["output"]) and r["label"] == "degenerate" for r in rows)
    fp = sum(is_degenerate(r["output"]) and r["label"] == "fluent" for r in rows)
    fn = sum(not is_degenerate(r["output"]) and r["label"] == "degenerate" for r in rows)
    tn = len(rows) - tp - fp - fn
    return {"n": len(rows), "tp": tp, "fp": fp, "fn": fn, "tn": tn,
            "precision": tp / (tp + fp) if tp + fp else float("nan"),
            "recall": tp / (tp + fn) if tp + fn else float("nan")}


def predict(path: Path) -> list[dict]:
    """Per (domain, method): validation degeneration of the chosen setting (n validation items)
    and the test degeneration (n test outputs), percent, with Wilson 95% intervals."""
    from math import sqrt

    def wilson(share: float, n: int) -> tuple[float, float]:
        if not n:
            return (float("nan"), float("nan"))
        p, z = share / 100, 1.96
        mid, half = (p + z * z / (2 * n)) / (1 + z * z / n), z * sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
        return (max(0.0, 100 * (mid - half)), min(100.0, 100 * (mid + half)))

    data = json.loads(path.read_text(encoding="utf-8"))
    names = {"juice": "JuICE", "june": "JuNE"}
    cells = data["degeneration"]["cells"]
    rows = []
    for domain, choice in data["choices"].items():
        n_val = choice.get("n_validation", 0)
        original = next((g["degeneration"] for g in choice.get("grid", [])
                         if g["method"] == "juice" and g["beta_plus"] == 0 and g["beta_minus"] == 0), float("nan"))
        for m, b in choice["betas"].items():
            groups = cells.get(names[m], {}).get(domain, {})
            test = [g for g in groups.values() if g.get("n")]
            n_test = sum(g["n"] for g in test)
            test_share = 100 * sum(g["mean"] * g["n"] for g in test) / n_test if n_test else float("nan")
            rows.append({"domain": domain, "method": names[m], "beta_plus": b["beta_plus"], "beta_minus": b["beta_minus"],
                         "validation": b["degeneration"], "n_validation": n_val, "original_validation": original,
                         "validation_interval": wilson(b["degeneration"], n_val), "test": test_share, "n_test": n_test})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("sample")
    s.add_argument("out", type=Path)
    s.add_argument("results", type=Path, nargs="+")
    s.add_argument("--per-cell", type=int, default=3)
    s.add_argument("--seed", type=int, default=0)
    c = sub.add_parser("score")
    c.add_argument("labels", type=Path, nargs="?", default=LABELS)
    p = sub.add_parser("predict")
    p.add_argument("results", type=Path, nargs="+")
    args = parser.parse_args(argv)
    if args.command == "predict":
        for path in args.results:
            print(f"{path}: degenerate outputs (%) of the chosen setting, validation [95% interval] vs test")
            for r in predict(path):
                low, high = r["validation_interval"]
                print(f"  {r['domain']:<24} {r['method']:<6} ({r['beta_plus']:g}, {r['beta_minus']:g}): validation "
                      f"{r['validation']:5.1f} [{low:5.1f}, {high:5.1f}] (n {r['n_validation']}, Original "
                      f"{r['original_validation']:.1f}) vs test {r['test']:5.1f} (n {r['n_test']})")
        return 0
    if args.command == "sample":
        rows = sample(args.results, args.per_cell, args.seed)
        args.out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        print(f"{len(rows)} outputs ({sum(r['flagged'] for r in rows)} flagged) -> {args.out}")
        return 0
    rows = read_labels(args.labels)
    total = agreement(rows)
    try:
        shown = args.labels.resolve().relative_to(Path.cwd())
    except ValueError:
        shown = args.labels.name
    print(f"{shown}: {total['n']} labelled outputs, {total['tp'] + total['fn']} degenerate by hand")
    print(f"measure (juice.eval.degeneration.is_degenerate): precision {total['precision']:.3f} "
          f"({total['tp']}/{total['tp'] + total['fp']}), recall {total['recall']:.3f} ({total['tp']}/{total['tp'] + total['fn']})")
    by_method: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_method[r["method"]].append(r)
    for method, rs in sorted(by_method.items()):
        a = agreement(rs)
        print(f"  {method:<10} n {a['n']:>3}: degenerate by hand {a['tp'] + a['fn']:>3}, flagged {a['tp'] + a['fp']:>3}, "
              f"missed {a['fn']}, false alarms {a['fp']}")
    for r in rows:
        if is_degenerate(r["output"]) != (r["label"] == "degenerate"):
            print(f"  disagree ({r['label']}, 6-gram share {repeated_share(r['output'].lower()):.3f}, word run "
                  f"{word_run(r['output'])}): {r['output']!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
