"""`juice serve --engine vllm`: start vLLM's OpenAI-compatible server with juice's plugin.

vLLM runs in its own Python environment (vLLM's CPU build pins transformers below juice's floor;
docs/vllm.md, "Install"), found by :func:`find_vllm_python`. The launcher resolves
the model to a folder vLLM reads (an embedded alias or a `.gguf` file: juice's converted,
self-checked safetensors copy), checks the heads files before anything starts, and runs

    <vllm python> -m vllm.entrypoints.openai.api_server --model FOLDER --served-model-name NAME
        --middleware juice.vllm.middleware.JuiceFieldMiddleware
        --logits-processors juice.vllm.processor:JuiceSteeringProcessor
        --scheduler-cls juice.vllm.scheduler.salting_scheduler
        --dtype float32 (on the CPU) --additional-config '{"juice": ...}' ...

with `JUICE_VLLM_HEADS` (and `JUICE_VLLM_DUAL_RUN`) in its environment, for the API server's
admission, and the same set-up in `additional_config`, for the workers wherever they run
(:mod:`juice.vllm.options`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

from juice.vllm.constraints import BREAKABLE_ENV

REPO_VENV = Path(__file__).resolve().parents[3] / ".venv-vllm" / "bin" / "python"
"""Where `scripts/install-vllm.sh` puts vLLM's environment in a checkout of juice."""


class VllmNotFoundError(FileNotFoundError):
    """No Python environment with vLLM (the message says how to make one)."""


def find_vllm_python(required: bool = True) -> str | None:
    """The Python that runs vLLM: `$JUICE_VLLM_PYTHON`, else this Python if vLLM imports here,
    else the checkout's `.venv-vllm/bin/python`.

    Raises:
        VllmNotFoundError: none of them (only when `required`), or `$JUICE_VLLM_PYTHON` names no file.
    """
    named = os.environ.get("JUICE_VLLM_PYTHON")
    if named:
        if Path(named).is_file():
            return named
        if required:
            raise VllmNotFoundError(f"JUICE_VLLM_PYTHON={named} is not a file")
        return None
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    if REPO_VENV.is_file():
        return str(REPO_VENV)
    if required:
        raise VllmNotFoundError("no vLLM environment: run scripts/install-vllm.sh in juice's checkout, or set "
                                "JUICE_VLLM_PYTHON to a Python with vllm and juice installed (docs/vllm.md, "
                                "\"Install\")")
    return None


def served_folder(spec: str) -> str:
    """What vLLM loads for a juice model spec: an embedded alias or a `.gguf` file becomes juice's
    converted safetensors folder (converted and self-checked here first, once); a directory or a
    hub id is passed on as it is.

    Raises:
        as :func:`juice.models.load_model` for an alias or a GGUF file.
    """
    from juice.models import EMBEDDED_MODELS, cache_dir, load_model

    if spec in EMBEDDED_MODELS:
        key = spec
    elif spec.endswith(".gguf"):
        gguf = Path(spec).expanduser()
        key = f"{gguf.stem}-{gguf.stat().st_size}" if gguf.is_file() else ""
    else:
        return str(Path(spec).expanduser()) if spec.startswith((".", "/", "~")) else spec
    folder = cache_dir() / "models" / key
    if not (folder / "config.json").is_file():
        load_model(spec, device="cpu")
    return str(folder)


def folder_geometry(folder: str) -> str | None:
    """`<n_layers>x<n_heads>` of the model in a local folder (:func:`juice.architectures.config_geometry`
    of its `config.json`), or None for a hub id or a folder without a config transformers reads."""
    from transformers import AutoConfig

    from juice.architectures import config_geometry

    if not (Path(folder) / "config.json").is_file():
        return None
    try:
        geometry = config_geometry(AutoConfig.from_pretrained(folder))
    except (OSError, ValueError, AttributeError):
        return None
    return f"{geometry.n_layers}x{geometry.n_heads}"


PIECEWISE_GRAPHS = ["--compilation-config", '{"cudagraph_mode": "PIECEWISE"}']
"""vLLM's piecewise CUDA graphs: the plugin's steering runs between the pieces; full graphs are
refused (:func:`juice.vllm.constraints.check_engine_config`)."""


