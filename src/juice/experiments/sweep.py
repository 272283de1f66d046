"""A sweep: the paper's pipeline over models x directions, its table over their domains and
methods, each job run as a Ray task (`juice sweep FILE.toml`), resumable, one results table with n
and 95% intervals per cell.

A job is one (model, direction): `juice reproduce` with the sweep's settings in its own folder
(`<out>/jobs/<model>-<direction>/`). Not finer: a direction's domains share D, Stage 1's heads and
PH3-l's development set (the paper's protocol, :mod:`juice.experiments.table1`), so a job per domain
would either recompute them or change them. Ray places the jobs (its own scheduling, each job
asking for `cpus` / `gpus`); juice schedules nothing. Ray Data's LLM processor (`ray.data.llm`) is
not used: a job's stages depend on each other (the heads, then the betas, then the test rows),
which a map over independent rows does not express, and its vLLM must import in the workers'
Python, while juice's CPU environment and vLLM's differ (:mod:`juice.vllm.offline`). A job on
`engine = "vllm"` starts its own vLLM (server or offline worker) inside its task, on the GPUs Ray
gave it.

Resuming: a finished job leaves `job.json` (its cells and the key of what it ran); a job whose
`job.json` holds the same key is read, not run. A job stopped part-way (killed, a node lost)
resumes inside `juice reproduce`'s own stage files, so finished stages are not recomputed. Every
file is written atomically.

The sweep file (TOML)::

    [grid]
    models = ["gemma-3-270m"]                    # juice's model names, folders or hub ids
    directions = ["parametric"]                  # parametric | contextual
    domains = ["world_capital", "athlete_sport"]  # parametric: ParaConflict domains; contextual:
                                                 # memotrap | nqswap (the table's columns)
    methods = ["Original", "JuICE"]               # the table's rows, by title or key ("juice");
                                                 # none of the baselines: they are not run
    [settings]                                   # ReproduceConfig's fields, e.g.
    limit = 10
    [ray]                                        # optional
    cpus = 1                                     # per job (Ray's num_cpus)
    gpus = 0                                     # per job (Ray's num_gpus)
    max_retries = 0                              # Ray re-runs a job lost with its worker
"""

from __future__ import annotations

import hashlib
import json
import re
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from juice.data.contextual import DATASETS as CONTEXTUAL_DATASETS   # the contextual direction's columns
from juice.io import write_json_atomic, write_text_atomic
from juice.methods import row_key, row_title

DIRECTIONS = ("parametric", "contextual")


def _table_specs() -> tuple:
    """Every method that is a row of Table 1 or Table 2, once, in registry order."""
    from juice.methods import TABLES, table_methods

    return tuple(dict.fromkeys(s for t in TABLES for s in table_methods(t)))


def steering_rows() -> tuple[str, ...]:
    """The rows every job decodes: Original and the tuned steerings (JuNE, JuICE), the keys of
    the registry's table methods (:func:`juice.methods.table_methods`) that are no baseline."""
    return tuple(s.name for s in _table_specs() if not s.baseline)


def baseline_rows() -> tuple[str, ...]:
    """Table 1's and Table 2's baseline rows, read from the registry when called (a new entry with
    `tables` is one): every table method's key but :func:`steering_rows`'s, PH3 as its rows
    (:data:`juice.pipeline.stages.PH3_ROWS`). A sweep whose methods name none of them runs without
    the baselines (`baselines = false`, no PH3 stage) unless its `[settings]` say otherwise."""
    from juice.pipeline.stages import PH3_ROWS

    return tuple(row for s in _table_specs() if s.baseline for row in (PH3_ROWS if s.tuned == "k" else (s.name,)))


FIXED = ("model", "out_dir", "domains")
"""ReproduceConfig fields a sweep sets itself (`[settings]` may not)."""


class SweepError(ValueError):
    """A malformed sweep file (one line naming the key)."""


