"""Parity of juice's CAD, AdaCAD, CoCoA, COIECD and GRD with TriState-Bench's own implementations
(issue 90, item 2): the same greedy outputs on the same model and inputs, or the difference
explained.

Their side: the repository's decoding functions (`keith-Jiang/conflict-aware-decoding`,
`methods/inference.py`: `cad_generate`, `adacad_generate`, `cocoa_generate`, `coiecd_generate`,
`grd_generate`, each with its command line's defaults), imported from a checkout given with
`--theirs` (never copied into juice) and called on the model juice loaded (its Hugging Face
module, float32 where their command line defaults to float16 for a GPU, the same weights) and
a copy of its tokenizer: text out, cut at the end of
sequence, special tokens skipped, stripped, as their runner writes it. Juice's side: each method's
contrastive stream through juice's engine (batched), its tokens cut at their end-of-sequence
ids and decoded the same way. AdaCAD is run twice on juice's side: juice's default (the
divergence in bits, the paper's) and the authors' nats (`jsd_alpha(base=e)`), which theirs is.

Inputs: the first `--n` inputs of each state file of one published model folder (`--inputs`),
their two prompts as the files hold them (the prompts do not depend on the model; the labels
do, and parity does not read them). Where an output differs, the record keeps both texts, the
step where juice's tokens first leave their text, and juice's margin there (its rule's score of
its token minus the runner-up's, from an uncached re-run): a margin near 0 is a near-tie that
float rounding (batched, padded and cached here; one input, left-padded with the question
in their runner) can tip.

Their outputs are saved per method and state under `--out` (a rerun reuses them) and in the
record, which tests/slow/test_tristate_parity.py replays against juice without their code.

Run (their checkout: `git archive 581a4d5 methods | tar -x -C theirs`):
    python benchmarks/tristate_parity.py --theirs theirs --commit 581a4d59c4759fe513d099a8eee10b9849aab6a2 \
        --data ../shared/data/tristate --out tristate-parity \
        --record benchmarks/results/tristate-parity-gemma-3-270m.json
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import git_state  # noqa: E402

MAX_NEW_TOKENS = 32
METHODS = ("cad", "adacad", "cocoa", "coiecd", "grd")


def read_inputs(path: Path, n: int) -> list[dict]:
    """The first `n` inputs of a published state file: index, fact id, context and prior prompts."""
    pairs: dict[int, dict] = {}
    with path.open(encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            pairs.setdefault(row["input_index"], {"index": row["input_index"], "fact_id": row["fact_id"]})[
                "context" if row["assigned_process"] == 0 else "prior"] = row["context_string"]
    return [pairs[i] for i in sorted(pairs)[:n]]


def theirs_outputs(module, model, tokenizer, method: str, inputs: list[dict]) -> list[str]:
    """Their runner's prediction for each input (their function, their CLI defaults)."""
    fn = getattr(module, f"{method}_generate")
    out = []
    for x in inputs:
        out.append(fn(model, tokenizer, x["context"], x["prior"], MAX_NEW_TOKENS, 4064))
    return out


def juice_rules() -> dict:
    import functools

    from juice.baselines.cad import CadPolicy, jsd_alpha
    from juice.methods import MethodInputs, build

    rules = {m: build(m, MethodInputs()).method.contrast for m in METHODS}
    rules["adacad-nats"] = CadPolicy(functools.partial(jsd_alpha, base=math.e))
    return rules


def juice_tokens(lm, rule, inputs: list[dict], eos: set[int]) -> list[list[int]]:
    """juice's greedy tokens of `rule` on each input, cut before the first end-of-sequence id."""
    from juice.baselines.cad import contrast_generate

    got = contrast_generate(lm, [x["context"] for x in inputs], [x["prior"] for x in inputs], MAX_NEW_TOKENS, rule)
    out = []
    for t in got.tokens:
        ids = t.tolist()
        cut = next((k for k, i in enumerate(ids) if i in eos), len(ids))
        out.append(ids[:cut])
    return out


