"""`--max-rows auto` on the embedded Gemma 3 270M: does the row count chosen for a memory budget
keep the measured peak within that budget?

For budgets of 256 MiB and 1 GiB and prompts of about 20, 80 and 220 tokens, the exact Stage 1
scorer (288 interventions: 72 heads x 4 alphas) and batched generation (64 JuICE streams, 10 new
tokens) run with `juice.budget.auto_max_rows(budget)` rows; the peak resident memory above the
level before the call is compared with the budget.

Run: python benchmarks/bench_memory.py
"""

from __future__ import annotations

from _common import measure

from juice.budget import auto_max_rows
from juice.data.paraconflict import build_domain
from juice.engine import Stream, generate
from juice.interventions import HeadSelection
from juice.stage1 import ALPHAS_NEGATIVE, ALPHAS_POSITIVE
from juice.interventions import Head
from juice.models import load_model
from juice.steering import Steering, steering_coefficients
from juice.readout import intervention_probs
from juice.tokens import token_ids


def main() -> None:
    lm = load_model("gemma-3-270m")
    g = lm.heads.geometry
    ex = build_domain("world_capital")[0]
    passage = " ".join([ex.prompts["coherent"]] * 3)
    prompts = {"substitution": ex.prompts["substitution"], "coherent": ex.prompts["coherent"], "long": passage}
    interventions = [(Head(l, h), a) for l in range(g.n_layers) for h in range(g.n_heads)
                     for a in (*ALPHAS_POSITIVE[:2], *ALPHAS_NEGATIVE[:2])]
    coef = steering_coefficients(g, HeadSelection((Head(9, 3),), (Head(2, 3),)), 2.0, -1.0)
    # warm-up: the weights are memory-mapped, so the first forward pages them in (~1.1 GB of RSS)
    intervention_probs(lm, prompts["long"], 0, interventions[:8])
    generate(lm, [prompts["long"]], [Stream(0, Steering("add", coef))], 2)
    for budget_mib in (256, 1024):
        budget = budget_mib << 20
        for name, prompt in prompts.items():
            n = len(token_ids(lm.tokenizer, prompt))
            rows = auto_max_rows(lm, n, budget_bytes=budget)
            score = measure(lambda: intervention_probs(lm, prompt, 0, interventions, max_rows=rows))
            rows_gen = auto_max_rows(lm, n + 10, budget_bytes=budget)
            streams = [Stream(0, Steering("add", coef))] * 64
            gen = measure(lambda: generate(lm, [prompt], streams, 10, max_rows=rows_gen))
            print(f"budget {budget_mib} MiB, {name} prompt ({n} tokens): scoring {rows} rows/forward, peak "
                  f"+{score.peak_mib:.0f} MiB ({score.peak_mib / budget_mib:.2f} of budget); generation "
                  f"{rows_gen} rows, peak +{gen.peak_mib:.0f} MiB ({gen.peak_mib / budget_mib:.2f}) [target <= 1]")


if __name__ == "__main__":
    main()