def server_command(python: str, folder: str, name: str, *, host: str, port: int, max_model_len: int | None = None,
                   extra: Sequence[str] = (), gpu: bool = False, config: dict | None = None) -> list[str]:
    """The command line of vLLM's OpenAI server with the plugin's requirements (module docstring);
    `--dtype float32` on the CPU (juice's own default) unless `extra` sets one, and on a GPU the
    model's dtype (vLLM's `auto`: a float32 attention backend is not what a GPU serves with; a heads
    file made at float32 still fits, :data:`juice.models.BF16_DIGEST_KEY`); with `gpu`, piecewise
    CUDA graphs (:data:`PIECEWISE_GRAPHS`) unless `extra` sets a compilation configuration or
    `--enforce-eager`; with `config` (:func:`juice.vllm.options.config_entry`),
    `--additional-config` carrying it under `"juice"` (merged into one that `extra` gives), so that
    every worker, on every node, steers with the same heads.

    Raises:
        ValueError: `extra`'s `--additional-config` is not a JSON object.
    """
    from juice.vllm import LOGITS_PROCESSOR, SCHEDULER
    from juice.vllm.options import CONFIG_KEY

    extra = list(extra)
    if config is not None:
        extra = _with_additional_config(extra, CONFIG_KEY, config)
    command = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", folder, "--served-model-name", name,
               "--host", host, "--port", str(port), "--middleware", "juice.vllm.middleware.JuiceFieldMiddleware",
               "--logits-processors", LOGITS_PROCESSOR]
    if not any(a.split("=")[0] == "--scheduler-cls" for a in extra):   # another is refused at start
        command += ["--scheduler-cls", SCHEDULER]
    if max_model_len:
        command += ["--max-model-len", str(max_model_len)]
    if not gpu and not any(a.startswith("--dtype") for a in extra):
        command += ["--dtype", "float32"]   # juice's own default on the CPU; on a GPU, vLLM's: the model's dtype
    own = ("--compilation-config", "-cc", "-O", "--enforce-eager")
    if gpu and not any(a.split("=")[0] in own or a.startswith("-O") for a in extra):
        command += PIECEWISE_GRAPHS
    return command + list(extra)


def _with_additional_config(extra: list[str], key: str, value: dict) -> list[str]:
    """`extra` with `--additional-config` holding `value` at `key`, merged into the one it has."""
    found, out, i = {}, [], 0
    while i < len(extra):
        arg = extra[i]
        if arg == "--additional-config" and i + 1 < len(extra):
            text, i = extra[i + 1], i + 2
        elif arg.startswith("--additional-config="):
            text, i = arg.split("=", 1)[1], i + 1
        else:
            out.append(arg)
            i += 1
            continue
        try:
            found = json.loads(text)
        except ValueError:
            found = None
        if not isinstance(found, dict):
            raise ValueError(f"--additional-config {text!r} is not a JSON object")
    return [*out, "--additional-config", json.dumps({**found, key: value}, sort_keys=True)]


RAY_PREFIXES = "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY"
"""vLLM's variable naming more prefixes of the variables its Ray executor copies to its workers."""