@dataclass(frozen=True)
class Job:
    """One (model, direction) of a sweep: where it runs and what it runs."""

    model: str
    direction: str
    domains: tuple[str, ...]
    settings: tuple[tuple[str, Any], ...]

    @property
    def name(self) -> str:
        """The job's folder name: the model's last path part and the direction, filesystem-safe."""
        model = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(self.model.rstrip("/")).name or self.model)
        return f"{model}-{self.direction}"

    def key(self) -> str:
        """What the job ran, hashed: a finished job with another key is run again."""
        from juice import __version__

        text = json.dumps([self.model, self.direction, list(self.domains), [list(s) for s in self.settings],
                           __version__], sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class Sweep:
    """A parsed sweep file (module docstring); its methods by row key (:class:`juice.methods.Row`)."""

    models: tuple[str, ...]
    directions: tuple[str, ...]
    domains: tuple[str, ...]
    methods: tuple[str, ...]
    settings: dict[str, Any] = field(default_factory=dict)
    cpus: float = 1.0
    gpus: float = 0.0
    max_retries: int = 0

    def jobs(self) -> list[Job]:
        """The jobs, models x directions, in the file's order; without baselines where no method
        is one (:func:`baseline_rows`) and the settings do not say."""
        settings = dict(self.settings)
        if "baselines" not in settings and not set(self.methods) & set(baseline_rows()):
            settings["baselines"] = False
        out = []
        for model in self.models:
            for direction in self.directions:
                domains = (tuple(d for d in self.domains if d in CONTEXTUAL_DATASETS) if direction == "contextual"
                           else tuple(d for d in self.domains if d not in CONTEXTUAL_DATASETS))
                out.append(Job(model, direction, domains, tuple(sorted(settings.items()))))
        return out


def load_sweep(path: str | Path) -> Sweep:
    """Read and check a sweep file.

    Raises:
        FileNotFoundError: no such file.
        SweepError: not TOML, a missing or empty list in `[grid]`, an unknown direction, a
            method that is no table row, a `[settings]` key that is not a ReproduceConfig field
            or that the sweep sets itself, settings ReproduceConfig refuses, a direction without
            domains, or two models whose job folders would be the same.
    """
    from juice.pipeline.run import ReproduceConfig

    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as err:
        raise SweepError(f"{path}: not TOML: {err}") from None
    grid = data.get("grid", {})
    lists = {}
    for key in ("models", "directions", "domains", "methods"):
        value = grid.get(key)
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            raise SweepError(f"{path}: [grid] {key} must be a non-empty list of names")
        lists[key] = tuple(value)
    rows = steering_rows() + baseline_rows()
    unknown = [m for m in lists["methods"] if row_key(m) not in rows]
    if unknown:
        raise SweepError(f"{path}: [grid] methods: {unknown[0]!r} is not a table row "
                         f"({', '.join(map(row_title, rows))})")
    lists["methods"] = tuple(map(row_key, lists["methods"]))
    bad = [d for d in lists["directions"] if d not in DIRECTIONS]
    if bad:
        raise SweepError(f"{path}: [grid] directions: {bad[0]!r} is not parametric or contextual")
    settings = dict(data.get("settings", {}))
    known = {f.name for f in fields(ReproduceConfig)}
    for key in settings:
        if key not in known or key in FIXED:
            raise SweepError(f"{path}: [settings] {key} is not a setting a sweep takes (ReproduceConfig's fields, "
                             f"less {', '.join(f for f in FIXED if f in known)})")
    for key in ("vllm_args", "contexts", "alphas_positive", "alphas_negative", "beta_plus_grid", "beta_minus_grid"):
        if isinstance(settings.get(key), list):
            settings[key] = tuple(settings[key])
    try:
        ReproduceConfig(**settings)
    except (TypeError, ValueError) as err:
        raise SweepError(f"{path}: [settings]: {err}") from None
    sweep = Sweep(**lists, settings=settings)
    names = [job.name for job in sweep.jobs()]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SweepError(f"{path}: [grid] models: two models would share the job folder {twice[0]!r}; give "
                         "each model a folder or hub id with its own last part")
    for job in sweep.jobs():
        if not job.domains:
            names = ", ".join(CONTEXTUAL_DATASETS) if job.direction == "contextual" else "ParaConflict domains"
            raise SweepError(f"{path}: [grid] domains: none for the {job.direction} direction ({names})")
    ray_part = data.get("ray", {})
    try:
        sweep.cpus, sweep.gpus = float(ray_part.get("cpus", 1)), float(ray_part.get("gpus", 0))
        sweep.max_retries = int(ray_part.get("max_retries", 0))
    except (TypeError, ValueError):
        raise SweepError(f"{path}: [ray] cpus and gpus must be numbers, max_retries a whole number") from None
    return sweep


def run_job(job: Job, out: str | Path) -> dict[str, Any]:
    """Run one job (`juice reproduce` in `<out>/jobs/<job.name>/`, resuming its stages) and write
    its `job.json`: the key, the cells (:func:`job_cells`), the node, the seconds, the heads, where
    each stage ran.
    Runs in a Ray worker (:func:`run_sweep`) or here.

    Returns:
        The content of `job.json`.
    """
    from juice.experiments.table1 import reproduce
    from juice.experiments.table2 import reproduce_contextual
    from juice.pipeline.run import ReproduceConfig, selection_to_json

    folder = Path(out) / "jobs" / job.name
    settings = dict(job.settings)
    parametric = job.direction == "parametric"
    cfg = ReproduceConfig(model=job.model, out_dir=folder, **({"domains": job.domains} if parametric else {}),
                          **settings)
    started = time.perf_counter()
    engine = cfg.engine_class.open(cfg.model, folder / "vllm", cfg.vllm_args, log=lambda line: None,
                                   offline=cfg.vllm_offline)
    try:
        result = (reproduce if parametric else reproduce_contextual)(cfg, engine=engine)
    finally:
        close = getattr(engine, "close", None)
        if close is not None:
            close()
    record = {"job": job.name, "key": job.key(), "model": job.model, "direction": job.direction, "node": _node(),
              "seconds": round(time.perf_counter() - started, 1), "heads": selection_to_json(result.selection),
              "stages": {row_title(k): v for k, v in (result.engines or {}).get("stages", {}).items()},
              "cells": job_cells(result.table, job)}
    write_json_atomic(folder / "job.json", record)
    return record


def _node() -> str:
    """Where the job ran: the host, and the Ray node's id inside a Ray task."""
    import socket

    try:
        import ray

        node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    except ImportError:
        node = None
    return socket.gethostname() + (f" (Ray node {node[:12]})" if node else "")


def job_cells(table, job: Job) -> list[dict[str, Any]]:
    """The table's cells for the job's domains (and the average where the table has one), every
    method (by title: a record) and group: one dict per cell with n (distinct items), the mean and
    its 95% interval in percent."""
    rows = []
    for method, columns in table.cells.items():
        for column, groups in columns.items():
            if column not in job.domains and column != "Average":
                continue
            for group, iv in groups.items():
                rows.append({"model": job.model, "direction": job.direction, "domain": column, "method": row_title(method),
                             "group": group, "n": iv.n, "mean": _percent(iv.mean), "low": _percent(iv.low),
                             "high": _percent(iv.high)})
    return rows


def _line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[-1]}" if text else type(err).__name__


