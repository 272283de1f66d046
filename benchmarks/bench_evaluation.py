"""Batched evaluation vs one prompt at a time on the embedded Gemma 3 270M: same predictions,
speed ratio. Original, JuNE and JuICE on 6 World Capital items x 3 conflict types.
Run: python benchmarks/bench_evaluation.py"""

from __future__ import annotations

from _common import measure, report

from juice.data.paraconflict import build_domain
from juice.eval.runner import evaluate
from juice.interventions import HeadSelection
from juice.interventions import Head
from juice.models import load_model
from juice.steering import Steering, steering_coefficients


def main() -> None:
    lm = load_model("gemma-3-270m")
    examples = build_domain("world_capital")[10:16]
    sel = HeadSelection((Head(9, 3), Head(10, 0)), (Head(2, 3),))
    coeff = steering_coefficients(lm.heads.geometry, sel, 3.0, -2.0)
    methods = {"Original": Steering(), "JuNE": Steering("scale", coeff), "JuICE": Steering("add", coeff)}
    evaluate(lm, examples[:1], methods, ("clean",))  # warm up
    batched = measure(lambda: evaluate(lm, examples, methods, max_rows=128))

    def one_at_a_time():
        out = []
        for ex in examples:
            for t in ("clean", "substitution", "coherent"):
                for name, s in methods.items():
                    out += evaluate(lm, [ex], {name: s}, (t,), max_rows=1)
        return out

    single = measure(one_at_a_time)
    key = lambda r: (r.subject, r.conflict_type, r.method)
    a = {key(r): r.output for r in batched.value}
    b = {key(r): r.output for r in single.value}
    report(f"batched evaluation vs one prompt at a time ({len(a)} generations)", batched, single, ">= 3x")
    print(f"  identical predictions: {a == b} ({sum(a[k] == b[k] for k in a)}/{len(a)})")


if __name__ == "__main__":
    main()
