"""The relevance gate's signal per context type: `auto`'s lexical relevance
(:func:`juice.auto.relevance`, the share of the question's content words the passage holds) on
every item of NQ-Swap and of the six built-in ParaConflict domains, with the embedded Gemma 3's
tokenizer; prints the median and the 5th-95th percentiles per dataset and context type, and how
many items of each type a gate at THRESHOLD would send to the question alone.

Run: python benchmarks/relevance_distribution.py [--threshold 0.708] [--data ../shared/data]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from juice.auto import relevance
from juice.data.context_types import CONTEXT_TYPES
from juice.models import load_model
from juice.when_to_steer import context_items


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threshold", type=float, default=0.708, help="a gate to count items under")
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    args = parser.parse_args()
    lm = load_model("gemma-3-270m")
    sources = {"NQ-Swap": args.data / "nqswap", "ParaConflict (built-in)": None}
    print(f"{'dataset':<26}{'type':<13}{'n':>6}{'median':>9}{'5%':>8}{'95%':>8}  under {args.threshold:g}")
    for name, source in sources.items():
        items, _ = context_items(source)
        for kind in CONTEXT_TYPES:
            mine = [i for i in items.items if i.context_type == kind and i.prompt != i.question]
            if not mine:
                continue
            values = np.array(relevance(lm, [i.prompt for i in mine], [i.question for i in mine]))
            low, mid, high = np.percentile(values, [5, 50, 95])
            under = float((values < args.threshold).mean())
            print(f"{name:<26}{kind:<13}{len(values):>6}{mid:>9.3f}{low:>8.3f}{high:>8.3f}  {100 * under:5.1f}%")


if __name__ == "__main__":
    main()
