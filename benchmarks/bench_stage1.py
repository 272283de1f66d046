"""Stage 1 on the embedded Gemma 3 270M.

1. Exact batched scoring (growing batch, last-position logits) vs the naive reference (one
   intervention per full forward, logits at every position), on a subset of heads so that the
   reference stays affordable: identical scores within 1e-5, and the speed ratio.
2. Exact Stage 1 (the pipeline's default) on the full D: wall time against the 520 s target.
3. Hybrid (attribution shortlist + exact re-score) and attribution alone, the opt-in
   approximations, vs exact scoring of every head: speed ratio, overlap of the selected top-K,
   Spearman correlation.

Run: python benchmarks/bench_stage1.py [--skip-full | --skip-approx]
"""

from __future__ import annotations

import sys

import torch
from _common import measure, report

from juice.data.paraconflict import build_domain
from juice.data.splits import split_test
from juice.stage1 import ALPHAS_NEGATIVE, ALPHAS_POSITIVE, attribution_scores, hybrid_scores, score_heads, scoring_prompts, select_heads
from juice.interventions import Head, head_coefficients, scaled_heads
from juice.models import load_model
from juice.reference import intervention_probs_naive
from juice.readout import intervention_probs
from juice.tokens import encode

K = 5


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    ra, rb = a.flatten().argsort().argsort().double(), b.flatten().argsort().argsort().double()
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra * rb).sum() / (ra.norm() * rb.norm()))


@torch.inference_mode()
def _batched_without_growing(lm, prompt, target, interventions, max_rows=256):
    """Batched like the exact scorer but every row runs every layer (the growing batch ablated)."""
    g = lm.heads.geometry
    ids = encode(lm.tokenizer, [prompt]).input_ids
    probs = []
    for start in range(0, len(interventions), max_rows):
        chunk = interventions[start:start + max_rows]
        alphas = torch.stack([head_coefficients(g, {h: a}) for h, a in chunk])
        with scaled_heads(lm.heads, alphas):
            logits = lm.model(input_ids=ids.repeat(len(chunk), 1), logits_to_keep=1).logits[:, -1]
        probs.append(logits.float().softmax(-1)[:, target])
    return torch.cat(probs)


def main() -> None:
    lm = load_model("gemma-3-270m")
    g = lm.heads.geometry
    pool, _ = split_test(build_domain("world_capital"))
    head_set = pool[:4]
    prompts = scoring_prompts(lm, head_set)
    alphas = (*ALPHAS_POSITIVE, *ALPHAS_NEGATIVE)

    # 1. exact batched vs naive, on 3 layers x all heads x all alphas, one prompt per conflict type
    subset = [(Head(l, h), a) for l in (0, g.n_layers // 2, g.n_layers - 1) for h in range(g.n_heads) for a in alphas]
    sample = prompts[:3]
    # warm-up: the first forward pages in the memory-mapped weights; neither side should pay it
    intervention_probs_naive(lm, sample[0].prompt, sample[0].target_token, subset[:1])
    fast = measure(lambda: [intervention_probs(lm, p.prompt, p.target_token, subset) for p in sample])
    slow = measure(lambda: [intervention_probs_naive(lm, p.prompt, p.target_token, subset) for p in sample])
    flat = measure(lambda: [_batched_without_growing(lm, p.prompt, p.target_token, subset) for p in sample])
    diff = max(float((f[1] - s[1]).abs().max()) for f, s in zip(fast.value, slow.value))
    report(f"exact batched vs naive ({len(subset)} interventions x {len(sample)} prompts)", fast, slow, ">= 10x")
    print(f"  max |score difference| = {diff:.2e}  [target <= 1e-5]")
    report("  growing batch (layers below an intervention run once) vs all rows from layer 0", fast, flat,
           "> 1x: keep it only if it pays")

    if "--skip-full" in sys.argv:
        return
    # 2. exact Stage 1 (the default) on the full D: every head, every alpha, 12 prompts
    exact = measure(lambda: score_heads(lm, prompts))
    n_rows = g.n_layers * g.n_heads * len(alphas)
    print(f"exact Stage 1 on D ({g.n_layers * g.n_heads} heads x {len(alphas)} alphas x {len(prompts)} prompts = "
          f"{n_rows * len(prompts)} interventions): {exact.seconds:.0f}s (peak +{exact.peak_mib:.0f} MiB)"
          f"  [target <= 520 s on 2 CPU cores]")
    if "--skip-approx" in sys.argv:
        return
    # 3. hybrid / attribution (approximations, opt-in) vs exact on every head
    attribution = measure(lambda: attribution_scores(lm, prompts))
    for m in (2, 6):
        hybrid = measure(lambda: hybrid_scores(lm, prompts, m))
        _compare(f"hybrid (shortlist {m}/sign)", hybrid, exact)
    _compare("attribution only", attribution, exact)


def _compare(name, approx, exact) -> None:
    report(f"{name} vs exact Stage 1 (all {exact.value.scores.shape[1] * exact.value.scores.shape[2]} heads)",
           approx, exact, ">= 30x")
    se, sa = select_heads(exact.value, K), select_heads(approx.value, K)
    for sign, e, a in (("+", se.positive, sa.positive), ("-", se.negative, sa.negative)):
        overlap = len(set(e) & set(a)) / max(1, len(e))
        rho = spearman(exact.value.per_type(sign).sum(0), approx.value.per_type(sign).sum(0))
        print(f"  {sign}: exact {[str(h) for h in e]} vs {[str(h) for h in a]}: top-K overlap {overlap:.0%}"
              f" [target >= 80%], Spearman of summed scores {rho:.3f}")


if __name__ == "__main__":
    main()
