"""What a vLLM server with juice's plugin steers, and what one request asks for (no vLLM import).

The server's side comes from the environment of the process that admits requests (vLLM's API
server or offline `LLM`), and reaches the workers in vLLM's config: `juice serve --engine vllm`
puts the heads files' content and the variables below in `additional_config["juice"]`
(:func:`config_entry`), which vLLM sends to every worker, Ray-distributed and multi-node ones
included, and each worker builds its steered model from it (:func:`served_heads`; without the
entry, from its own environment). The variables:

- `JUICE_VLLM_HEADS`: heads files (`juice identify` / `tune` / `reproduce`), separated by
  `os.pathsep`, at most one per direction. Setting it turns the plugin on.
- `JUICE_VLLM=1`: turns the plugin on without heads files (only `original` and `prune`).
- `JUICE_VLLM_DUAL_RUN=0`: no dual run (JuICE refused at admission; no second KV cache).
- `JUICE_VLLM_DEFAULT=SPEC`: the steering of a request without juice fields, e.g.
  `method:juice,beta_plus:2` (:func:`juice.steering_request.parse_spec`).
- `JUICE_VLLM_GEOMETRY=<n_layers>x<n_heads>` (e.g. `18x4`): the served model's heads, so that
  admission can refuse a pruned head outside the model; needed only without heads files (a heads
  file's fingerprint carries it). `juice serve --engine vllm` sets it; the model checks it at start.

A request's side: `SamplingParams.extra_args`, either `{"juice": {"method": ..., "direction": ...,
"beta_plus": ..., "beta_minus": ..., "heads": [...]}}` (offline) or the same keys flat with a
`juice_` prefix (`juice_method`, ...), the form vLLM's OpenAI server passes on from `vllm_xargs`
(which allows no nested objects). The fields, their defaults and their errors are juice's one
request protocol (:mod:`juice.steering_request`), the same as `juice serve`'s; a request without
them gets `JUICE_VLLM_DEFAULT` (a `juice serve --default` SPEC), else the only heads file's tuned
steering, else Original.

A request becomes two `[n_layers, n_heads]` tables, applied at each head's slice of the output
projection's input as `H * (1 + scale) + add * H_clean` (:class:`juice.interventions.RowPlan`'s
rule): JuNE puts its coefficients in `scale` (paper Alg. 4), pruning puts -1 there, JuICE puts
its coefficients in `add` (paper Alg. 1, H_clean = run 1's output of the same head).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from juice.architectures import HeadGeometry
from juice.interventions import Head, HeadSelection
from juice.stage1.heads_file import check_selection_fits, heads_from_json, read_heads_json
from juice.steering_request import (ServedHeads, SteeringAsk, SteeringRequestError, parse_spec, read_steering,
                                    request_fields)

ENV_HEADS, ENV_ON, ENV_DUAL = "JUICE_VLLM_HEADS", "JUICE_VLLM", "JUICE_VLLM_DUAL_RUN"
ENV_GEOMETRY, ENV_DEFAULT = "JUICE_VLLM_GEOMETRY", "JUICE_VLLM_DEFAULT"


@dataclass(frozen=True)
class PluginHeads(ServedHeads):
    """The server's steering set-up (module docstring): what :class:`ServedHeads` holds
    (selections, tuned betas, default, dual run, geometry, files), and

    Attributes:
        enabled: the plugin is on (`JUICE_VLLM_HEADS` or `JUICE_VLLM=1`).
        fingerprints: direction -> the file's model fingerprint (checked against the served model).
        geometry_from: where `geometry` came from (the variable, or a heads file's path); the
            geometry is the served model's layers and heads as the API server knows them before
            any model is built (`JUICE_VLLM_GEOMETRY`, else the heads files' fingerprints;
            head_dim 0 where unknown), or None; the model refuses to start where it differs.
        auto: False: the plugin does not run `auto` (it would need a question-only second
            sequence per request, which vLLM schedules as an unrelated request).
    """

    auto: bool = False
    enabled: bool = False
    fingerprints: Mapping[str, Mapping[str, Any]] | None = None
    geometry_from: str = ""

    def addable(self, head: Head) -> bool:
        """JuICE adds only to the heads files' heads: run 1 keeps only their outputs (each has a
        slot of the steered model's `juice_clean` table, :func:`head_slots`)."""
        return self.dual_run and any(head in (*s.positive, *s.negative) for s in self.selections.values())

    def dual_run_layers(self) -> tuple[int, int] | None:
        """(first, last) layer that JuICE may steer (over every heads file), or None."""
        layers = [h.layer for s in self.selections.values() for h in (*s.positive, *s.negative)]
        if not self.dual_run or not layers:
            return None
        return min(layers), max(layers)


def head_slots(server: PluginHeads, local: slice) -> list[tuple[int, int]]:
    """The heads JuICE can add to on one tensor-parallel rank: every heads file's heads whose
    index falls in `local` (this rank's slice of the heads), as (layer, head index within the
    slice), sorted, each once. The steered model keeps run 1's output of each at a slot of its
    persistent `juice_clean` table (:mod:`juice.vllm.models`)."""
    heads = {(h.layer, h.head) for s in server.selections.values() for h in (*s.positive, *s.negative)}
    return sorted((layer, head - local.start) for layer, head in heads if local.start <= head < local.stop)


def read_heads_file(path: str) -> tuple[str, HeadSelection, dict, dict]:
    """(direction, selection, tuned, model fingerprint) of a heads file, read without a model.

    Raises:
        ValueError: not a juice heads file (one line naming the file).
    """
    return heads_document(read_heads_json(path), path)


def heads_document(data: Any, path: str) -> tuple[str, HeadSelection, dict, dict]:
    """:func:`read_heads_file` of a heads file's parsed JSON (`path` names it in errors), read by
    juice's one reader of the format (:func:`juice.stage1.heads_file.heads_from_json`).

    Raises:
        ValueError: not a juice heads file (one line naming the file).
    """
    artifact = heads_from_json(data, path)
    return str(artifact.direction), artifact.selection, artifact.tuned, artifact.model


def plugin_heads(environ: Mapping[str, str] | None = None) -> PluginHeads:
    """The set-up named by the environment (module docstring); cached per environment.

    Raises:
        ValueError: a heads file that does not read, or two for one direction.
    """
    env = os.environ if environ is None else environ
    return _plugin_heads(env.get(ENV_HEADS, ""), env.get(ENV_ON, ""), env.get(ENV_DUAL, "1"),
                         env.get(ENV_GEOMETRY, ""), env.get(ENV_DEFAULT, ""))


def plugin_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment turns the plugin on (`JUICE_VLLM_HEADS` or `JUICE_VLLM=1`), without
    reading any heads file (on another node the files may not exist; the model reads them from
    vLLM's config, :func:`served_heads`)."""
    env = os.environ if environ is None else environ
    return bool(_heads_paths(env.get(ENV_HEADS, ""))) or env.get(ENV_ON, "").strip() not in ("", "0")


def _heads_paths(heads: str) -> list[str]:
    """`JUICE_VLLM_HEADS`'s paths (separated by `os.pathsep`, blanks skipped)."""
    return [p for p in heads.split(os.pathsep) if p.strip()]


CONFIG_KEY = "juice"
"""The key of the server's set-up in vLLM's `additional_config` (:func:`config_entry`)."""


def config_entry(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The set-up the environment names, as a JSON object for vLLM's `additional_config`
    (`{"juice": <this>}`): the heads files' content (not their paths), the dual run, the geometry
    and the default steering. vLLM sends its config to every worker, Ray-distributed and
    multi-node ones included, and hashes `additional_config` into its compile cache key, so every
    worker builds the same steered model from it (:func:`served_heads`) whether or not the files or
    the `JUICE_VLLM_*` variables exist there. Of each file it keeps what the workers read (format,
    model fingerprint, direction, k and alphas, heads, tuned settings), not Stage 1's scores.

    Raises:
        ValueError: what :func:`plugin_heads` refuses.
    """
    env = os.environ if environ is None else environ
    documents = [(path, read_heads_json(path)) for path in _heads_paths(env.get(ENV_HEADS, ""))]
    _build_plugin_heads(documents, env.get(ENV_ON, ""), env.get(ENV_DUAL, "1"), env.get(ENV_GEOMETRY, ""),
                        env.get(ENV_DEFAULT, ""))   # refuse a bad set-up here, in one line, before vLLM starts
    kept = ("format", "model", "direction", "k", "alphas_positive", "alphas_negative", "positive_heads",
            "negative_heads", "tuned")   # what the one reader needs (juice.stage1.heads_file.heads_from_json)
    heads = {path: {k: v for k, v in data.items() if k in kept} for path, data in documents}
    return {"heads": heads, "on": plugin_enabled(env),
            "dual_run": env.get(ENV_DUAL, "1"), "geometry": env.get(ENV_GEOMETRY, ""),
            "default": env.get(ENV_DEFAULT, "")}


def served_heads(vllm_config: Any, environ: Mapping[str, str] | None = None) -> PluginHeads:
    """The set-up a worker steers with: `vllm_config.additional_config["juice"]` where the launcher
    put it (:func:`config_entry`), else the environment (:func:`plugin_heads`).

    Raises:
        ValueError: a malformed entry; or an entry whose heads, betas, default or dual run differ
            from the heads files the environment names here (admission reads the environment: the
            two would disagree).
    """
    extra = getattr(vllm_config, "additional_config", None)
    entry = extra.get(CONFIG_KEY) if isinstance(extra, Mapping) else None
    if entry is None:
        return plugin_heads(environ)
    if not isinstance(entry, Mapping) or not isinstance(entry.get("heads"), Mapping):
        raise ValueError(f"additional_config[{CONFIG_KEY!r}] is not juice's set-up (juice.vllm.options.config_entry)")
    server = _build_plugin_heads([(str(k), v) for k, v in entry["heads"].items()], "1" if entry.get("on") else "",
                                 str(entry.get("dual_run", "1")), str(entry.get("geometry") or ""),
                                 str(entry.get("default") or ""))
    env = os.environ if environ is None else environ
    paths = _heads_paths(env.get(ENV_HEADS, ""))
    if paths and all(Path(p).is_file() for p in paths):
        here = plugin_heads(env)
        if (here.selections, here.tuned, here.default, here.dual_run) != (server.selections, server.tuned,
                                                                          server.default, server.dual_run):
            raise ValueError(f"additional_config[{CONFIG_KEY!r}] and {ENV_HEADS} name different heads, betas, "
                             "default or dual run; start vLLM with both from the same files (juice serve --engine "
                             "vllm does)")
    return server


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
def _plugin_heads(heads: str, on: str, dual: str, geometry_text: str = "", default: str = "") -> PluginHeads:
    return _build_plugin_heads([(path, read_heads_json(path)) for path in _heads_paths(heads)], on, dual, geometry_text,
                               default)


def _build_plugin_heads(documents: list[tuple[str, Any]], on: str, dual: str, geometry_text: str,
                        default: str) -> PluginHeads:
    """The set-up of heads files given as (path, parsed JSON) and the variables' values."""
    paths = [path for path, _ in documents]
    selections, tuned, fingerprints, files = {}, {}, {}, {}
    for path, data in documents:
        direction, selection, tuned_settings, fingerprint = heads_document(data, path)
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
    if geometry is not None:   # every file's heads in the model, before anything starts
        for direction, selection in selections.items():
            check_selection_fits(selection, geometry, files[direction],
                                 "the served model" if source == ENV_GEOMETRY else "its model fingerprint's shape")
    server = PluginHeads(selections=selections, tuned=tuned,
                         default=parse_spec(default, ENV_DEFAULT) if default.strip() else None,
                         dual_run=dual.strip() not in ("0", "false", "no", "off"), geometry=geometry, files=files,
                         enabled=bool(paths) or on.strip() not in ("", "0"), fingerprints=fingerprints,
                         geometry_from=source)
    if server.default is not None:   # refused at start, not per request
        try:
            read_steering(server.default, server)
        except SteeringRequestError as err:
            raise ValueError(f"{ENV_DEFAULT}: {err}") from None
    return server


SALT_PREFIX = "juice-"
"""The prefix of every salt :func:`steering_salt` and :func:`request_cache_salt` make."""


def steering_salt(ask: SteeringAsk, server: PluginHeads) -> str | None:
    """The KV cache salt of a steering: None for Original (its KV is the unmodified model's, shared
    with every unsteered request), else `juice-` and 32 hex digits of a hash of the resolved
    steering (method, direction, betas, pruned heads) and the heads files' fingerprints. vLLM's
    prefix cache keys a block by its tokens and its request's `cache_salt`, so a cached block is
    reused only by requests whose steering computed the same KV (and, for JuICE, the same clean
    KV of the dual run)."""
    if not ask.steers:
        return None
    key = {"method": ask.method, "direction": ask.direction, "beta_plus": float(ask.beta_plus),
           "beta_minus": float(ask.beta_minus), "heads": sorted(str(h) for h in ask.heads),
           "per_head": [[str(h), float(c)] for h, c in ask.per_head],
           "files": {d: f.get("weights_sha256_16") for d, f in sorted((server.fingerprints or {}).items())},
           "selections": {d: [[str(h) for h in s.positive], [str(h) for h in s.negative]]
                          for d, s in sorted(server.selections.items())}}
    return SALT_PREFIX + hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]


def request_cache_salt(salt: str, user_salt: str | None) -> str:
    """The `cache_salt` a steered request is cached under (set in the engine core,
    :mod:`juice.vllm.scheduler`): its steering's salt, combined with the client's own salt where
    it sent one (both must match for a block to be reused)."""
    if not user_salt:
        return salt
    return SALT_PREFIX + hashlib.sha256(f"{user_salt}|{salt}".encode()).hexdigest()[:32]


def offline_request(prompt: str | list[int] | Mapping[str, Any], juice: Mapping[str, Any] | None = None, *,
                    cache_salt: str | None = None, server: PluginHeads | None = None
                    ) -> tuple[dict[str, Any], dict[str, Any]]:
    """A request for vLLM's offline `LLM.generate` with juice's steering, its fields checked here:
    (the prompt dict, with the caller's `cache_salt` where given; the `extra_args` for its
    `SamplingParams`). The steering's KV cache salt is set in the engine core
    (:mod:`juice.vllm.scheduler`), so a request built by hand is served the same way.

    Args:
        prompt: text, token ids, or a prompt dict (`{"prompt": ...}` / `{"prompt_token_ids": ...}`);
            a dict's `juice` key, which vLLM's `LLM.generate` would drop, is taken as `juice`.
        juice: the request's juice fields (None: the prompt dict's `juice`, else the server's
            default steering).
        cache_salt: the caller's own salt (the engine combines it with the steering's).
        server: the plugin's set-up (default: from the environment, as vLLM's processes read it).

    Raises:
        SteeringRequestError: the fields are wrong (the one-line message vLLM would answer with),
            or both the prompt dict's `juice` key and `juice` give them.
    """
    server = plugin_heads() if server is None else server
    if isinstance(prompt, Mapping):
        out = dict(prompt)
        if "juice" in out:   # vLLM's LLM.generate would drop this key (prompts are TypedDicts)
            carried = out.pop("juice")
            if juice is not None and carried is not None:
                raise SteeringRequestError("the prompt's 'juice' key and juice= both give juice fields; give one")
            juice = carried if juice is None else juice
    elif isinstance(prompt, str):
        out = {"prompt": prompt}
    else:
        out = {"prompt_token_ids": list(prompt)}
    extra: dict[str, Any] = {} if juice is None else {"juice": dict(juice) if isinstance(juice, Mapping) else juice}
    request_ask(request_fields(extra or None), server)
    if cache_salt is not None:
        out["cache_salt"] = cache_salt
    return out, extra


@dataclass(frozen=True)
class RequestSteering:
    """One request's steering as the forward applies it (module docstring).

    Attributes:
        method: one of :data:`juice.steering_request.METHODS` but "original".
        scale: `[n_layers, n_heads]`, live outputs become `H * (1 + scale)` (JuNE, pruning).
        add: `[n_layers, n_heads]`, `add * H_clean` is added (JuICE); nonzero only where the dual
            run computes H_clean.
        warning: the request's steering warning (untuned betas), or None.
    """

    method: str
    scale: torch.Tensor
    add: torch.Tensor
    warning: str | None = None


def request_ask(fields: Mapping[str, Any] | None, server: PluginHeads) -> SteeringAsk:
    """One request's juice fields checked against the server (:func:`juice.steering_request.read_steering`);
    None: the request sent none (it gets the server's default).

    Raises:
        SteeringRequestError: the plugin is off and the request asks for steering, or what
            :func:`~juice.steering_request.read_steering` refuses.
    """
    if not server.enabled:
        if fields is None:
            return SteeringAsk("original")
        raise SteeringRequestError("this vLLM server runs without juice steering (start it with JUICE_VLLM_HEADS "
                                   "set to heads files, or JUICE_VLLM=1; see juice's README)")
    return read_steering(fields, server)


def parse_request(fields: Mapping[str, Any] | None, server: PluginHeads, geometry: HeadGeometry | None = None
                  ) -> RequestSteering | None:
    """Check one request's juice fields against the server (:func:`request_ask`); with `geometry`,
    build its tables (without it, as at admission, pruned heads are checked against
    `server.geometry`). Returns None for Original (nothing to apply).

    Raises:
        SteeringRequestError: see :func:`request_ask`; a heads file's head outside `geometry`.
    """
    if geometry is not None:
        server = replace(server, geometry=geometry)
    ask = request_ask(fields, server)
    if not ask.steers:
        return None
    if geometry is None:
        return RequestSteering(ask.method, torch.zeros(0), torch.zeros(0), ask.warning)
    scale, add = ask.steering(geometry, server).scale_add(torch.zeros(geometry.n_layers, geometry.n_heads))
    return RequestSteering(ask.method, scale, add, ask.warning)


__all__ = ["CONFIG_KEY", "SALT_PREFIX", "config_entry", "heads_document", "plugin_enabled", "served_heads",
           "offline_request", "request_cache_salt", "steering_salt", "ENV_DEFAULT", "ENV_DUAL", "ENV_GEOMETRY",
           "ENV_HEADS", "ENV_ON", "RequestSteering", "PluginHeads", "head_slots", "parse_geometry", "parse_request",
           "read_heads_file", "request_ask", "plugin_heads"]
