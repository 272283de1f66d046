"""Seeded splits: head identification set D, validation, test (paper Sec. 4, App. D.1).

The test split is carved first and does not depend on the model (reported unfiltered, as in
Table 1, the paper's Table 3). The rest is the development pool; per model it is *filtered* to the items the
model answers correctly on the clean prompt, and D and the validation split come from that.
"""

from __future__ import annotations

import json
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
"""The split files of one domain folder with |D| = 4 (the paper's setting); other sizes:
:func:`paper_split_files`."""

MODEL_SUFFIX = "_gemma"
"""The authors' domain folders are named for the model the splits were made for
(`world_capital_gemma`); the domain's name is the folder's without it."""


def paper_split_files(head_set_size: int = 4) -> dict[str, str]:
    """split -> file name in a ParaConflict domain folder for a head set D of `head_set_size` items."""
    return {**PAPER_SPLIT_FILES, "head_set": f"head_finding_set_size_{head_set_size}.json"}


def load_paper_splits(folder: str | Path, head_set_size: int = 4, domain: str | None = None) -> Splits:
    """The paper's own splits of one ParaConflict domain folder (made for Gemma-2b).

    Args:
        folder: holds `head_finding_set_size_<n>.json`, `filtered_validation.json`,
            `unfiltered_test.json`.
        head_set_size: n, the size of D the folder was made for.
        domain: the items' domain; default the folder's name.

    Raises:
        FileNotFoundError: a split file is missing (the message lists the expected names).
        ValueError: a file is malformed (the message names the file, the item and the field).
    """
    folder = Path(folder)
    names = paper_split_files(head_set_size)
    missing = [name for name in names.values() if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{folder} lacks {', '.join(missing)} (expected the ParaConflict split files)")
    parts = {key: tuple(load_paraconflict_json(folder / name, domain)) for key, name in names.items()}
    return Splits(**parts)


@dataclass(frozen=True)
class DomainPool:
    """One domain before the model filters it.

    Attributes:
        pool: the development pool. Without `head_pool` (the built-in domains), D (head domain
            only), validation and PH3-l's development set come from its known items, in this
            order; with it (the authors' files), validation and PH3-l's set do, and D only where
            the model knows fewer than |D| items of `head_pool`.
        test: the unfiltered test split.
        head_pool: the authors' head-finding file (`head_finding_set_size_<n>.json`), D's
            source in the head domain; empty for the built-in domains.
    """

    pool: tuple[ConflictExample, ...]
    test: tuple[ConflictExample, ...]
    head_pool: tuple[ConflictExample, ...] = ()

    @property
    def development(self) -> tuple[ConflictExample, ...]:
        """Every development item, the head-finding file's first (what an analysis may draw on)."""
        return self.head_pool + self.pool


def _has_split_files(folder: Path, head_set_size: int) -> bool:
    return any((folder / name).is_file() for name in paper_split_files(head_set_size).values())


def find_paper_domains(folder: str | Path, head_set_size: int = 4) -> dict[str, Path]:
    """The domain folders under `folder`, by domain name, in name order.

    Accepted layouts (the split files of :func:`paper_split_files`):

    - one domain folder holding the split files (the domain is its name; a folder named
      `head_size_<n>` takes its parent's name);
    - a folder of domain folders (`world_capital/`, ...), each holding the split files;
    - the authors' repository as it is, `dataset/factual/`: `<domain>_gemma/head_size_<n>/`.

    A domain folder's trailing `_gemma` (:data:`MODEL_SUFFIX`) is dropped from its name.

    Raises:
        FileNotFoundError: `folder` does not exist or holds no domain folder.
        ValueError: two folders give the same domain name.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no ParaConflict folder at {folder}")
    sized = f"head_size_{head_set_size}"

    def name_of(f: Path) -> str:
        name = f.parent.name if f.name == sized else f.name
        return name[: -len(MODEL_SUFFIX)] if name.endswith(MODEL_SUFFIX) else name

    if _has_split_files(folder, head_set_size):
        found = [folder]
    else:
        found = []
        for sub in sorted(f for f in folder.iterdir() if f.is_dir()):
            if _has_split_files(sub, head_set_size):
                found.append(sub)
            elif _has_split_files(sub / sized, head_set_size):
                found.append(sub / sized)
    if not found:
        raise FileNotFoundError(
            f"{folder} holds no ParaConflict domain (expected sub-folders with "
            f"{', '.join(paper_split_files(head_set_size).values())}, or the authors' <domain>_gemma/{sized}/)")
    out: dict[str, Path] = {}
    for f in found:
        name = name_of(f)
        if name in out:
            raise ValueError(f"{out[name]} and {f} are both domain {name!r}")
        out[name] = f
    return out


def load_paper_domains(folder: str | Path, head_set_size: int = 4) -> dict[str, DomainPool]:
    """The paper's ParaConflict layout (:func:`find_paper_domains`; docs/protocol.md, "Parametric direction:
    splits and filtering"), every file read and checked before any model work.

    The authors' splits: `head_pool` is the head-finding file (D, in the head domain), `pool` the
    validation file (`filtered_validation.json`: the domain's validation split and, in the head
    domain, PH3-l's development set), both made for Gemma-2b and re-filtered for the loaded model
    by the pipeline unless `--no-filter` (:func:`juice.pipeline.domains.prepare_domains`); an
    item of the validation file that is also in the head-finding file is left out of `pool`. The
    test split is `unfiltered_test.json`. Items are told apart by their id (file and position): a
    subject that repeats within a split (the paper's Official Language test split holds Australia
    twice) is two items.

    Returns:
        domain -> pool and test, domains in name order.

    Raises:
        FileNotFoundError: no domain folder, or a domain folder lacks a split file (the message
            lists the expected names).
        ValueError: a malformed file (the file, the item and the field named), a domain with
            an empty test file, or a subject both in the test file and in the head-finding or
            validation file.
    """
    out = {}
    for domain, f in find_paper_domains(folder, head_set_size).items():
        splits = load_paper_splits(f, head_set_size, domain)
        in_head = {json.dumps(ex.to_json(), sort_keys=True) for ex in splits.head_set}
        pool = tuple(ex for ex in splits.validation if json.dumps(ex.to_json(), sort_keys=True) not in in_head)
        if not splits.test:
            raise ValueError(f"{f / PAPER_SPLIT_FILES['test']}: no items")
        shared = sorted({ex.subject for ex in (*splits.head_set, *pool)} & {ex.subject for ex in splits.test})
        if shared:
            raise ValueError(f"{f}: {len(shared)} subjects are both in the test file and in the head-finding or "
                             f"validation file (e.g. {shared[0]!r}); the splits must be disjoint")
        out[domain] = DomainPool(pool, splits.test, splits.head_set)
    return out
