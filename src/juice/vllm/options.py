"""What a vLLM server with juice's plugin steers, and what one request asks for (no vLLM import).

The server's side comes from the environment, read the same way in every vLLM process (the API
server validating a request, each worker building the model), so a multi-node deployment needs
the same variables on every node:

- `JUICE_VLLM_HEADS`: heads files (`juice identify` / `tune` / `reproduce`), separated by
  `os.pathsep`, at most one per direction. Setting it turns the plugin on.
- `JUICE_VLLM=1`: turns the plugin on without heads files (only `original` and `prune`).
- `JUICE_VLLM_DUAL_RUN=0`: no dual run (JuICE refused at admission; no second KV cache).
- `JUICE_VLLM_GEOMETRY=<n_layers>x<n_heads>` (e.g. `18x4`): the served model's heads, so that
  admission can refuse a pruned head outside the model; needed only without heads files (a heads
  file's fingerprint carries it). `juice serve --engine vllm` sets it; the model checks it at start.

A request's side: `SamplingParams.extra_args`, either `{"juice": {"method": ..., "direction": ...,
"beta_plus": ..., "beta_minus": ..., "heads": [...]}}` (offline) or the same keys flat with a
`juice_` prefix (`juice_method`, ...), the form vLLM's OpenAI server passes on from `vllm_xargs`
(which allows no nested objects). The fields mean what `juice serve`'s `juice` field means
(:mod:`juice.apps.server`), plus `method: "prune"` (PH3's pruning, Jin et al. 2024: the listed
`heads` scaled by 0).

A request becomes two `[n_layers, n_heads]` tables, applied at each head's slice of the output
projection's input as `H * (1 + scale) + add * H_clean` (:class:`juice.interventions.RowPlan`'s
rule): JuNE puts its coefficients in `scale` (paper Alg. 4), pruning puts -1 there, JuICE puts
its coefficients in `add` (paper Alg. 1, H_clean = run 1's output of the same head).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from juice.architectures import HeadGeometry
from juice.data.records import Direction
from juice.interventions import Head, HeadSelection, check_heads
from juice.steering import steering_coefficients

METHODS = ("original", "june", "juice", "prune")
MAX_ABS_BETA = 100.0
"""Largest |beta| a request may ask for; the same bound as `juice serve` (:mod:`juice.apps.server`)."""
FIELDS = ("method", "direction", "beta_plus", "beta_minus", "heads")
ENV_HEADS, ENV_ON, ENV_DUAL = "JUICE_VLLM_HEADS", "JUICE_VLLM", "JUICE_VLLM_DUAL_RUN"
ENV_GEOMETRY = "JUICE_VLLM_GEOMETRY"


class SteeringRequestError(ValueError):
    """A request's steering fields are wrong (vLLM answers HTTP 400 with this message)."""


@dataclass(frozen=True)
class ServerHeads:
    """The server's steering set-up (module docstring).

    Attributes:
        enabled: the plugin is on (`JUICE_VLLM_HEADS` or `JUICE_VLLM=1`).
        selections: direction -> its heads file's selection.
        tuned: direction -> the file's `tuned` settings (method -> {"beta_plus", "beta_minus"}).
        fingerprints: direction -> the file's model fingerprint (checked against the served model).
        dual_run: JuICE's clean run is computed (a second KV cache on the dual-run layers).
        geometry: the served model's layers and heads as the API server knows them before any
            model is built (`JUICE_VLLM_GEOMETRY`, else the heads files' fingerprints; head_dim 0
            where unknown), or None; the model refuses to start where it differs.
        geometry_from: where `geometry` came from (the variable, or a heads file's path).
    """

    enabled: bool = False
    selections: Mapping[str, HeadSelection] = field(default_factory=dict)
    tuned: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    fingerprints: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)
    dual_run: bool = True
    geometry: HeadGeometry | None = None
    geometry_from: str = ""

    def dual_run_layers(self) -> tuple[int, int] | None:
        """(first, last) layer that JuICE may steer (over every heads file), or None."""
        layers = [h.layer for s in self.selections.values() for h in (*s.positive, *s.negative)]
        if not self.dual_run or not layers:
            return None
        return min(layers), max(layers)