def text_of(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True).strip()


def first_departure(tokenizer, ids: list[int], theirs: str) -> int:
    """The first step k whose token makes juice's decoded text stop being a prefix of theirs."""
    for k in range(1, len(ids) + 1):
        if not theirs.startswith(text_of(tokenizer, ids[:k])):
            return k - 1
    return len(ids)


def margin_at(lm, rule, x: dict, ids: list[int], step: int) -> dict:
    """At `step` of an uncached re-run of both branches (juice's tokens before it fed): juice's
    rule's score of its token minus the runner-up's, and how near its hard thresholds the step
    was: GRD's gate signals (`p(a_p) - 0.5`, `H(question) - H(passage)` in nats), COIECD's
    nearest token to either set's boundary (in log-probability). A rounding can tip a threshold
    while the score margin stays wide."""
    import math

    import torch

    from juice.baselines.coiecd import CoiecdPolicy
    from juice.baselines.grd import GrdPolicy
    from juice.engine import StatefulContrastRule
    from juice.tokens import encode

    branches = [encode(lm.tokenizer, [text]).input_ids for text in (x["context"], x["prior"])]
    states = [None]
    with torch.inference_mode():
        for k in range(step + 1):
            lc, lp = (lm.model(input_ids=b, use_cache=False).logits[:, -1].float() for b in branches)
            if isinstance(rule, StatefulContrastRule):
                scores, states = rule.step(lc, lp, states)
            else:
                scores = rule(lc, lp)
            if k < step:
                token = torch.tensor([[ids[k]]])
                branches = [torch.cat([b, token], dim=1) for b in branches]
    top = scores[0].topk(2).values
    out = {"margin": round(float(top[0] - top[1]), 6)}
    c, p = lc[0].log_softmax(-1), lp[0].log_softmax(-1)
    if isinstance(rule, GrdPolicy):
        entropy = lambda v: float(-(v.exp() * v).sum())   # noqa: E731
        out["gate_confidence"] = round(float(p.max().exp()) - 0.5, 6)
        out["gate_entropy"] = round(entropy(p) - entropy(c), 6)
    if isinstance(rule, CoiecdPolicy):
        r = math.log(rule.threshold_ratio)
        edges = torch.stack([(c - (c.max() - r)).abs().min(), (c - (c.min() + r)).abs().min()])
        out["set_boundary"] = round(float(edges.min()), 6)
    return out


TITLES = {"cad": "CAD (alpha 1)", "adacad": "AdaCAD, juice's (JSD in bits)", "adacad-nats": "AdaCAD, JSD in nats",
          "cocoa": "CoCoA", "coiecd": "COIECD", "grd": "GRD"}


