"""Dual-run decoding on the embedded Gemma 3 270M: KV-cached JuICE vs the naive re-run, and
JuICE's time per token vs plain cached greedy decoding. Run: python benchmarks/bench_decoding.py"""

from __future__ import annotations

import torch
from _common import measure, report

from juice.data.paraconflict import build_domain
from juice.engine import greedy_generate
from juice.interventions import HeadSelection
from juice.interventions import Head
from juice.models import load_model
from juice.reference import greedy_generate_naive
from juice.steering import Steering, steering_coefficients

N_NEW = 10


def main() -> None:
    lm = load_model("gemma-3-270m")
    examples = build_domain("world_capital")[:4]
    prompts = [ex.prompts[t] for ex in examples for t in ("substitution", "coherent")]
    sel = HeadSelection((Head(9, 3), Head(10, 0), Head(12, 1)), (Head(2, 3), Head(6, 0)))
    juice = Steering("add", steering_coefficients(lm.heads.geometry, sel, 3.0, -2.0))
    greedy_generate(lm, prompts[:1], 2, juice)  # warm up

    cached = measure(lambda: [greedy_generate(lm, [p], N_NEW, juice).tokens[0] for p in prompts])
    naive = measure(lambda: [greedy_generate_naive(lm, p, N_NEW, juice) for p in prompts])
    same = all(torch.equal(a, b) for a, b in zip(cached.value, naive.value))
    report(f"KV-cached dual run vs naive re-run ({len(prompts)} prompts, {N_NEW} new tokens, one at a time)",
           cached, naive, ">= 5x")
    print(f"  identical tokens: {same}")

    # Time per generated token: measure 1 and 1 + N_NEW tokens, take the difference.
    def per_token(steering):
        short = measure(lambda: greedy_generate(lm, prompts, 1, steering))
        long = measure(lambda: greedy_generate(lm, prompts, 1 + N_NEW, steering))
        return (long.seconds - short.seconds) / N_NEW, long.peak_mib

    juice_tok, juice_mem = per_token(juice)
    plain_tok, plain_mem = per_token(Steering())
    print(f"JuICE decoding per token / plain cached greedy per token ({len(prompts)} prompts in one batch): "
          f"{juice_tok:.3f}s / {plain_tok:.3f}s = {juice_tok / plain_tok:.2f}x  [target <= 2.2x]  "
          f"(peak +{juice_mem:.0f} / +{plain_mem:.0f} MiB)")


if __name__ == "__main__":
    main()