def read_heads_file(path: str) -> tuple[str, HeadSelection, dict, dict]:
    """(direction, selection, tuned, model fingerprint) of a heads file, read without a model.

    Raises:
        ValueError: not a juice heads file (one line naming the file).
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise ValueError(f"{path}: cannot read the heads file ({err.strerror})") from None
    except (ValueError, RecursionError):
        raise ValueError(f"{path} is not a juice heads file: not JSON") from None
    if not isinstance(data, dict) or data.get("format") != "juice-heads/1" or not isinstance(data.get("model"), dict):
        raise ValueError(f"{path} is not a juice heads file (no 'format': 'juice-heads/1' with its model)")
    try:
        direction = str(Direction.parse(data.get("direction", "")))
        selection = HeadSelection(tuple(Head.parse(h) for h in data["positive_heads"]),
                                  tuple(Head.parse(h) for h in data["negative_heads"]))
    except (KeyError, TypeError, AttributeError, ValueError) as err:
        raise ValueError(f"{path}: not a juice heads file ({err})") from None
    tuned = data.get("tuned", {})
    return direction, selection, tuned if isinstance(tuned, dict) else {}, data["model"]


def server_heads(environ: Mapping[str, str] | None = None) -> ServerHeads:
    """The set-up named by the environment (module docstring); cached per environment.

    Raises:
        ValueError: a heads file that does not read, or two for one direction.
    """
    env = os.environ if environ is None else environ
    return _server_heads(env.get(ENV_HEADS, ""), env.get(ENV_ON, ""), env.get(ENV_DUAL, "1"),
                         env.get(ENV_GEOMETRY, ""))


def parse_geometry(text: str) -> HeadGeometry:
    """`JUICE_VLLM_GEOMETRY`'s value, `<n_layers>x<n_heads>` (e.g. `18x4`), as a geometry (head_dim 0).

    Raises:
        ValueError: not two positive integers joined by `x`.
    """
    parts = text.strip().lower().split("x")
    if len(parts) != 2 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"{ENV_GEOMETRY}={text!r} is not <n_layers>x<n_heads> (e.g. 18x4)")
    return HeadGeometry(int(parts[0]), int(parts[1]), 0)


@lru_cache(maxsize=8)
def _server_heads(heads: str, on: str, dual: str, geometry_text: str = "") -> ServerHeads:
    paths = [p for p in heads.split(os.pathsep) if p.strip()]
    selections, tuned, fingerprints, files = {}, {}, {}, {}
    for path in paths:
        direction, selection, tuned_settings, fingerprint = read_heads_file(path)
        if direction in selections:
            raise ValueError(f"two heads files for the {direction} direction: {files[direction]} and {path}")
        selections[direction], tuned[direction], fingerprints[direction], files[direction] = (
            selection, tuned_settings, fingerprint, path)
    geometry, source = (parse_geometry(geometry_text), ENV_GEOMETRY) if geometry_text.strip() else (None, "")
    for direction, fingerprint in fingerprints.items():   # every file's is checked against the model at its start
        layers, heads_ = fingerprint.get("n_layers"), fingerprint.get("n_heads")
        if geometry is None and isinstance(layers, int) and isinstance(heads_, int):
            geometry = HeadGeometry(layers, heads_, int(fingerprint.get("head_dim") or 0))
            source = files[direction]
    return ServerHeads(bool(paths) or on.strip() not in ("", "0"), selections, tuned, fingerprints, files,
                       dual.strip() not in ("0", "false", "no", "off"), geometry, source)


def request_fields(extra_args: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The juice fields of a request's `extra_args`: the nested `juice` object, or the flat
    `juice_*` keys; None when there are none.

    Raises:
        SteeringRequestError: `juice` is not an object, or an unknown `juice_*` / `juice` key.
    """
    if not extra_args:
        return None
    fields: dict[str, Any] = {}
    if "juice" in extra_args:
        nested = extra_args["juice"]
        if not isinstance(nested, Mapping):
            raise SteeringRequestError("juice must be an object with method, direction, beta_plus, beta_minus, heads")
        fields.update(nested)
    if "juice_invalid" in extra_args:   # the middleware's mark for a `juice` body field that is not an object
        raise SteeringRequestError("juice must be an object with method, direction, beta_plus, beta_minus, heads")
    for key, value in extra_args.items():
        if key.startswith("juice_"):
            fields[key[len("juice_"):]] = value
    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        raise SteeringRequestError(f"unknown juice field {unknown[0]!r}; the fields are {', '.join(FIELDS)}")
    return fields if ("juice" in extra_args or fields) else None


@dataclass(frozen=True)
class RequestSteering:
    """One request's steering as the forward applies it (module docstring).

    Attributes:
        method: one of :data:`METHODS`.
        scale: `[n_layers, n_heads]`, live outputs become `H * (1 + scale)` (JuNE, pruning).
        add: `[n_layers, n_heads]`, `add * H_clean` is added (JuICE); nonzero only where the dual
            run computes H_clean.
    """

    method: str
    scale: torch.Tensor
    add: torch.Tensor


