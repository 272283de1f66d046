"""The relevance gate's signals per context type (:data:`juice.when_to_steer.signals.GATE_SIGNALS`): the lexical
share of the question's content words the passage holds (:func:`juice.when_to_steer.signals.relevance`) on every
item, and the model-based ones (CK-PLUG's confidence gain, CoCoA's contextual peakedness:
:func:`juice.when_to_steer.signals.first_step_features`) on the first `--questions` questions of each source, with
the embedded Gemma 3, for NQ-Swap and the six built-in ParaConflict domains; prints n, the median
and the 5th-95th percentiles per dataset, signal and context type, and the share of items a gate at
`--threshold` (lexical only) would send to the question alone.

Run: python benchmarks/relevance_distribution.py [--threshold 0.708] [--questions 40] [--data ../shared/data]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from juice.when_to_steer.signals import GATE_SIGNALS, RELEVANCE, first_step_features, relevance
from juice.data.context_types import CONTEXT_TYPES
from juice.models import load_model
from juice.when_to_steer import context_items


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threshold", type=float, default=0.708, help="a lexical gate to count items under")
    parser.add_argument("--questions", type=int, default=40, help="questions per source for the model-based signals")
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    args = parser.parse_args()
    lm = load_model("gemma-3-270m")
    sources = {"NQ-Swap": args.data / "nqswap", "ParaConflict (built-in)": None}
    print(f"{'dataset':<26}{'signal':<27}{'type':<13}{'n':>6}{'median':>9}{'5%':>8}{'95%':>8}"
          f"  under {args.threshold:g}")
    for name, source in sources.items():
        every, _ = context_items(source)
        few, _ = context_items(source, limit=args.questions)
        values: dict[tuple[str, str], np.ndarray] = {}
        for kind in CONTEXT_TYPES:   # each item set's first step computed once, for every model signal
            mine = [i for i in every.items if i.context_type == kind and i.prompt != i.question]
            if mine:
                values[RELEVANCE, kind] = np.array(relevance(lm, [i.prompt for i in mine], [i.question for i in mine]))
            mine = [i for i in few.items if i.context_type == kind and i.prompt != i.question]
            if mine:
                features = first_step_features(lm, [i.prompt for i in mine], [i.question for i in mine])
                values.update({(signal, kind): features[signal].numpy() for signal in GATE_SIGNALS[1:]})
        for signal in GATE_SIGNALS:
            for kind in CONTEXT_TYPES:
                if (signal, kind) not in values:
                    continue
                v = values[signal, kind]
                low, mid, high = np.percentile(v, [5, 50, 95])
                under = f"  {100 * float((v < args.threshold).mean()):5.1f}%" if signal == RELEVANCE else ""
                print(f"{name:<26}{signal:<27}{kind:<13}{len(v):>6}{mid:>9.3f}{low:>8.3f}{high:>8.3f}{under}")

if __name__ == "__main__":
    main()