def _percent(value: float) -> float | None:
    return None if value != value else round(100.0 * value, 2)


def finished(job: Job, out: str | Path) -> dict[str, Any] | None:
    """The job's `job.json` where it holds the job's key, else None."""
    path = Path(out) / "jobs" / job.name / "job.json"
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if record.get("key") == job.key() else None


@dataclass
class SweepResult:
    """What :func:`run_sweep` returns (and writes to `<out>/sweep.json`)."""

    rows: list[dict[str, Any]]
    ran: list[str]
    resumed: list[str]
    failed: dict[str, str]
    seconds: float


def run_sweep(sweep: Sweep, out: str | Path, *, address: str | None = None,
              log: Callable[[str], None] = print, ray_init: Mapping[str, Any] | None = None) -> SweepResult:
    """Run a sweep's unfinished jobs as Ray tasks and write `<out>/sweep.json` and `<out>/sweep.md`
    (the table: every finished job's cells for the sweep's methods, with n and intervals).

    Args:
        address: a Ray cluster's address (`ray start --head` prints it; "auto" joins the one on
            this machine); None starts a local one for this call.
        ray_init: more arguments for `ray.init` (e.g. `runtime_env`).

    Raises:
        juice.extras.MissingExtraError: no Ray (the cluster extra).
    """
    from juice.extras import require

    require("cluster", "juice sweep")
    import ray

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    jobs = sweep.jobs()
    done = {job.name: finished(job, out) for job in jobs}
    resumed = [name for name, record in done.items() if record is not None]
    for name in resumed:
        log(f"{name}: finished before, read from its job.json")
    todo = [job for job in jobs if done[job.name] is None]
    failed: dict[str, str] = {}
    if todo:
        owned = not ray.is_initialized()
        if owned:
            ray.init(address=address, include_dashboard=False, log_to_driver=False, **dict(ray_init or {}))
        try:
            task = ray.remote(run_job).options(num_cpus=sweep.cpus, num_gpus=sweep.gpus,
                                               max_retries=sweep.max_retries)
            pending = {task.remote(job, str(out.resolve())): job for job in todo}
            for job in todo:
                log(f"{job.name}: submitted")
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                job = pending.pop(ready[0])
                try:
                    done[job.name] = ray.get(ready[0])
                    log(f"{job.name}: finished in {done[job.name]['seconds']:.0f} s")
                except Exception as err:   # a job's error ends that job, not the sweep
                    failed[job.name] = _line(getattr(err, "cause", None) or err)
                    log(f"{job.name}: failed: {failed[job.name]}")
        finally:
            if owned:
                ray.shutdown()
    rows = [row for job in jobs if done[job.name] is not None for row in done[job.name]["cells"]
            if row_key(row["method"]) in sweep.methods]
    titles = [row_title(m) for m in sweep.methods]
    result = SweepResult(rows, [j.name for j in todo if j.name not in failed], resumed, failed,
                         round(time.perf_counter() - started, 1))
    write_json_atomic(out / "sweep.json", {"rows": rows, "ran": result.ran, "resumed": resumed, "failed": failed,
                                           "seconds": result.seconds, "methods": titles,
                                           "jobs": {j.name: done[j.name] and {k: done[j.name][k] for k in
                                                    ("model", "direction", "node", "seconds", "heads",
                                                     "stages")}
                                                    for j in jobs}})
    write_text_atomic(out / "sweep.md", sweep_markdown(rows, titles))
    return result


