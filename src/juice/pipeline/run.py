"""What a run of the paper's pipelines is: its settings (:class:`ReproduceConfig`), the context
every stage shares (:class:`StageRun`: the model, the settings, the stage files, the progress
callback, the notes), the stage keys' common part, and what a run returns.

Stages are written atomically to `<out>/state/` under a key derived from everything they depend
on (:mod:`juice.io`), so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from juice.data.contextual import DATASETS, STUDY_SIZE_NAMES
from juice.data.paraconflict import DOMAINS
from juice.engine.backend import JUICE_ENGINE, Engine, stage_key
from juice.eval.tables import IntervalTable
from juice.eval.tuning import BETA_MINUS_GRID, BETA_PLUS_GRID
from juice.interventions import HeadSelection
from juice.io import StageFiles
from juice.methods import row_title
from juice.models import DEFAULT_MODEL, LoadedModel, load_model
from juice.progress import Progress, no_progress
from juice.stage1 import ALPHAS_NEGATIVE, ALPHAS_POSITIVE

SCORING_LABELS = {
    "exact": "exact Stage 1 (paper Alg. 2)",
    "hybrid": "APPROXIMATE Stage 1: attribution shortlist + exact re-score (not the paper's)",
    "attribution": "APPROXIMATE Stage 1: attribution patching only (not the paper's)",
}
"""Stage 1 scoring method -> how results name it (approximations say so)."""

@dataclass
class StageRun:
    """What every stage of a run shares: the model, the configuration, the stage files under
    `<out>/state/`, the progress callback, the notes the report will carry (stages append), the
    engine the stages ask (:mod:`juice.engine.backend`; juice's own by default) and where each
    stage ran (`engines`: stage or PH3 row key -> engine name, or the reason it ran on juice's
    engine) and where each table row was decoded (`row_engines`, by row key, the same for the test
    evaluation's rows); the record titles them (:meth:`engine_record`).
    """

    lm: LoadedModel
    cfg: "ReproduceConfig"
    state: StageFiles
    progress: Progress = no_progress
    notes: list[str] = field(default_factory=list)
    engine: Engine = JUICE_ENGINE
    engines: dict[str, str] = field(default_factory=dict)
    row_engines: dict[str, str] = field(default_factory=dict)

    def ran(self, stage: str, where: str | None = None) -> None:
        """Record that `stage` ran on the run's engine, or, with `where`, on juice's engine for
        that reason (said once in the notes)."""
        if where is None or self.engine.in_process:
            self.engines[stage] = self.engine.name
            return
        self.engines[stage] = f"juice ({where})"
        note = f"{row_title(stage)} ran on juice's engine: {where}"
        if note not in self.notes:
            self.notes.append(note)

    def engine_record(self) -> dict[str, Any]:
        """results.json's `protocol.engine`: the run's engine, where each stage ran and where each
        table row was decoded; for vLLM also whether juice's own copy of the model was loaded
        (`juice_copy`: loaded, device, seconds; :class:`juice.models.DeferredModel`) and
        :meth:`juice.vllm.engine.VllmEngine.provenance`. Rows (and PH3's stages) by key; the
        files title them (:func:`juice.pipeline.stages.titled_result`)."""
        record = {"name": self.engine.name, "stages": dict(self.engines), "rows": dict(self.row_engines)}
        if not self.engine.in_process:   # juice's own copy of the model: loaded only by a stage on juice's engine
            seconds = getattr(self.lm, "load_seconds", None)
            record["juice_copy"] = {"loaded": self.lm.loaded, "device": str(self.lm.device),
                                    **({"load_seconds": round(seconds, 3)} if seconds is not None else {})}
        provenance = getattr(self.engine, "provenance", None)
        if provenance is not None:   # vLLM: its version, device, requests and server starts (within the stages' times)
            record.update(provenance())
        return record


PARACONFLICT_STUDY_SIZES = {"default": (8, 8), "published": (55, 50)}
"""ParaConflict's when-to-steer study sizes, (validation, test) questions per domain, six domains."""


def study_sizes() -> dict[str, dict[str, tuple[int, int]]]:
    """The when-to-steer study's distinct questions per source, (validation, test), by source and
    size: each contextual dataset's entry that has `study_sizes` (:data:`juice.data.contextual.DATASETS`,
    as it stands now) and "paraconflict" (:data:`PARACONFLICT_STUDY_SIZES`); docs/when-to-steer.md:
    the published tables hold at least 250 test and 300 validation questions per source."""
    return {**{name: dict(d.study_sizes) for name, d in DATASETS.items() if d.study_sizes},
            "paraconflict": dict(PARACONFLICT_STUDY_SIZES)}

DEFAULT_TEST_ITEMS = {"parametric": 30, "contextual": 20}
"""Test items per domain / dataset by default: as many as fit 20 minutes on 2 CPU cores (README)."""


@dataclass
class ReproduceConfig:
    """Settings of `juice reproduce` (both directions). The defaults run the paper's protocol
    (exact Stage 1, per-domain tuning) sized to fit 20 minutes per direction on 2 CPU cores with
    Gemma 3 270M (docs/development.md, "Measured"); `juice reproduce --full` uses every item."""

    model: str = DEFAULT_MODEL
    out_dir: Path = Path("juice-output")
    limit: int | None | str = "default"  # test items per domain (dataset); None = all; "default" =
                                         # DEFAULT_TEST_ITEMS of the direction
    validation_size: int | None = 4     # known validation items per domain; None = all
    head_set_size: int = 4
    k: int = 5
    scoring: str = "exact"              # exact (the paper) | attribution | hybrid (approximations)
    shortlist: int = 12                 # heads per sign re-scored exactly (hybrid)
    alphas_positive: tuple[float, ...] = ALPHAS_POSITIVE
    alphas_negative: tuple[float, ...] = ALPHAS_NEGATIVE
    seed: int = 0
    data: Path | None = None            # the paper's ParaConflict layout (one folder per domain)
    domains: tuple[str, ...] = tuple(DOMAINS)
    filter: bool = True                 # filter D / validation / PH3-l items for the model
    max_rows: int | str = 128           # rows per batched forward, or "auto" (a share of free memory)
    device: str = "auto"                # auto | cpu | cuda | mps (ignored with device_map)
    device_map: str | None = None       # e.g. "auto": shard over GPUs with accelerate
    dtype: str = "float32"              # float32 | bfloat16 | float16
    baselines: bool = True              # Prompt and PH3 rows (and CAD, AdaCAD in the contextual direction)
    ph3_knockout: bool = False          # also PH3-l with the knock-out scorer, a row of its own
    ph3_dev_size: int | None = 12       # PH3-l development items (the paper: 200); None = all
    data_root: Path | None = None       # contextual: folder with memotrap/ and nqswap/
    validation_per_dataset: int | None = 5  # contextual: validation items per dataset
    bootstrap_resamples: int = 2000
    beta_plus_grid: tuple[float, ...] = BETA_PLUS_GRID    # tuning grid of beta+ (paper App. D.1)
    beta_minus_grid: tuple[float, ...] = BETA_MINUS_GRID  # of beta-; the authors' contextual script goes to -5
    degeneration_margin: float | None = None  # juice's option, not the paper's: tuning refuses settings whose
                                              # validation degeneration exceeds Original's by more (points)
    contexts: tuple[str, ...] = ()      # contextual: the when-to-steer study after Table 2, on sources of
                                        # study_sizes(): NQ-Swap and / or "paraconflict" (the six built-in
                                        # domains, or `data`'s files)
    study_size: str = "default"         # the study's questions: default | published (study_sizes())
    engine: str = "juice"               # juice (this process) | vllm (vLLM's server with juice's plugin)
    vllm_args: tuple[str, ...] = ()     # engine vllm: more arguments for vLLM's server (e.g. --tensor-parallel-size=2)
    stage1_engine: str | None = None    # engine vllm: "juice" runs exact Stage 1 on juice's engine (its growing
                                        # batch runs the layers below a scaled head once); None: the run's engine
    vllm_offline: bool = False          # engine vllm: vLLM's offline LLM in a process of vLLM's Python, asked
                                        # in one LLM.generate call per batch (juice.vllm.offline), no server

    def __post_init__(self) -> None:
        """Raises:
            ValueError: a Stage 1 scoring other than exact, hybrid or attribution; a
                degeneration margin that is not a finite number >= 0; `max_rows` neither a
                positive number nor "auto"; an engine other than juice or vllm; `vllm_args`
                or `vllm_offline` without engine vllm; a `stage1_engine` other than juice or the run's
                engine.
        """
        if self.scoring not in SCORING_LABELS:
            raise ValueError(f"scoring must be exact, hybrid or attribution, not {self.scoring!r}")
        margin = self.degeneration_margin
        if margin is not None and not (isinstance(margin, (int, float)) and math.isfinite(margin) and margin >= 0):
            raise ValueError(f"degeneration_margin must be a number of percentage points >= 0, not {margin!r}")
        sources = study_sizes()
        unknown = [c for c in self.contexts if c not in sources]
        if unknown:
            raise ValueError(f"contexts: unknown dataset {unknown[0]!r}; choose from {', '.join(sources)}")
        if self.study_size not in STUDY_SIZE_NAMES:
            raise ValueError(f"study_size must be default or published, not {self.study_size!r}")
        if self.max_rows != "auto" and not (isinstance(self.max_rows, int) and self.max_rows > 0):
            raise ValueError(f'max_rows must be a positive number of rows or "auto", not {self.max_rows!r}')
        kind = self.engine_class   # the engine's name read here, once (juice.engines)
        self.vllm_args = tuple(self.vllm_args)
        if self.vllm_args and kind.in_process:
            raise ValueError("vllm_args are for engine vllm")
        if self.stage1_engine not in (None, self.engine) and not (
                self.stage1_engine in _engine_names() and _engine_class(self.stage1_engine).in_process):
            raise ValueError(f"stage1_engine must be juice or the run's engine ({self.engine}), "
                             f"not {self.stage1_engine!r}")
        if self.vllm_offline and kind.in_process:
            raise ValueError("vllm_offline is for engine vllm")

    @property
    def engine_class(self) -> "type[Engine]":
        """The class of the engine `engine` names (:func:`juice.engines.engine_class`).

        Raises:
            ValueError: no engine has that name."""
        return _engine_class(self.engine)

    @property
    def stage1_in_process(self) -> bool:
        """Exact Stage 1 is asked onto juice's own engine (`stage1_engine` names an engine that
        runs in this process) while the run's engine is another."""
        return (self.stage1_engine is not None and not self.engine_class.in_process
                and _engine_class(self.stage1_engine).in_process)

    def test_limit(self, direction: str) -> int | None:
        """Test items per domain (parametric) or dataset (contextual); None = all.

        Raises:
            ValueError: `limit` is negative or a string other than "default".
        """
        if self.limit == "default":
            return DEFAULT_TEST_ITEMS[direction]
        if self.limit is not None and (not isinstance(self.limit, int) or self.limit < 0):
            raise ValueError(f"limit must be a non-negative number of items, None or 'default', not {self.limit!r}")
        return self.limit


@dataclass
class ReproduceResult:
    """What :func:`reproduce` (and :func:`juice.experiments.table2.reproduce_contextual`)
    return; `results.json` holds the same, plus every item's outputs."""

    config: ReproduceConfig
    model: dict[str, Any]
    selection: HeadSelection
    choices: dict[str, dict[str, Any]]          # domain -> betas, PH3 k and pruned heads, provenance
    table: IntervalTable                        # unfiltered test split (exact match)
    table_known: IntervalTable | None           # test items the model knows (parametric)
    summary: dict[str, dict[str, float]]
    timings: dict[str, float]
    splits: dict[str, dict[str, Any]]           # domain -> split sizes, filter counts and item ids per split
    domains: list[str]
    titles: dict[str, str]
    notes: list[str] = field(default_factory=list)
    methods: tuple[str, ...] = ()               # the table's rows in order, by key (juice.methods.Row)
    likelihood: IntervalTable | None = None     # contextual: MemoTrap by likelihood comparison
    degeneration: IntervalTable | None = None   # share of degenerate outputs (juice.eval.degeneration)
    head_domain: str = "world_capital"          # whose D the heads come from
    contexts: dict[str, IntervalTable] | None = None   # contextual: NQ-Swap's test questions under every context type
    studies: dict[str, dict[str, Any]] = field(default_factory=dict)   # contextual: the when-to-steer study's
                                                                      # headline per dataset (cfg.contexts)
    correct_not_degenerate: IntervalTable | None = None   # exact match on a non-degenerate output
    engines: dict[str, Any] | None = None   # protocol.engine: the engine, where each stage and row ran


def _engine_class(name: str) -> "type[Engine]":
    from juice.engines import engine_class

    return engine_class(name)


def _engine_names() -> tuple[str, ...]:
    from juice.engines import ENGINES

    return tuple(ENGINES)


def tuning_label(cfg: ReproduceConfig, unit: str) -> str:
    """How the betas and k were chosen, for the results' "protocol" record."""
    label = f"per {unit}, on its own validation split"
    if cfg.degeneration_margin is not None:
        label += (f"; NOT the paper's criterion alone: settings whose validation degeneration exceeds Original's "
                  f"by more than {cfg.degeneration_margin:g} points refused")
    return label


def start_run(cfg: ReproduceConfig, lm: LoadedModel | None, progress: Progress = no_progress,
              engine: Engine | None = None) -> tuple[StageRun, dict[str, float]]:
    """The run's shared context (the model, loaded unless given; the stage files under
    `<out>/state/`; the engine, given or juice's own) and the timings with the load time.

    Raises:
        ValueError: `engine` is not the engine `cfg.engine` names, or not offline as
            `cfg.vllm_offline` says (an engine other than juice's is made and closed by the caller:
            its class's `open`, :attr:`ReproduceConfig.engine_class`).
    """
    engine = engine or JUICE_ENGINE
    if engine.name != cfg.engine:
        raise ValueError(f"the configuration names engine {cfg.engine}, but the {engine.name} engine was given "
                         "(cfg.engine_class.open makes it)")
    if bool(getattr(engine, "offline", False)) != cfg.vllm_offline:
        raise ValueError(f"the configuration says vllm_offline={cfg.vllm_offline}, but the engine given "
                         f"{'is' if getattr(engine, 'offline', False) else 'is not'} offline")
    t = time.perf_counter()
    if lm is None:
        lm = load_model(cfg.model, dtype=getattr(torch, cfg.dtype), device_map=cfg.device_map,
                        device=engine.model_device(cfg.device, cfg.stage1_in_process),
                        defer=not engine.in_process)   # else loaded by the first stage run on juice's engine
    engine.check(lm)
    return (StageRun(lm, cfg, StageFiles(Path(cfg.out_dir) / "state"), progress, engine=engine),
            {"load_model": time.perf_counter() - t})


def run_key_base(lm: LoadedModel, cfg: ReproduceConfig, **extra: Any) -> dict[str, Any]:
    """What every stage key holds: the model (weights, tokenizer), the juice version, the seed,
    and the engine where it is not juice's own (its floats differ in the last bits, so a run
    resumed on another engine recomputes; juice's own keeps the keys it always had)."""
    from juice import __version__

    return {"model": lm.fingerprint(), "juice": __version__, "seed": cfg.seed, **stage_key(cfg.engine_class), **extra}


def scoring_title(cfg: ReproduceConfig) -> str:
    """The table title's note on how the heads were scored (approximations say so)."""
    return SCORING_LABELS[cfg.scoring]


def selection_to_json(sel: HeadSelection) -> dict:
    """{"positive": ["L6H3", ...], "negative": [...]}: the heads, named from 0."""
    return {"positive": [str(h) for h in sel.positive], "negative": [str(h) for h in sel.negative]}
