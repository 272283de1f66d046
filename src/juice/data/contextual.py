"""The five contextual datasets of Table 2 (the paper's Table 4) and their seeded splits (Sec. 2.2, 4.2).

Columns of Table 2, in order: NQ-Swap, Hate Speech Ending, History of Science QA, Proverb
Ending, Proverb Translation. Heads are identified on Proverb Ending only and reused for all five.

Splits, per dataset, seeded: the rows are shuffled; the second half is the test pool (reported
unfiltered, cut to `limit`); the first half is the development pool, from which come the head
identification set D (first `head_set_size`), the validation split (next `validation_size`) and
PH3-l's development set (the next `ph3_dev_size`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from juice.data.memotrap import SUBTASKS, TITLES, load_memotrap
from juice.data.nqswap import load_nqswap
from juice.data.records import ContextualExample

CONTEXTUAL_DATASETS: tuple[str, ...] = (
    "nqswap", "hate_speech_ending", "history_of_science_qa", "proverb_ending", "proverb_translation",
)
CONTEXTUAL_TITLES: dict[str, str] = {"nqswap": "NQ-Swap", **TITLES}
HEAD_DATASET = "proverb_ending"


def load_contextual(name: str, data_root: str | Path) -> list[ContextualExample]:
    """All rows of one contextual dataset from `data_root` (a folder holding `memotrap/` and
    `nqswap/`, e.g. `../shared/data`).

    Raises:
        ValueError: unknown dataset name.
        FileNotFoundError: the files are not there.
    """
    root = Path(data_root)
    if name == "nqswap":
        return load_nqswap(root / "nqswap")
    if name in SUBTASKS:
        return load_memotrap(root / "memotrap", name)
    raise ValueError(f"unknown contextual dataset {name!r}; choose from {CONTEXTUAL_DATASETS}")


@dataclass(frozen=True)
class ContextualSplits:
    head_set: tuple[ContextualExample, ...]
    validation: tuple[ContextualExample, ...]
    ph3_dev: tuple[ContextualExample, ...]
    test: tuple[ContextualExample, ...]


def contextual_splits(
    examples: Sequence[ContextualExample],
    *,
    head_set_size: int = 4,
    validation_size: int | None = 10,
    ph3_dev_size: int | None = 200,
    limit: int | None = None,
    seed: int = 0,
) -> ContextualSplits:
    """Seeded, disjoint splits (module docstring).

    Raises:
        ValueError: the development pool is smaller than `head_set_size` + 1.
    """
    order = list(examples)
    random.Random(f"contextual/{seed}").shuffle(order)
    half = len(order) // 2
    dev, test = order[:half], order[half:]
    if len(dev) < head_set_size + 1:
        raise ValueError(f"{len(examples)} items are too few for a head set of {head_set_size} and validation")
    head = dev[:head_set_size]
    rest = dev[head_set_size:]
    n_val = len(rest) if validation_size is None else min(validation_size, len(rest))
    validation, rest = rest[:n_val], rest[n_val:]
    ph3 = rest if ph3_dev_size is None else rest[:ph3_dev_size]
    return ContextualSplits(tuple(head), tuple(validation), tuple(ph3), tuple(test if limit is None else test[:limit]))
