"""What every `juice analyze` study shares: options, the filtered World Capital items, output
files and checkpoints (the commands are :mod:`juice.apps.analyze`).

How to write an analysis module (`juice/analysis/<name>.py`):

```python
@dataclass
class NameResult:                     # what run_name returns
    title: str                        # one line, e.g. "Fig. 3: knock-out per layer"
    files: list[Path]                 # what write_outputs wrote (JSON first, then .md, .png)
    wall_s: float                     # seconds, model loading excluded
    ...                               # the numbers behind the table / figure
    def to_json(self) -> dict: ...

def run_name(lm: LoadedModel, options: AnalysisOptions, progress: Progress = no_progress) -> NameResult:
    items = world_capital_items(lm, options, progress)   # filtered World Capital (cached)
    ckpt = unit_checkpoint(lm, options, "name")          # per-prompt results: resumable
    ...
    files = write_outputs(options.out, "name", result.to_json(), markdown, figure)
```

Its command is one entry of `COMMANDS` in :mod:`juice.apps.analyze` (the shared options
--model --out --quick --full --seed --device --max-rows, and any option of its own); the
library never imports typer.

Sizes: `options.size(default=..., quick=..., full=None)` picks the number of items for the mode
(`--quick`: a smoke test in <= 3 minutes on 2 CPU cores; default: minutes; `--full`: the paper's
size, every item).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from juice.data.records import ConflictExample
from juice.data.splits import DomainPool
from juice.data.metrics import is_correct
from juice.pipeline.domains import HEAD_DOMAIN, domain_sources, filter_domain
from juice.pipeline.run import ReproduceConfig, StageRun, run_key_base
from juice.progress import Progress, no_progress
from juice.io import StageFiles, UnitCheckpoint, settings_key, write_json_atomic
from juice.models import DEFAULT_MODEL, LoadedModel

DEFAULT_OUT = Path("juice-analysis")
QUICK_KNOWN = 4
"""Known development items that `--quick` asks the filter for (it decodes at least one chunk)."""
QUICK_TEST = 6
"""Test items kept with `--quick`."""


@dataclass
class AnalysisOptions:
    """Settings every analysis shares.

    Attributes:
        model: embedded alias, .gguf file, model directory or hub id (:func:`juice.models.load_model`).
        out: output folder; stage files and per-prompt checkpoints go to `<out>/state/`.
        quick: a small version for smoke tests (<= 3 minutes on 2 CPU cores).
        full: the paper's size (every item); the default is sized for minutes on 2 CPU cores.
        seed: data seed (the World Capital split and order, as `juice reproduce`).
        device: auto | cpu | cuda | cuda:N | mps.
        max_rows: most rows per batched forward, or "auto" (a share of free memory).
        filter: keep only the items the model answers correctly on the clean prompt (the paper's
            "filtered World Capital"); False treats every item as known (tests on random models).
        bootstrap_resamples: resamples of every 95% bootstrap interval.

    Raises:
        ValueError: both quick and full; max_rows neither a positive int nor "auto"; too few
            bootstrap resamples.
    """

    model: str = DEFAULT_MODEL
    out: Path = DEFAULT_OUT
    quick: bool = False
    seed: int = 0
    device: str = "auto"
    max_rows: int | str = "auto"
    full: bool = False
    filter: bool = True
    bootstrap_resamples: int = 2000

    def __post_init__(self) -> None:
        self.out = Path(self.out)
        if self.quick and self.full:
            raise ValueError("choose --quick or --full, not both")
        if isinstance(self.max_rows, str) and self.max_rows != "auto":
            if not self.max_rows.isdigit():
                raise ValueError(f"max rows must be a positive integer or 'auto', not {self.max_rows!r}")
            self.max_rows = int(self.max_rows)
        if isinstance(self.max_rows, int) and self.max_rows < 1:
            raise ValueError(f"max rows must be >= 1, got {self.max_rows}")
        if self.bootstrap_resamples < 1000:
            raise ValueError(f"the bootstrap needs at least 1,000 resamples, got {self.bootstrap_resamples}")

    @property
    def mode(self) -> str:
        """"quick", "default" or "full"."""
        return "quick" if self.quick else "full" if self.full else "default"

    def size(self, default: int | None, quick: int | None, full: int | None = None) -> int | None:
        """The size for this mode (None: every item)."""
        return quick if self.quick else full if self.full else default

    @property
    def state(self) -> StageFiles:
        """Stage files under `<out>/state/` (shared with `juice reproduce` when `out` is the same)."""
        return StageFiles(self.out / "state")

    def to_json(self) -> dict[str, Any]:
        return {k: str(v) if isinstance(v, Path) else v for k, v in self.__dict__.items()}


# ---------------------------------------------------------------- items


@dataclass
class WorldCapitalItems:
    """World Capital split as `juice reproduce` splits it, filtered for the loaded model.

    Attributes:
        known: development pool items the model answers correctly on the clean prompt (exact match
            of its greedy 10-token continuation), in the pool's seeded order, the model's preferred
            alias first (:mod:`juice.aliases`).
        test: the test split, unfiltered, preferred aliases first.
        test_known: the test items the model answers correctly on the clean prompt.
        counts: pool, decoded, known (development pool); test, test_known.
    """

    known: list[ConflictExample]
    test: list[ConflictExample]
    test_known: list[ConflictExample] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def filtered(self) -> list[ConflictExample]:
        """Every item the model knows, pool then test: the paper's "filtered World Capital"
        (App. D: "the model answers each clean input prompt correctly")."""
        return [*self.known, *self.test_known]


def reproduce_config(options: AnalysisOptions) -> ReproduceConfig:
    """The `juice reproduce` settings that give the same World Capital split."""
    return ReproduceConfig(model=options.model, out_dir=options.out, seed=options.seed, domains=(HEAD_DOMAIN,),
                           limit=QUICK_TEST if options.quick else None, filter=options.filter,
                           max_rows=options.max_rows, device=options.device)


def world_capital_items(lm: LoadedModel, options: AnalysisOptions, progress: Progress = no_progress) -> WorldCapitalItems:
    """The built-in World Capital items, split as `juice reproduce` splits them (half of them,
    seeded, are the test split) and filtered for `lm` (:func:`juice.pipeline.domains.filter_domain`).

    The clean-prompt outputs are cached under `<out>/state/` with a key of the model fingerprint,
    the juice version, the seed and the items, so a second analysis reads them. With `quick`, the
    filter stops after the first chunk that holds QUICK_KNOWN known items, and the test split is
    cut to QUICK_TEST items; otherwise the whole pool (91 items for seed 0) is decoded.

    Returns:
        :class:`WorldCapitalItems`; with `options.filter` False every item counts as known.
    """
    cfg = reproduce_config(options)
    source = domain_sources(cfg)[0][HEAD_DOMAIN]
    source = DomainPool(source.development, source.test)   # the analyses draw on every development item
    need = QUICK_KNOWN if options.quick else None
    base = run_key_base(lm, cfg)
    key = settings_key({**base, "stage": "filter", "domain": HEAD_DOMAIN, "filter": cfg.filter, "need": need,
                        "pool": [ex.to_json() for ex in source.pool], "test": [ex.to_json() for ex in source.test]})
    state = options.state
    known, test, counts = filter_domain(StageRun(lm, cfg, state, progress), key, HEAD_DOMAIN, source, need)
    if options.filter:
        saved = state.load(f"filter_{HEAD_DOMAIN}_{key}", key) or {}
        outputs = saved.get("test_outputs", [])
        test_known = [ex for ex, o in zip(test, outputs) if is_correct(o, ex.answers)]
    else:
        known = known if need is None else known[:need]
        test_known = list(test)
    return WorldCapitalItems(known, test, test_known, {**counts, "test": len(test), "test_known": len(test_known)})


def cut(items: Sequence[ConflictExample], n: int | None) -> list[ConflictExample]:
    """The first `n` items (all for None)."""
    return list(items if n is None else items[:n])


def unit_checkpoint(lm: LoadedModel, options: AnalysisOptions, name: str) -> UnitCheckpoint:
    """Per-prompt results of one analysis, under `<out>/state/<name>_units.json`, scoped to the
    model's fingerprint (another model's file is ignored and overwritten)."""
    return UnitCheckpoint(options.state.folder / f"{name}_units.json", lm.fingerprint())


# ---------------------------------------------------------------- outputs


def save_figure(figure: Any, path: Path) -> Path:
    """Write a matplotlib figure to `path` (PNG, 120 dpi) atomically, then close it
    (:func:`juice.plots.save_png`)."""
    from juice.plots import save_png

    return save_png(figure, path, dpi=120)


def write_outputs(out: str | Path, name: str, data: dict, markdown: str, figure: Any = None) -> list[Path]:
    """Write `<out>/<name>.json` (atomically), `<out>/<name>.md` and, with a figure,
    `<out>/<name>.png` (saved, then closed).

    Returns:
        The paths written, in that order.

    Raises:
        ValueError: an empty name or one with a path separator.
    """
    if not name or "/" in name or os.sep in name:
        raise ValueError(f"an output name must be a plain file stem, not {name!r}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.json", out / f"{name}.md"]
    write_json_atomic(paths[0], data)
    fd, tmp = tempfile.mkstemp(prefix=paths[1].name + ".", dir=out)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(markdown if markdown.endswith("\n") else markdown + "\n")
    os.replace(tmp, paths[1])
    if figure is not None:
        paths.append(save_figure(figure, out / f"{name}.png"))
    return paths


__all__ = [
    "AnalysisOptions", "DEFAULT_OUT", "WorldCapitalItems", "cut", "reproduce_config", "save_figure", "unit_checkpoint", "world_capital_items",
    "write_outputs",
]
