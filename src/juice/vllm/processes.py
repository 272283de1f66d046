"""The vLLM processes juice's plugin may run in: a vLLM release it was verified on, and a frontend
whose requests pass its checks. Checked when the plugin registers in each vLLM process
(:func:`juice.vllm.register`), before any engine is built; imports nothing of vLLM.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


class PluginConfigError(ValueError):
    """vLLM was started in a way the steering cannot run in (the message says how to start it)."""



VERIFIED_VLLM = ("0.32",)
"""The vLLM releases (major.minor) the plugin was built and tested against: it relies on their
internals (the attention metadata, the persistent batch the logits processor sees, the
scheduler's `add_request`), so another release is refused at start (:func:`check_process`)."""

ENV_UNVERIFIED = "JUICE_VLLM_ALLOW_UNVERIFIED"
"""Set to 1 to start the plugin on a vLLM release outside :data:`VERIFIED_VLLM` (with a warning)."""


def version_refusal(version: str, environ: Any = None) -> tuple[str | None, str | None]:
    """(refusal, warning) for the plugin on vLLM `version`: a refusal for a release outside
    :data:`VERIFIED_VLLM` unless :data:`ENV_UNVERIFIED` is 1, then a warning instead; (None, None)
    on a verified release.

    >>> version_refusal("0.32.0")
    (None, None)
    >>> refusal, warning = version_refusal("0.33.1", {})
    >>> refusal.startswith("juice's vLLM plugin was verified on vLLM 0.32, not 0.33.1"), warning
    (True, None)
    """
    env = os.environ if environ is None else environ
    release = ".".join(str(version).split("+")[0].split(".")[:2])
    if release in VERIFIED_VLLM:
        return None, None
    message = (f"juice's vLLM plugin was verified on vLLM {', '.join(VERIFIED_VLLM)}, not {version} (it relies on "
               "their attention metadata, persistent batch and scheduler; docs/vllm.md, \"vLLM versions\")")
    if env.get(ENV_UNVERIFIED, "").strip() == "1":
        return None, f"{message}; starting anyway ({ENV_UNVERIFIED}=1): check its tokens against juice's own engine"
    return f"{message}: install vllm==0.32.0 (scripts/install-vllm.sh), or set {ENV_UNVERIFIED}=1 to try", None


def frontend_refusal(argv: list[str], environ: Any = None) -> str | None:
    """Why the plugin cannot steer in the vLLM process started as `argv`, or None.

    The plugin's checks on a request body (the `juice` field moved into `vllm_xargs`, beam search
    and unsteered routes refused: :mod:`juice.vllm.middleware`) run in vLLM's HTTP app only. vLLM
    0.32 has three ways in that build no such app, so a body's `juice` field would be dropped
    and the request served with the default steering, without a word:

    - `vllm run-batch` (and `python -m vllm.entrypoints.openai.run_batch`): `juice run-batch`
      runs it with the same checks per line (:mod:`juice.vllm.batch`);
    - `vllm serve --grpc` (also set in a `--config` YAML, and vLLM's gRPC server module): no
      middleware;
    - `vllm serve` with the Rust frontend (`VLLM_USE_RUST_FRONTEND=1`; only `vllm serve`
      reads it, not vLLM's OpenAI server module that `juice serve --engine vllm` runs, nor
      `--headless`): no middleware.

    Args:
        argv: the process's `sys.argv` (vLLM's spawned processes inherit it).
        environ: its environment (default `os.environ`).
    """
    env = os.environ if environ is None else environ
    program = Path(argv[0]).name if argv else ""
    parent = Path(argv[0]).parent.name if argv else ""
    if (len(argv) > 1 and argv[1] == "run-batch") or (program == "run_batch.py" and parent in ("openai",
                                                                                             "launchers")):
        return ("juice's vLLM plugin does not steer vllm run-batch (it builds no HTTP app, so a line's juice field "
                "would be dropped unchecked): run juice run-batch, which checks every line and runs vLLM's batch "
                "runner with the plugin")
    if any(a == "--grpc" or a.startswith("--grpc=") for a in argv[1:]) or program == "grpc_server.py" or _config_says(
            argv, "grpc"):
        return ("juice's vLLM plugin does not steer vLLM's gRPC server (vllm serve --grpc runs no middleware, so "
                "requests' juice fields would go unchecked): serve over HTTP (juice serve --engine vllm)")
    serve = len(argv) > 1 and argv[1] == "serve" and "--headless" not in argv
    if serve and env.get("VLLM_USE_RUST_FRONTEND", "0").strip() not in ("", "0"):
        return ("juice's vLLM plugin does not steer behind vLLM's Rust frontend (VLLM_USE_RUST_FRONTEND=1 runs no "
                "middleware, so requests' juice fields would go unchecked): start vLLM with VLLM_USE_RUST_FRONTEND=0")
    return None


def _config_says(argv: list[str], key: str) -> bool:
    """Whether a `--config FILE` (vLLM's YAML of command-line options) in `argv` sets `key` true
    (vLLM expands it into options after the plugin could read `sys.argv`); False where it has
    none or cannot be read."""
    path = None
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            path = argv[i + 1]
        elif arg.startswith("--config="):
            path = arg.split("=", 1)[1]
    if not path:
        return False
    try:
        import yaml

        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except Exception:   # unreadable or not YAML: vLLM refuses the file itself
        return False
    return isinstance(data, dict) and data.get(key) in (True, "true", "True", 1)


def check_process(argv: list[str], version: str, environ: Any = None) -> str | None:
    """Refuse, at the plugin's registration in a vLLM process (:func:`juice.vllm.register`), a
    vLLM release it was not verified on (:func:`version_refusal`) and a frontend that skips its
    request checks (:func:`frontend_refusal`); return the version warning, if any.

    Raises:
        PluginConfigError: one line saying what to run instead.
    """
    refusal, warning = version_refusal(version, environ)
    refusal = refusal or frontend_refusal(argv, environ)
    if refusal is not None:
        raise PluginConfigError(refusal)
    return warning


__all__ = ["ENV_UNVERIFIED", "VERIFIED_VLLM", "PluginConfigError", "check_process", "frontend_refusal",
           "version_refusal"]