def parity_markdown(record: dict) -> str:
    """The record's table: per method and state, the outputs equal to theirs out of n, and the
    largest margin at a first difference (juice's rule's top-two gap there)."""
    states = list(next(iter(record["results"].values())))
    lines = ["| method | " + " | ".join(states) + " | largest margin where they differ |",
             "|---|" + "---|" * len(states) + "---|"]
    for name, per_state in record["results"].items():
        margins = [d["margin"] for r in per_state.values() for d in r["differ"] if d["margin"] is not None]
        widest = f"{max(margins):.2g}" if margins else "(none differ)"
        lines.append(f"| {TITLES.get(name, name)} | " + " | ".join(
            f"{r['equal']}/{r['n']}" for r in per_state.values()) + f" | {widest} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--theirs", type=Path, required=True, help="a checkout holding their methods/ package")
    parser.add_argument("--commit", required=True, help="their commit (recorded)")
    parser.add_argument("--data", type=Path, required=True, help="TriState-Bench's data/TriState/ folder")
    parser.add_argument("--inputs", default="gemma-2-9b-instruct", help="the model folder whose state files give the inputs")
    parser.add_argument("--model", default="gemma-3-270m")
    parser.add_argument("--n", type=int, default=50, help="inputs per state")
    parser.add_argument("--out", type=Path, default=Path("tristate-parity"))
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--record", type=Path, default=None)
    args = parser.parse_args()
    source = git_state()

    import torch

    from juice.data.tristate import state_files
    from juice.io import write_json_atomic
    from juice.models import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    files = state_files(args.data)[args.inputs]
    inputs = {state: read_inputs(path, args.n) for state, path in files.items()}
    lm = load_model(args.model, device="cpu")
    sys.path.insert(0, str(args.theirs.resolve()))
    import methods.inference as their_runner  # noqa: E402  (their package, from --theirs)

    tokenizer = copy.deepcopy(lm.tokenizer)   # their runner sets the padding side on it
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    eos = set(their_runner.get_eos_token_ids(lm.model, tokenizer))
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    theirs: dict[str, dict[str, list[str]]] = {}
    for method in METHODS:
        for state, xs in inputs.items():
            path = args.out / f"{method}-{state}.json"
            if path.is_file():
                saved = json.loads(path.read_text(encoding="utf-8"))
                if saved["indices"] == [x["index"] for x in xs]:
                    theirs.setdefault(method, {})[state] = saved["outputs"]
                    continue
            t0 = time.perf_counter()
            with torch.inference_mode():
                outputs = theirs_outputs(their_runner, lm.model, tokenizer, method, xs)
            write_json_atomic(path, {"indices": [x["index"] for x in xs], "outputs": outputs})
            theirs.setdefault(method, {})[state] = outputs
            print(f"[{time.perf_counter() - started:6.0f} s] theirs: {method} on {state} "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
    rules = juice_rules()
    results: dict[str, dict] = {}
    for name, rule in rules.items():
        method = "adacad" if name == "adacad-nats" else name
        per_state = {}
        for state, xs in inputs.items():
            ids = juice_tokens(lm, rule, xs, eos)
            differs = []
            for x, t, want in zip(xs, ids, theirs[method][state]):
                got = text_of(tokenizer, t)
                if got != want:
                    step = first_departure(tokenizer, t, want)
                    near = margin_at(lm, rule, x, t, step) if step < len(t) else {"margin": None}
                    differs.append({"index": x["index"], "fact_id": x["fact_id"], "juice": got, "theirs": want,
                                    "step": step, **near})
            per_state[state] = {"n": len(xs), "equal": len(xs) - len(differs), "differ": differs}
        results[name] = per_state
        print(f"[{time.perf_counter() - started:6.0f} s] juice {name}: "
              + ", ".join(f"{s} {r['equal']}/{r['n']}" for s, r in per_state.items()), flush=True)
    record = {"command": "python " + " ".join(sys.argv), **source, "date": time.strftime("%Y-%m-%d"),
              "theirs": {"repository": "keith-Jiang/conflict-aware-decoding", "commit": args.commit,
                         "settings": "their command line's defaults (CAD alpha 1.0; AdaCAD warmup 0, JSD in nats; "
                                     "CoCoA 0.5/1.0/100; COIECD alpha 1.0, ratio 4; GRD lambda 0.75, gate full; "
                                     "32 new tokens) except the dtype: float32 on both sides (theirs defaults to "
                                     "float16, for a GPU)"},
              "eos_ids": sorted(eos),
              "model": lm.name, "fingerprint": lm.fingerprint(), "dtype": "float32", "max_new_tokens": MAX_NEW_TOKENS,
              "inputs": {"folder": args.inputs, "per_state": args.n,
                         "indices": {s: [x["index"] for x in xs] for s, xs in inputs.items()}},
              "seconds": round(time.perf_counter() - started),
              "reference": theirs, "results": results}
    if args.record:
        write_json_atomic(args.record, record)
        print(f"wrote {args.record}")


if __name__ == "__main__":
    main()
