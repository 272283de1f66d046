"""What rounding the embedded Qwen's weights to bfloat16 changes in Table 1 (issue 89).

The 1.5B model's `juice reproduce` runs had its GGUF's weights rounded to bfloat16 and computed in
float32: juice 0.4.0 cached a GGUF's conversion at the dtype of the model's first load, and on the
machine that ran them that load asked for bfloat16 (their fingerprint's exact and bfloat16
checksums are equal). A load today dequantizes at float32. This re-decodes one domain's test
split (every item, the three conflict types) under Original, JuNE and JuICE with the run's heads
and that domain's tuned betas, once with each set of weights, in the same batches, and compares
them item by item: outputs equal, exact match equal, and each method's accuracy under both. The
rounded arm is also compared with the run's own outputs (`results.json`), which were decoded in
other batches (all six rows of Table 1 together), as a check that it is the run's model.

Each arm runs in its own process (one 1.5B model in memory at a time).

Run: python benchmarks/bench_weights_rounding.py qwen-output/results.json --domain world_capital \
         --record benchmarks/results/weights-rounding-qwen2.5-coder-1.5b.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODEL = "qwen2.5-coder-1.5b"
ROWS = ("original", "june", "juice")
ARMS = ("float32", "bfloat16-rounded")


def _child(results_file: Path, domain: str, arm: str, out: Path, threads: int) -> None:
    import torch

    from juice.data.paraconflict import build_domain
    from juice.eval.runner import evaluate
    from juice.interventions import Head, HeadSelection
    from juice.methods import MethodInputs, build
    from juice.models import load_model

    torch.set_num_threads(threads)
    results = json.loads(results_file.read_text(encoding="utf-8"))
    if arm == "float32":
        lm = load_model(MODEL, device="cpu")
    else:   # what the run's cache held: the float32 conversion cast to bfloat16, computed in float32
        lm = load_model(MODEL, device="cpu", dtype=torch.bfloat16)
        lm.model.to(torch.float32)
    fingerprint = lm.fingerprint()
    ids = results["splits"][domain]["test_ids"]
    by_uid = {ex.uid: ex for ex in build_domain(domain, seed=results["config"]["seed"])}
    items = [by_uid[i] for i in ids]
    heads = HeadSelection(tuple(map(Head.parse, results["heads"]["positive"])),
                          tuple(map(Head.parse, results["heads"]["negative"])))
    betas = results["choices"][domain]["betas"]
    methods = {}
    for row in ROWS:
        b = betas.get(row, {})
        methods[row] = build(row, MethodInputs(lm, heads, beta_plus=b.get("beta_plus"),
                                               beta_minus=b.get("beta_minus"))).method
    rows = evaluate(lm, items, methods, max_rows=results["config"]["max_rows"])
    out.write_text(json.dumps({"fingerprint": fingerprint, "items": [
        {"item": r.item, "conflict_type": r.conflict_type, "method": r.method, "output": r.output,
         "correct": r.correct} for r in rows]}), encoding="utf-8")


def compare(a: list[dict], b: list[dict]) -> dict:
    """Per row: prompts, outputs equal, exact match equal, accuracy (%) under each."""
    key = lambda r: (r["item"], r["conflict_type"], r["method"])   # noqa: E731
    theirs = {key(r): r for r in b}
    out = {}
    for row in sorted({r["method"] for r in a}):
        mine = [r for r in a if r["method"] == row]
        pairs = [(r, theirs[key(r)]) for r in mine]
        out[row] = {"prompts": len(pairs), "outputs_equal": sum(x["output"] == y["output"] for x, y in pairs),
                    "exact_match_equal": sum(x["correct"] == y["correct"] for x, y in pairs),
                    "accuracy": [round(100 * sum(x["correct"] for x, _ in pairs) / len(pairs), 1),
                                 round(100 * sum(y["correct"] for _, y in pairs) / len(pairs), 1)]}
    return out


def sentence(record: dict) -> str:
    """What docs/results.md states of a record: per row, the outputs and exact-match verdicts that
    float32 weights leave equal to the rounded ones' and the accuracy under each, then how many
    of the run's own outputs the rounded weights give."""
    from juice.methods import row_title

    rows = record["float32_vs_rounded"]
    n = {c["prompts"] for c in rows.values()}
    outputs = ", ".join(f"{c['outputs_equal']} ({row_title(row)})" for row, c in rows.items())
    verdicts = ", ".join(f"{c['exact_match_equal']} ({row_title(row)})" for row, c in rows.items())
    accuracy = ", ".join(f"{row_title(row)} {c['accuracy'][0]:.1f}% vs {c['accuracy'][1]:.1f}%"
                         for row, c in rows.items())
    check = record["rounded_vs_run"].values()
    return (f"Re-decoded with float32 weights (`{record['command']}`, at `{record['commit'][:12]}`), "
            f"{record['domain'].replace('_', ' ').title()}'s test split ({'/'.join(map(str, sorted(n)))} prompts "
            f"per row) keeps its outputs in {outputs} and its exact-match verdicts in {verdicts}; accuracy "
            f"with float32 vs rounded weights: {accuracy}. The rounded weights give "
            f"{sum(c['outputs_equal'] for c in check)} of the run's own {sum(c['prompts'] for c in check)} outputs.\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="the 1.5B model's Table 1 results.json")
    parser.add_argument("--domain", default="world_capital")
    parser.add_argument("--out", type=Path, default=Path("weights-rounding"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--record", type=Path, default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.results, args.domain, args.child, args.out / f"{args.child}.json", args.threads)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    for arm in ARMS:
        if not (args.out / f"{arm}.json").is_file():
            print(f"{arm}: decoding {args.domain}'s test split ...", flush=True)
            subprocess.run([sys.executable, __file__, str(args.results), "--domain", args.domain, "--out", str(args.out),
                            "--threads", str(args.threads), "--child", arm], check=True)
    arms = {arm: json.loads((args.out / f"{arm}.json").read_text(encoding="utf-8")) for arm in ARMS}
    results = json.loads(args.results.read_text(encoding="utf-8"))
    from juice.methods import row_key

    run = [{**r, "method": row_key(r["method"])} for r in results["items"]
           if r["domain"] == args.domain and row_key(r["method"]) in ROWS]
    sys.path.insert(0, str(HERE))
    from _common import git_state

    record = {
        "command": "python benchmarks/bench_weights_rounding.py " + " ".join(sys.argv[1:]),
        **git_state(), "model": MODEL, "domain": args.domain,
        "betas": {row: results["choices"][args.domain]["betas"][row] for row in ("june", "juice")},
        "fingerprints": {arm: arms[arm]["fingerprint"] for arm in ARMS},
        "run_fingerprint": results["model"],
        "float32_vs_rounded": compare(arms["float32"]["items"], arms["bfloat16-rounded"]["items"]),
        "rounded_vs_run": compare(arms["bfloat16-rounded"]["items"], run),
    }
    print(json.dumps(record, indent=1))
    if args.record:
        from juice.io import write_json_atomic

        write_json_atomic(args.record, record)
        print(f"wrote {args.record}")


if __name__ == "__main__":
    main()