def server_environment(heads: Sequence[str | Path], dual_run: bool = True, base: dict | None = None,
                       geometry: str | None = None, default: str | None = None) -> dict[str, str]:
    """The environment that turns the plugin on with these heads files (:mod:`juice.vllm.options`),
    `JUICE_VLLM_GEOMETRY` set to `geometry` (`<n_layers>x<n_heads>`, :func:`folder_geometry`) unless
    set, and `JUICE_VLLM_DEFAULT` to `default` (`juice serve --default SPEC`) when given.

    On vLLM's CPU build it also sets `VLLM_CPU_KVCACHE_SPACE=2` (GiB) unless set, and, on a machine
    with fewer than :data:`FEW_CPUS` usable cores where neither `VLLM_CPU_OMP_THREADS_BIND` nor
    `VLLM_CPU_NUM_OF_RESERVED_CPU` is set, `VLLM_CPU_NUM_OF_RESERVED_CPU=0`: vLLM's automatic
    binding keeps one core per tensor-parallel rank for its scheduler process, which on 2 cores
    leaves the model one: on 2 cores, Original's throughput at 32 clients rose from 79 to 140
    tokens/s when both ran the model (docs/vllm.md, "Threads on the CPU"). With 8 cores or more the
    reserved core is 1/8 of the machine or less, and vLLM's default stands. The GPU build ignores both.
    `VLLM_USE_V2_MODEL_RUNNER=0` pins vLLM's V1 model runner, the one the plugin is verified on
    (:func:`juice.vllm.constraints.check_engine_config` refuses V2); `VLLM_USE_BREAKABLE_CUDAGRAPH=0`
    unless set, so that `VLLM_BATCH_INVARIANT=1` on a Hopper GPU serves with piecewise graphs
    instead of turning on the breakable graphs the plugin refuses. `JUICE_` is added to
    `VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY`, so that vLLM's Ray executor gives the plugin's
    on-switch to workers on other nodes (it copies only `VLLM_`, `HF_`, `NCCL_`... variables by
    default); the heads themselves travel in vLLM's config (:func:`server_command`'s `config`).
    """
    env = dict(os.environ if base is None else base)
    env["JUICE_VLLM_HEADS"] = os.pathsep.join(str(Path(p).resolve()) for p in heads)
    env["JUICE_VLLM"] = "1"
    env["JUICE_VLLM_DUAL_RUN"] = "1" if dual_run else "0"
    env["VLLM_USE_V2_MODEL_RUNNER"] = "0"   # the runner the plugin is verified on (juice.vllm.constraints)
    env.setdefault(BREAKABLE_ENV, "0")   # else VLLM_BATCH_INVARIANT=1 would turn breakable graphs on (refused)
    prefixes = [p.strip() for p in env.get(RAY_PREFIXES, "").split(",") if p.strip()]
    env[RAY_PREFIXES] = ",".join(prefixes if "JUICE_" in prefixes else [*prefixes, "JUICE_"])
    if geometry:
        env.setdefault("JUICE_VLLM_GEOMETRY", geometry)
    if default is not None:
        env["JUICE_VLLM_DEFAULT"] = default
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")   # GiB of KV cache on the CPU build (vLLM's default: 4)
    if "VLLM_CPU_OMP_THREADS_BIND" not in env and "VLLM_CPU_NUM_OF_RESERVED_CPU" not in env:
        if len(usable_cpus()) < FEW_CPUS:
            env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
    return env


FEW_CPUS = 8
"""Below this many usable cores, :func:`server_environment` keeps every core for the model."""


def usable_cpus() -> set[int]:
    """The CPU ids this process may run on (its affinity mask; every CPU where the OS has none)."""
    try:
        return os.sched_getaffinity(0)
    except AttributeError:   # macOS, Windows
        return set(range(os.cpu_count() or 1))


@lru_cache(maxsize=8)
def vllm_platform(python: str) -> dict[str, str | bool]:
    """What vLLM's own Python runs on, asked of it (juice's process may run on another torch: a CPU
    juice driving a CUDA vLLM): `{"cuda": bool, "device": the GPU's name or "cpu", "vllm": its
    version, "torch": its torch's version}`; `{"cuda": False, ...: "unknown"}` where it cannot say."""
    code = ("import json, torch, importlib.metadata as m\n"
            "c = torch.cuda.is_available()\n"
            "v = next((d.version for d in m.distributions()\n"
            "          if (d.metadata['Name'] or '').lower() in ('vllm', 'vllm-cpu')), 'unknown')\n"
            "print(json.dumps({'cuda': c, 'device': torch.cuda.get_device_name(0) if c else 'cpu', 'vllm': v,\n"
            "                  'torch': torch.__version__}))")
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return {"cuda": False, "device": "unknown", "vllm": "unknown", "torch": "unknown"}


