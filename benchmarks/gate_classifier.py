"""The first-step signals as classifiers of "this passage answers the question" (issue 77): on every
item of NQ-Swap (`--data`/nqswap) and of juice's six templated ParaConflict domains (built in), with
the embedded Gemma 3 at fp32 on the CPU, each signal of :mod:`juice.when_to_steer.signals` (the
lexical share of the question's words, CK-PLUG's confidence gain, CoCoA's peakedness, and the
bins' JSD) per dataset, source and wrong type: the AUROC of gold and conflicting passages against
irrelevant, distractor (and each way distractors are built) passages, with 95% intervals over
whole questions (:mod:`juice.when_to_steer.classifier`), and the reliability bins of each
dataset's pooled cells. Prints the tables; --record writes the compact record
docs/when-to-steer.md quotes (a test keeps them equal).

Run: python benchmarks/gate_classifier.py [--data ../shared/data] [--limit N] [--record FILE] [--cache DIR] [--figure PNG]
     python benchmarks/gate_classifier.py --from-record FILE [--figure PNG]   (the page's part of a record,
     and its calibration curves, without a model)
Not a test: the model-based signals need two forwards per item; on 2 CPU cores NQ-Swap's 1,667 questions
(longer passages) took about 70 minutes and ParaConflict's 982 about 7.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import numpy as np

from _common import git_state
from juice.io import write_json_atomic
from juice.models import load_model
from juice.when_to_steer import context_items
from juice.when_to_steer.classifier import POOLED, auroc_table, reliability_curves
from juice.when_to_steer.signals import GATE_SIGNALS, RELEVANCE, SIGNAL, first_step_features, relevance

DATASETS = {"nqswap": "NQ-Swap", "paraconflict": "ParaConflict (juice's templated domains)"}
SIGNAL_TITLES = {RELEVANCE: "lexical share", "confidence_gain": "confidence gain (CK-PLUG)",
                 "context_peakedness": "peakedness (CoCoA)", SIGNAL: "JSD (AdaCAD; auto's bins)"}
BINS = 5
CHUNK = 256
"""Items per call of first_step_features, which keeps both rows' logits of every item it is given
(Gemma 3's 262,144-token vocabulary: 2 MiB per item at fp32)."""


def chunk_features(lm, prompts: list[str], questions: list[str], cache: Path | None) -> dict[str, list[float]]:
    """The model-based signals of one chunk (:func:`first_step_features`), read from `cache`
    where a run computed them before (keyed by the model, the signals' code and the chunk's
    prompts and questions), else computed and written there atomically: a stopped run resumes."""
    names = (SIGNAL, *GATE_SIGNALS[1:])
    path = None
    if cache is not None:
        from juice.io import settings_key
        from juice.when_to_steer.study import FEATURE_MODULES, decoding_code_key

        path = cache / (settings_key({"model": lm.fingerprint(), "code": decoding_code_key(FEATURE_MODULES),
                                      "items": [[p, q] for p, q in zip(prompts, questions)]}) + ".json")
        if path.is_file():
            return json.loads(path.read_text(encoding="utf-8"))
    features = first_step_features(lm, prompts, questions)
    out = {name: features[name].tolist() for name in names}
    if path is not None:
        write_json_atomic(path, out)
    return out


def measure(lm, items, resamples: int, seed: int, cache: Path | None = None) -> dict:
    """One dataset's part of the record: its items, every cell and the pooled reliability bins
    (`cache`: where each chunk's signals are kept, :func:`chunk_features`)."""
    passage = [i.prompt != i.question for i in items]
    values = {s: np.zeros(len(items)) for s in (*GATE_SIGNALS, SIGNAL)}
    at = [k for k, p in enumerate(passage) if p]
    prompts, questions = [items[k].prompt for k in at], [items[k].question for k in at]
    values[RELEVANCE][at] = relevance(lm, prompts, questions)
    order = sorted(range(len(at)), key=lambda k: len(prompts[k]))   # batches of like lengths: less padding
    for start in range(0, len(order), CHUNK):   # first_step_features holds every row's logits: in chunks
        part = order[start:start + CHUNK]
        features = chunk_features(lm, [prompts[k] for k in part], [questions[k] for k in part], cache)
        for name in (SIGNAL, *GATE_SIGNALS[1:]):
            values[name][[at[k] for k in part]] = np.asarray(features[name], dtype=np.float64)
    cells = auroc_table(items, values, resamples=resamples, seed=seed)
    pooled = POOLED if len({i.source for i in items}) > 1 else items[0].source
    curves = {signal: {wrong: [b.to_json() for b in bins] for wrong, bins in per.items()}
              for signal, per in reliability_curves(items, values, bins=BINS).items()}
    sources = sorted({i.source for i in items})
    return {"sources": {s: {"questions": len({i.uid for i in items if i.source == s}),
                            "items": {t: sum(i.source == s and i.context_type == t for i in items)
                                      for t in ("gold", "conflicting", "irrelevant", "distractor")}}
                        for s in sources},
            "pooled": pooled, "cells": [c.to_json() for c in cells], "reliability": curves}


def _cell(part: dict, signal: str, source: str, wrong: str) -> dict | None:
    return next((c for c in part["cells"] if (c["signal"], c["source"], c["wrong"]) == (signal, source, wrong)), None)


def _auroc(c: dict | None) -> str:
    if c is None:
        return "–"
    a = c["auroc"]
    return f"{a['mean']:.2f} [{a['low']:.2f}, {a['high']:.2f}]"


def record_markdown(rec: dict, dataset: str) -> str:
    """A dataset's AUROC table on docs/when-to-steer.md, from the record (a test keeps them equal):
    per signal and wrong type, the pooled AUROC with its interval and, with more than one source,
    the range over sources."""
    part = rec["datasets"][dataset]
    many = len(part["sources"]) > 1
    n = sum(s["questions"] for s in part["sources"].values())
    wrongs = list(dict.fromkeys(c["wrong"] for c in part["cells"]))
    head = ("| signal | passage that does not answer | AUROC [95% interval] |"
            + (" range over domains |" if many else ""))
    limit = rec.get("limit")
    cut = limit is not None and any(src["questions"] >= limit for src in part["sources"].values())
    lines = [f"{DATASETS[dataset]}: {n:,} questions" + (f" in {len(part['sources'])} domains" if many else "")
             + (f" (the first {limit} of each source)" if cut else "") + ", every item of each question.",
             "", head,
             "|---|---|---|" + ("---|" if many else "")]
    for signal in SIGNAL_TITLES:
        for wrong in wrongs:
            pooled = _cell(part, signal, part["pooled"], wrong)
            if pooled is None:
                continue
            row = f"| {SIGNAL_TITLES[signal]} | {wrong} | {_auroc(pooled)} |"
            if many:
                means = [c["auroc"]["mean"] for c in part["cells"]
                         if c["signal"] == signal and c["wrong"] == wrong and c["source"] != POOLED]
                row += f" {min(means):.2f}–{max(means):.2f} |"
            lines.append(row)
    return "\n".join(lines)


def headline(rec: dict) -> str:
    """The gate's number where the README, the FAQ and docs/when-to-steer.md's verdict state it (a
    test keeps each equal to the record): the AUROC of the lexical share, the signal `auto`'s gate
    reads, for NQ-Swap's gold and conflicting passages against its BM25 distractors, with its 95%
    interval over whole questions and the questions' count."""
    part = rec["datasets"]["nqswap"]
    n = sum(s["questions"] for s in part["sources"].values())
    return (f"AUROC {_auroc(_cell(part, RELEVANCE, part['pooled'], 'distractor'))} against NQ-Swap's BM25 distractors"
            f" on {n:,} questions")


def figure(rec: dict, path: Path) -> Path:
    """The record's calibration curves (each signal's reliability bins on the pooled items, per
    dataset and wrong type) as the PNG docs/when-to-steer.md shows
    (:func:`juice.when_to_steer.classifier.reliability_figure`)."""
    from juice.when_to_steer.classifier import reliability_figure

    curves = {DATASETS[d]: {SIGNAL_TITLES[s]: {w: bins for w, bins in by.items() if ": " not in w}
                            for s, by in part["reliability"].items()}
              for d, part in rec["datasets"].items()}
    return reliability_figure(curves, path, f"{rec['model']} ({rec['device']}), commit {rec['commit'][:12]}")


def claims(rec: dict) -> list[str]:
    """The verdict's sentences on docs/when-to-steer.md, from the record (a test keeps each on the
    page): per dataset and wrong type, the signal with the highest AUROC on the pooled items (said to
    separate best only when no other signal's AUROC lies in its 95% interval), and the signals whose
    interval holds 0.5 (no better than chance)."""
    out = []
    for dataset, part in rec["datasets"].items():
        for wrong in [w for w in dict.fromkeys(c["wrong"] for c in part["cells"]) if ": " not in w]:
            cells = [c for c in part["cells"] if c["source"] == part["pooled"] and c["wrong"] == wrong]
            best = max(cells, key=lambda c: c["auroc"]["mean"])
            near = [c for c in cells if c is not best and c["auroc"]["mean"] >= best["auroc"]["low"]]
            chance = [SIGNAL_TITLES[c["signal"]] for c in cells if c["auroc"]["low"] <= 0.5 <= c["auroc"]["high"]]
            title = SIGNAL_TITLES[best["signal"]]
            out.append(f"{DATASETS[dataset]}, {wrong} passages: "
                       + (f"no signal separates better than the others (the highest AUROC, the {title}'s, "
                          f"{_auroc(best)}, holds {len(near)} other{'s' if len(near) > 1 else ''} in its interval)"
                          if near else
                          f"{title} separates best, AUROC {_auroc(best)}")
                       + (f"; {', '.join(chance)} no better than chance" if chance else "") + ".")
            means = [c["auroc"]["mean"] for c in cells]
            out.append(f"Against {DATASETS[dataset]}'s {wrong} passages every signal's AUROC lies between "
                       f"{min(means):.2f} and {max(means):.2f}.")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data"), help="holds nqswap/")
    parser.add_argument("--limit", type=int, default=None, help="the first N questions of each source (default: all)")
    parser.add_argument("--resamples", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--datasets", default="paraconflict,nqswap", help="which, in this order")
    parser.add_argument("--record", type=Path, default=None, help="write the compact record here")
    parser.add_argument("--cache", type=Path, default=None,
                        help="keep each chunk's signals here: a stopped run resumes (default: none)")
    parser.add_argument("--from-record", type=Path, default=None, help="print the page's tables of this record")
    parser.add_argument("--figure", type=Path, default=None,
                        help="draw the calibration curves (PNG) of the record this run writes, or of --from-record")
    args = parser.parse_args()
    if args.from_record is not None:
        rec = json.loads(args.from_record.read_text(encoding="utf-8"))
        for dataset in rec["datasets"]:
            print(f"## {dataset}\n\n{record_markdown(rec, dataset)}\n")
        print("\n".join(claims(rec)))
        if args.figure is not None:
            print(f"wrote {figure(rec, args.figure)}")
        return
    source = git_state()
    start = time.perf_counter()
    lm = load_model("gemma-3-270m")
    rec = {"command": shlex.join(["python", "benchmarks/gate_classifier.py", *sys.argv[1:]]), **source,
           "date": time.strftime("%Y-%m-%d"), "model": "gemma-3-270m", "device": "cpu, fp32",
           "limit": args.limit, "resamples": args.resamples, "seed": args.seed, "bins": BINS, "datasets": {}}
    folders = {"nqswap": args.data / "nqswap", "paraconflict": None}
    for dataset in [d.strip() for d in args.datasets.split(",") if d.strip()]:
        folder = folders[dataset]
        if folder is not None and not folder.is_dir():
            print(f"{DATASETS[dataset]}: no {folder}, skipped")
            continue
        items, _ = context_items(folder, limit=args.limit)
        print(f"{DATASETS[dataset]}: {len(items.items)} items", flush=True)
        rec["datasets"][dataset] = measure(lm, items.items, args.resamples, args.seed, args.cache)
        print(record_markdown(rec, dataset) + "\n", flush=True)
        rec["wall_s"] = round(time.perf_counter() - start, 1)
        if args.record is not None:   # after each dataset, atomically: a stopped run keeps what it measured
            write_json_atomic(args.record, rec)
            print(f"wrote {args.record}", flush=True)
    if args.figure is not None:
        print(f"wrote {figure(rec, args.figure)}")


if __name__ == "__main__":
    main()