def sweep_markdown(rows: Sequence[dict[str, Any]], methods: Sequence[str]) -> str:
    """The sweep's table: one line per (model, direction, domain, method), one column per group
    (conflict type, or the contextual table's groups), each exact match in percent with its 95%
    interval, and n (distinct items; per group where they differ)."""
    groups = list(dict.fromkeys(r["group"] for r in rows))
    order = {m: i for i, m in enumerate(methods)}
    lines: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        lines.setdefault((r["model"], r["direction"], r["domain"], r["method"]), {})[r["group"]] = r
    keys = sorted(lines, key=lambda k: (k[0], k[1], k[2] == "Average", k[2], order.get(k[3], len(order))))
    out = ["| model | direction | domain | method | " + " | ".join(groups) + " | n |",
           "|---|---|---|---|" + "---|" * len(groups) + "---|"]
    for key in keys:
        cells = lines[key]
        values = [_cell(cells.get(g)) for g in groups]
        ns = list(dict.fromkeys(c["n"] for c in cells.values()))
        out.append(f"| {' | '.join(key)} | {' | '.join(values)} | {'/'.join(map(str, ns))} |")
    return "\n".join(out) + "\n"


def _cell(row: dict | None) -> str:
    if row is None or row["mean"] is None:
        return "-"
    return f"{row['mean']:.1f} [{row['low']:.1f}, {row['high']:.1f}]"


__all__ = ["DIRECTIONS", "Job", "Sweep", "SweepError", "SweepResult", "baseline_rows", "finished",
           "job_cells", "load_sweep", "run_job", "run_sweep", "steering_rows", "sweep_markdown"]