def _beta(fields: Mapping[str, Any], key: str, default: float) -> float:
    value = fields.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise SteeringRequestError(f"juice.{key} must be a number")
    try:
        beta = float(value)
    except ValueError:
        raise SteeringRequestError(f"juice.{key} must be a number, not {value!r}") from None
    if not math.isfinite(beta) or abs(beta) > MAX_ABS_BETA:
        raise SteeringRequestError(f"juice.{key} must be finite with |beta| <= {MAX_ABS_BETA:g}, not {value!r}")
    return beta


def parse_request(fields: Mapping[str, Any] | None, server: ServerHeads, geometry: HeadGeometry | None = None
                  ) -> RequestSteering | None:
    """Check one request's juice fields against the server; with `geometry`, build its tables
    (without it, as at admission, pruned heads are checked against `server.geometry`).

    Defaults as `juice serve`: `method` "juice" when the server has heads files, else
    "original"; `direction` the only heads file's; betas the file's tuned values for the
    method, else 2 and 0. Returns None for Original (nothing to apply).

    Raises:
        SteeringRequestError: the plugin is off; an unknown method; a beta that is not a finite
            number with |beta| <= 100; a direction with no heads file (or none given where the
            server has two); JuICE on a server without the dual run; `prune` without `heads`,
            or a head name that does not parse or lies outside the model.
    """
    if fields is None:
        return None
    if not server.enabled:
        raise SteeringRequestError("this vLLM server runs without juice steering (start it with JUICE_VLLM_HEADS "
                                   "set to heads files, or JUICE_VLLM=1; see juice's README)")
    method = fields.get("method", "juice" if server.selections else "original")
    if method not in METHODS:
        raise SteeringRequestError(f"juice.method must be one of {', '.join(METHODS)}, not {method!r}")
    if "heads" in fields and method != "prune":
        raise SteeringRequestError("juice.heads is for method prune (juice and june use the heads file's heads)")
    if method == "original":
        return None
    if method == "prune":
        names = fields.get("heads")
        if isinstance(names, str):
            names = [n for n in names.replace(",", " ").split() if n]
        if not isinstance(names, (list, tuple)) or not names:
            raise SteeringRequestError("juice.method prune needs juice.heads, a list of head names like 'L11H2'")
        try:
            heads = [Head.parse(str(n)) for n in names]
        except ValueError as err:
            raise SteeringRequestError(f"juice.heads: {err}") from None
        known = geometry or server.geometry
        if known is not None:
            try:
                check_heads(heads, known)
            except IndexError as err:
                raise SteeringRequestError(f"juice.heads: {err}") from None
        if geometry is None:
            return RequestSteering(method, torch.zeros(0), torch.zeros(0))
        scale = torch.zeros(geometry.n_layers, geometry.n_heads)
        for h in heads:
            scale[h.layer, h.head] = -1.0
        return RequestSteering(method, scale, torch.zeros_like(scale))
    direction = fields.get("direction")
    if direction is None:
        if len(server.selections) != 1:
            raise SteeringRequestError(f"say juice.direction: this server has heads for "
                                       f"{sorted(server.selections) or 'no direction'}")
        direction = next(iter(server.selections))
    try:
        direction = str(Direction.parse(str(direction)))
    except ValueError as err:
        raise SteeringRequestError(f"juice.direction: {err}") from None
    if direction not in server.selections:
        raise SteeringRequestError(f"no heads for direction {direction!r}; this server has "
                                   f"{sorted(server.selections) or 'none'} (JUICE_VLLM_HEADS)")
    if method == "juice" and not server.dual_run:
        raise SteeringRequestError("juice.method juice needs the dual run; this server was started without it "
                                   "(JUICE_VLLM_DUAL_RUN=0); use june")
    defaults = server.tuned[direction].get(method, {})
    defaults = defaults if isinstance(defaults, Mapping) else {}
    beta_plus = _beta(fields, "beta_plus", defaults.get("beta_plus", 2.0))
    beta_minus = _beta(fields, "beta_minus", defaults.get("beta_minus", 0.0))
    if geometry is None:
        return RequestSteering(method, torch.zeros(0), torch.zeros(0))
    try:
        coefficients = steering_coefficients(geometry, server.selections[direction], beta_plus, beta_minus, method)
    except IndexError as err:
        raise SteeringRequestError(f"{server.files[direction]}: {err}") from None
    zeros = torch.zeros_like(coefficients)
    return RequestSteering(method, coefficients, zeros) if method == "june" else RequestSteering(method, zeros,
                                                                                              coefficients)


__all__ = ["ENV_DUAL", "ENV_GEOMETRY", "ENV_HEADS", "ENV_ON", "FIELDS", "MAX_ABS_BETA", "METHODS", "RequestSteering",
           "ServerHeads", "SteeringRequestError", "parse_geometry", "parse_request", "read_heads_file",
           "request_fields", "server_heads"]
