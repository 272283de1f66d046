"""The contextual datasets of Table 2 (the paper's Table 4), one table (:data:`DATASETS`), and their
seeded splits (Sec. 2.2, 4.2).

Each :class:`ContextualDataset` holds a dataset's name, title, metric (:data:`juice.data.metrics.METRICS`),
the folder it is read from under the data root and its loader; every reader asks the table: the
pipeline loads and splits by it (:mod:`juice.experiments.table2`), the data check names its
folders, the tables take their titles from it. A contextual dataset is one data module (its
loader) plus one entry here (plus one :class:`juice.data.metrics.Metric` if its metric is new).

Columns of Table 2, in order: NQ-Swap, Hate Speech Ending, History of Science QA, Proverb
Ending, Proverb Translation. Heads are identified on Proverb Ending only and reused for all five.

Splits, per dataset, seeded: the rows are shuffled; the second half is the test pool (reported
unfiltered, cut to `limit`); the first half is the development pool, from which come the head
identification set D (first `head_set_size`), the validation split (next `validation_size`) and
PH3-l's development set (the next `ph3_dev_size`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from juice.data.context_types import nqswap_folder_items
from juice.data.memotrap import SUBTASKS, TITLES, load_memotrap
from juice.data.nqswap import load_nqswap
from juice.data.records import ContextualExample


@dataclass(frozen=True)
class ContextualDataset:
    """One contextual dataset's facts.

    Attributes:
        name: its name in records (`ContextualExample.dataset`) and results.
        title: its column's title in Table 2.
        metric: its metric (:data:`juice.data.metrics.METRICS`; the records name it too).
        folder: the folder under the data root that holds its files (`memotrap`, `nqswap`).
        load: `folder path -> its rows` (:class:`juice.data.records.ContextualExample`), raising
            FileNotFoundError where the files are not there and ValueError where a row does not parse.
        source: where it comes from.
        context_items: `(folder, seed, test_uids, fits) -> items`: its questions under every
            context type (:mod:`juice.data.context_types`; Table 2's run on its test questions,
            the harness tasks on all), for a dataset that has them; None otherwise.
        study_sizes: the when-to-steer study's distinct questions, (validation, test), per size
            name (:data:`STUDY_SIZE_NAMES`), for a dataset the study runs on; None otherwise.
    """

    name: str
    title: str
    metric: str
    folder: str
    load: Callable[[Path], list[ContextualExample]]
    source: str = ""
    context_items: Callable[..., list] | None = None
    study_sizes: Mapping[str, tuple[int, int]] | None = None


DATASETS: dict[str, ContextualDataset] = {d.name: d for d in (
    ContextualDataset("nqswap", "NQ-Swap", "nqswap", "nqswap", load_nqswap,
                      "NQ-Swap (Longpre et al. 2021): Natural Questions with the answer substituted in the passage",
                      context_items=nqswap_folder_items,
                      study_sizes={"default": (40, 40), "published": (300, 250)}),
    *(ContextualDataset(s, TITLES[s], "memotrap", "memotrap", partial(load_memotrap, subtask=s),
                        "MemoTrap (Liu and Liu 2023, Inverse Scaling Prize)")
      for s in sorted(SUBTASKS)),
)}
"""Every contextual dataset, by name, in Table 2's column order: the one place its facts live."""

CONTEXTUAL_DATASETS: tuple[str, ...] = tuple(DATASETS)
"""The datasets' names as :data:`DATASETS` holds them at import (juice's readers read the table)."""


def dataset_titles() -> dict[str, str]:
    """Dataset name -> its column's title, from :data:`DATASETS` as it stands now."""
    return {name: d.title for name, d in DATASETS.items()}


CONTEXTUAL_TITLES: dict[str, str] = dataset_titles()
"""Name -> title, as :data:`DATASETS` holds them at import (juice's readers call :func:`dataset_titles`)."""
HEAD_DATASET = "proverb_ending"
"""The dataset whose D identifies the heads for all five (paper Sec. 4.2)."""
STUDY_DATASET = "nqswap"
"""The contextual dataset of the when-to-steer study: Table 2's run also asks its test questions
under every context type (its entry's `context_items`), and its tuned betas are the ones a
contextual heads file carries (the study's steerings, the shipped heads)."""
STUDY_SIZE_NAMES: tuple[str, ...] = ("default", "published")
"""The when-to-steer study's sizes (`juice reproduce --study-size`; an entry's `study_sizes`)."""


def dataset_named(name: str) -> ContextualDataset:
    """The contextual dataset `name` (:data:`DATASETS`).

    Raises:
        ValueError: an unknown dataset (the message lists the table's).
    """
    if name not in DATASETS:
        raise ValueError(f"unknown contextual dataset {name!r}; choose from {tuple(DATASETS)}")
    return DATASETS[name]


def load_contextual(name: str, data_root: str | Path) -> list[ContextualExample]:
    """All rows of one contextual dataset from `data_root` (a folder holding each dataset's folder,
    `memotrap/` and `nqswap/` for the paper's, e.g. `../shared/data`).

    Raises:
        ValueError: unknown dataset name, or a row that does not parse.
        FileNotFoundError: the files are not there.
    """
    dataset = dataset_named(name)
    return dataset.load(Path(data_root) / dataset.folder)


def missing_folders(data_root: str | Path) -> list[str]:
    """The datasets' folders (:data:`DATASETS`) that `data_root` does not hold, in table order."""
    root = Path(data_root)
    return [f for f in dict.fromkeys(d.folder for d in DATASETS.values()) if not (root / f).is_dir()]


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


__all__ = ["CONTEXTUAL_DATASETS", "CONTEXTUAL_TITLES", "ContextualDataset", "ContextualSplits", "DATASETS",
           "HEAD_DATASET", "STUDY_DATASET", "STUDY_SIZE_NAMES", "contextual_splits", "dataset_named", "dataset_titles", "load_contextual", "missing_folders"]