def launch_plan(model: str, heads: Sequence[str | Path], *, host: str = "127.0.0.1", port: int = 8000,
                dual_run: bool = True, extra: Sequence[str] = (), default: str | None = None,
                max_model_len: int | None = None, geometry: str | None = None, base: dict | None = None,
                ) -> tuple[str, list[str], dict[str, str]]:
    """How to start vLLM's OpenAI server with juice's plugin on `model` and `heads`: (the Python
    that runs vLLM, the command, its environment). `juice serve --engine vllm` runs it in place of
    itself; the pipeline's engine (:class:`juice.vllm.engine.VllmEngine`) as a child process.

    The model is the folder vLLM reads (:func:`served_folder`); the geometry comes from its config
    (:func:`folder_geometry`) unless given; without a GPU the CPU build reserves half the memory
    (`--gpu-memory-utilization 0.5`) unless `extra` says otherwise; with a GPU, piecewise CUDA
    graphs (:func:`server_command`); the heads files' content goes into vLLM's config. The
    environment is `base` (default this process's) with the plugin's variables
    (:func:`server_environment`).

    Raises:
        VllmNotFoundError: no Python with vLLM (:func:`find_vllm_python`).
        ValueError: malformed heads files, two for one direction, a default they cannot honour
            (messages naming `JUICE_VLLM_DEFAULT` are the default's), or `extra`'s
            `--additional-config` not a JSON object.
    """
    from juice.vllm.options import config_entry, plugin_heads

    python = find_vllm_python()
    plugin_heads(server_environment(heads, dual_run, default=default))   # bad heads or default: one line, first
    folder = served_folder(model)
    env = server_environment(heads, dual_run, base=base, geometry=geometry or folder_geometry(folder), default=default)
    extra = list(extra)
    gpu = bool(vllm_platform(python)["cuda"])   # the device vLLM will use, not juice's torch
    if not gpu and not any(a.startswith("--gpu-memory-utilization") for a in extra):
        extra = ["--gpu-memory-utilization", "0.5", *extra]   # the CPU build reserves this share of memory
    command = server_command(python, folder, model, host=host, port=port, max_model_len=max_model_len, extra=extra,
                             gpu=gpu, config=config_entry(env))
    return python, command, env


def batch_plan(model: str, heads: Sequence[str | Path], input_file: str | Path, output_file: str | Path, *,
               dual_run: bool = True, extra: Sequence[str] = (), default: str | None = None,
               max_model_len: int | None = None, base: dict | None = None) -> tuple[str, list[str], dict[str, str]]:
    """How to run vLLM's batch runner with juice's plugin (`juice run-batch`, :mod:`juice.vllm.batch`):
    (vLLM's Python, the command, its environment). The engine is the one :func:`launch_plan`
    starts for a server (the same model folder, plugin options, dtype and heads), less what only a
    server takes (:func:`juice.vllm.offline.engine_arguments`), with the model's served name.

    Raises:
        as :func:`launch_plan`.
    """
    from juice.vllm.offline import engine_arguments

    python, command, env = launch_plan(model, heads, dual_run=dual_run, extra=extra, default=default,
                                       max_model_len=max_model_len, base=base)
    return python, [python, "-m", "juice.vllm.batch", "-i", str(input_file), "-o", str(output_file),
                    *engine_arguments(command), "--served-model-name", model], env


def describe(command: Sequence[str], env: dict[str, str]) -> str:
    """The command as a shell line with the plugin's variables, to print or copy."""
    keys = ("JUICE_VLLM_HEADS", "JUICE_VLLM", "JUICE_VLLM_DUAL_RUN", "JUICE_VLLM_GEOMETRY", "JUICE_VLLM_DEFAULT",
            RAY_PREFIXES, "VLLM_USE_V2_MODEL_RUNNER", "VLLM_CPU_NUM_OF_RESERVED_CPU")
    return " ".join([*(f"{k}={shlex.quote(env[k])}" for k in keys if k in env), *map(shlex.quote, command)])


__all__ = ["FEW_CPUS", "RAY_PREFIXES", "REPO_VENV", "VllmNotFoundError", "batch_plan", "describe", "find_vllm_python",
           "folder_geometry", "launch_plan", "server_command", "server_environment", "served_folder", "usable_cpus",
           "vllm_platform"]
