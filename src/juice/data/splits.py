"""Seeded splits: head identification set D, validation, test (paper Sec. 4, App. D.1).

The test split is carved first and does not depend on the model (reported unfiltered, as in the
paper's Table 1). The rest is the development pool; per model it is *filtered* to the items the
model answers correctly on the clean prompt, and D and the validation split come from that.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from juice.data.paraconflict import load_paraconflict_json
from juice.data.records import ConflictExample


@dataclass(frozen=True)
class Splits:
    """Head identification set D, validation split and test split of one domain, and PH3-l's
    development set (items the model knows outside D and validation; head domain only)."""

    head_set: tuple[ConflictExample, ...]
    validation: tuple[ConflictExample, ...]
    test: tuple[ConflictExample, ...]
    ph3_dev: tuple[ConflictExample, ...] = ()


def split_test(examples: Sequence[ConflictExample], seed: int = 0, test_fraction: float = 0.5):
    """Shuffle with `seed` and cut off the test split.

    Returns:
        (development pool, test split), disjoint, together all of `examples`.
    """
    order = list(examples)
    random.Random(f"test/{seed}").shuffle(order)
    n_test = round(len(order) * test_fraction)
    return order[n_test:], order[:n_test]


PAPER_SPLIT_FILES = {
    "head_set": "head_finding_set_size_4.json",
    "validation": "filtered_validation.json",
    "test": "unfiltered_test.json",
}


def load_paper_splits(folder: str | Path) -> Splits:
    """The paper's own splits of one ParaConflict domain folder (made for Gemma-2b).

    Raises:
        FileNotFoundError: a split file is missing (the message lists the expected names).
    """
    folder = Path(folder)
    missing = [name for name in PAPER_SPLIT_FILES.values() if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{folder} lacks {', '.join(missing)} (expected the ParaConflict split files)")
    parts = {key: tuple(load_paraconflict_json(folder / name)) for key, name in PAPER_SPLIT_FILES.items()}
    return Splits(**parts)


@dataclass(frozen=True)
class DomainPool:
    """One domain before the model filters it: the development pool (D, validation and PH3-l's
    development set come from its known items, in this order) and the unfiltered test split."""

    pool: tuple[ConflictExample, ...]
    test: tuple[ConflictExample, ...]


def _has_split_files(folder: Path) -> bool:
    return any((folder / name).is_file() for name in PAPER_SPLIT_FILES.values())


def load_paper_domains(folder: str | Path) -> dict[str, DomainPool]:
    """The paper's ParaConflict layout: a folder with one sub-folder per domain (or one domain
    folder), each holding `head_finding_set_size_4.json`, `filtered_validation.json` and
    `unfiltered_test.json` (PROTOCOL.md, "Splits per domain").

    The development pool is the head-finding set followed by the validation file (made for
    Gemma-2b; re-filtered for the loaded model by the pipeline), so a model that knows the
    paper's D gets the same D. The test split is `unfiltered_test.json`.

    Returns:
        domain (the sub-folder's name) -> pool and test, sub-folders in name order.

    Raises:
        FileNotFoundError: no domain folder, or a domain folder lacks a split file (the message
            lists the expected names).
        ValueError: a subject is in the test file and in the head-finding or validation file.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no ParaConflict folder at {folder}")
    folders = [folder] if _has_split_files(folder) else sorted(
        f for f in folder.iterdir() if f.is_dir() and _has_split_files(f))
    if not folders:
        raise FileNotFoundError(f"{folder} holds no ParaConflict domain (expected sub-folders with "
                                f"{', '.join(PAPER_SPLIT_FILES.values())})")
    out = {}
    for f in folders:
        splits = load_paper_splits(f)
        pool: dict[str, ConflictExample] = {}
        for ex in (*splits.head_set, *splits.validation):
            pool.setdefault(ex.subject, ex)  # first occurrence of each subject, in file order
        shared = sorted(set(pool) & {ex.subject for ex in splits.test})
        if shared:
            raise ValueError(f"{f}: {len(shared)} subjects are both in the test file and in the head-finding or "
                             f"validation file (e.g. {shared[0]!r}); the splits must be disjoint")
        out[f.name] = DomainPool(tuple(pool.values()), splits.test)
    return out
