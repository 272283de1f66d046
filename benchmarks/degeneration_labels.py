"""Checking the degeneration measure against outputs labelled by hand (issue 49).

`sample` draws a stratified sample of outputs from `juice reproduce` results (methods x datasets
x flagged / not flagged by the measure; seeded) into a JSONL file with an empty "label" per
line, for a person to fill with "fluent" or "degenerate" (what a reader of the answer would
call it, not what the measure says). `score` reads a labelled file and prints the measure's
precision and recall against the labels (degenerate = the positive class), overall and per
method, with the rule as it stands in `juice.eval.degeneration` (so a changed rule is scored on
the same labels), and lists the disagreements.

The committed labels: `benchmarks/labels/degeneration.jsonl` (tests/test_degeneration.py holds
the measure to them).

Run: python benchmarks/degeneration_labels.py sample OUT.jsonl RESULTS.json [RESULTS.json ...] [--per-cell 3]
     python benchmarks/degeneration_labels.py score [LABELS.jsonl]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import defaultdict
from pathlib import Path

from juice.eval.degeneration import is_degenerate, repeated_share

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
    args = parser.parse_args(argv)
    if args.command == "sample":
        rows = sample(args.results, args.per_cell, args.seed)
        args.out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        print(f"{len(rows)} outputs ({sum(r['flagged'] for r in rows)} flagged) -> {args.out}")
        return 0
    rows = read_labels(args.labels)
    total = agreement(rows)
    print(f"{args.labels}: {total['n']} labelled outputs, {total['tp'] + total['fn']} degenerate by hand")
    print(f"measure (repeated character 6-grams >= 0.3): precision {total['precision']:.3f} "
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
            print(f"  disagree ({r['label']}, share {repeated_share(r['output']):.2f}): {r['output']!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
