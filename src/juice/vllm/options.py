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
import math
import os
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from juice.architectures import HeadGeometry
from juice.interventions import Head, HeadSelection, check_heads
from juice.stage1.heads_file import check_selection_fits, heads_from_json, read_heads_json
from juice.steering import Steering
from juice.steering_request import (MAX_ABS_BETA, ServedHeads, SteeringAsk, SteeringRequestError, parse_spec,
                                    read_steering, request_fields)

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
    resolve(request_fields(extra or None), server)   # kept: vLLM's admission of the request reads it (one parse)
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


WIRE_KEY = "juice_steering"
"""The `SamplingParams.extra_args` key of a request's steering as admission resolved it
(:func:`admit`, :func:`wire_steering`): vLLM's engine core salts the request from it
(:mod:`juice.vllm.scheduler`) and the worker applies it (:func:`applied`), neither reading the
request's fields again. Admission writes it on every request, over any value a caller put there
(the steering always follows the request's juice fields), and over HTTP the middleware answers it
400 as an unknown juice field. A request that reaches the engine without it (vLLM's deprecated
ways of handing the engine a ready `EngineCoreRequest`) is resolved from its fields there, as
before admission wrote it (:func:`admitted_steering`)."""

RESOLVED_KEPT = 256
"""Resolutions :func:`resolve` keeps per process (the latest), each at most
:data:`RESOLVED_MAX_HEADS` per-head coefficients."""
RESOLVED_MAX_HEADS = 512
_resolved: OrderedDict[tuple[int, str], tuple[PluginHeads, dict[str, Any]]] = OrderedDict()
_resolved_lock = threading.Lock()


def steering_name(ask: SteeringAsk) -> str:
    """A resolved steering in words, for log lines: the method, and for JuNE and JuICE their
    direction and betas (`juice contextual (2, -1)`)."""
    if ask.spec.tuned != "betas":   # Original, pruning, auto: no direction and betas
        return ask.method
    return f"{ask.method} {ask.direction} ({ask.beta_plus:g}, {ask.beta_minus:g})"


def wire_steering(ask: SteeringAsk, server: PluginHeads) -> dict[str, Any]:
    """A checked request's steering in the form vLLM's processes pass on (:data:`WIRE_KEY`):

    `{"method", "name", "kind", "heads", "salt", "warning"}`: the registry name,
    :func:`steering_name`, the steering kind ("none", "scale": JuNE and pruning, "add": JuICE;
    :data:`juice.steering.KINDS`), its nonzero per-head coefficients as `(layer, head,
    coefficient)` triples (the :class:`juice.steering.Steering`'s, float32 values as exact floats),
    the KV cache salt (:func:`steering_salt`; None for Original) and the request's warning (untuned
    betas) or None. Built on the served geometry where admission knows it, else on one that just
    covers the heads files' heads and the request's own (the worker checks them against its
    model: :func:`applied`).

    Raises:
        SteeringRequestError: what :meth:`juice.steering_request.SteeringAsk.steering` refuses.
    """
    wire: dict[str, Any] = {"method": ask.method, "name": steering_name(ask), "kind": "none", "heads": (),
                            "salt": None, "warning": ask.warning}
    if not ask.steers:
        return wire
    steering = ask.steering(server.geometry or _covering(ask, server), server)
    if not steering.steers:
        return wire
    table = steering.coefficients
    heads = tuple((layer, head, float(table[layer, head])) for layer, head in table.nonzero().tolist())
    return {**wire, "kind": steering.kind, "heads": heads, "salt": steering_salt(ask, server)}


def _covering(ask: SteeringAsk, server: PluginHeads) -> HeadGeometry:
    """The smallest geometry holding the heads files' heads and the request's own (admission
    without the served geometry)."""
    heads = [*(h for s in server.selections.values() for h in (*s.positive, *s.negative)),
             *ask.heads, *(h for h, _ in ask.per_head)]
    return HeadGeometry(max((h.layer for h in heads), default=0) + 1, max((h.head for h in heads), default=0) + 1, 0)


def resolve(fields: Mapping[str, Any] | None, server: PluginHeads) -> dict[str, Any]:
    """One request's juice fields checked against the server (:func:`request_ask`) and resolved
    to :func:`wire_steering`'s form, once per process: a resolution is kept
    (:data:`RESOLVED_KEPT`) by the fields' JSON and the server object, so the middleware's check
    and vLLM's admission of the same request parse it once (:func:`remember`).

    Raises:
        SteeringRequestError: see :func:`request_ask` and :func:`wire_steering`.
    """
    key = fields_key(fields)
    if key is not None:
        with _resolved_lock:
            hit = _resolved.get((id(server), key))
            if hit is not None and hit[0] is server:
                _resolved.move_to_end((id(server), key))
                return dict(hit[1])
    wire = wire_steering(request_ask(fields, server), server)
    remember(fields, server, wire)
    return dict(wire)


def remember(fields: Mapping[str, Any] | None, server: PluginHeads, wire: Mapping[str, Any]) -> None:
    """Keep `wire` as what :func:`resolve` gives for `fields` on `server` (the middleware resolves
    a body's fields in the form it wrote, which admission then reads). Fields without a JSON form,
    and steerings of more than :data:`RESOLVED_MAX_HEADS` heads, are not kept."""
    key = fields_key(fields)
    if key is None or len(wire["heads"]) > RESOLVED_MAX_HEADS:
        return
    with _resolved_lock:
        _resolved[(id(server), key)] = (server, dict(wire))
        while len(_resolved) > RESOLVED_KEPT:
            _resolved.popitem(last=False)


def fields_key(fields: Mapping[str, Any] | None) -> str | None:
    """The fields' JSON (keys sorted), which tells 1, 1.0 and true apart, or None where they have
    none (keys that are not strings): the key :func:`resolve` keeps a resolution under."""
    try:
        return json.dumps(fields, sort_keys=True, default=repr)
    except (TypeError, ValueError):
        return None


def request_fields_of(extra_args: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The juice fields of a request's `extra_args` (:func:`juice.steering_request.request_fields`),
    admission's :data:`WIRE_KEY` aside."""
    if extra_args and WIRE_KEY in extra_args:
        extra_args = {k: v for k, v in extra_args.items() if k != WIRE_KEY}
    return request_fields(extra_args)


def admit(extra_args: Mapping[str, Any] | None, server: PluginHeads) -> dict[str, Any]:
    """A request's `extra_args` as vLLM's admission passes them on: its own, with
    :data:`WIRE_KEY` set to its resolved steering (:func:`resolve`; over any the caller set).
    Called once per request, in the process that admits it
    (:meth:`juice.vllm.processor.JuiceSteeringProcessor.validate_params`).

    Raises:
        SteeringRequestError: the fields are wrong (the one-line message vLLM answers 400 with).
    """
    return {**(extra_args or {}), WIRE_KEY: resolve(request_fields_of(extra_args), server)}


def admitted(extra_args: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The steering admission resolved for a request (:data:`WIRE_KEY` of its `extra_args`), or
    None where no admission by juice's processor wrote one."""
    wire = (extra_args or {}).get(WIRE_KEY)
    return wire if isinstance(wire, Mapping) else None


def admitted_steering(extra_args: Mapping[str, Any] | None, server: PluginHeads) -> Mapping[str, Any]:
    """The steering a request runs with in the engine core and the worker: admission's
    (:func:`admitted`), else, for a request handed to the engine without admission, its fields
    resolved here on `server` (:func:`resolve`).

    Raises:
        SteeringRequestError: no admitted steering and fields that do not resolve.
    """
    wire = admitted(extra_args)
    return resolve(request_fields_of(extra_args), server) if wire is None else wire


class SteeringWireError(ValueError):
    """An admitted steering the worker cannot apply: admission and the worker disagree about
    the served model or heads, or the steering is not admission's form (never expected;
    :mod:`juice.vllm.processor` stops the engine rather than decode the request unsteered)."""


def applied(wire: Mapping[str, Any], geometry: HeadGeometry, server: PluginHeads) -> RequestSteering | None:
    """The tables the forward applies for a resolved steering (:func:`wire_steering`'s form) on a
    model of `geometry`; None for Original (nothing to apply). Reads no request field.

    Raises:
        SteeringWireError: an unknown kind, a coefficient that is not a finite number, a head
            outside `geometry`, or a JuICE head without a dual-run slot on `server`
            (:meth:`PluginHeads.addable`).
    """
    kind = wire.get("kind")
    if kind == "none":
        return None
    if kind not in ("scale", "add"):
        raise SteeringWireError(f"a steering of kind {kind!r}")
    try:
        entries = [(Head(int(layer), int(head)), float(c)) for layer, head, c in wire["heads"]]
        check_heads([h for h, _ in entries], geometry)
    except IndexError as err:
        raise SteeringWireError(str(err)) from None
    except (TypeError, ValueError, KeyError):
        raise SteeringWireError("per-head coefficients that are not (layer, head, number) triples") from None
    table = torch.zeros(geometry.n_layers, geometry.n_heads)
    for head, coefficient in entries:
        if not math.isfinite(coefficient) or abs(coefficient) > MAX_ABS_COEFFICIENT:
            raise SteeringWireError(f"head {head}'s coefficient {coefficient!r} is not finite within "
                                    f"+-{MAX_ABS_COEFFICIENT:g}")
        if kind == "add" and not server.addable(head):
            raise SteeringWireError(f"JuICE adds to head {head}, which this worker's heads files do not keep for "
                                    "the dual run")
        table[head.layer, head.head] = coefficient
    scale, add = Steering(kind, table).scale_add(torch.zeros_like(table))
    return RequestSteering(str(wire.get("method")), scale, add, wire.get("warning"))


MAX_ABS_COEFFICIENT = (1 + MAX_ABS_BETA) ** 2
"""The largest |coefficient| a checked request gives a head (JuNE's (1 + beta+)(1 + beta-) - 1 at a
head in both sets, with |beta| <= :data:`juice.steering_request.MAX_ABS_BETA`)."""


def parse_request(fields: Mapping[str, Any] | None, server: PluginHeads, geometry: HeadGeometry | None = None
                  ) -> RequestSteering | None:
    """One request's juice fields as the plugin applies them: checked and resolved as admission
    resolves them (:func:`request_ask`, :func:`wire_steering`; not kept) and, with `geometry`,
    built into the worker's tables (:func:`applied`; without it pruned heads are checked against
    `server.geometry` and the tables are empty). Returns None for Original (nothing to apply).

    Raises:
        SteeringRequestError: see :func:`request_ask`; a head outside `geometry` (the one line).
    """
    if geometry is not None:
        server = replace(server, geometry=geometry)
    wire = wire_steering(request_ask(fields, server), server)
    if wire["kind"] == "none":
        return None
    if geometry is None:
        return RequestSteering(wire["method"], torch.zeros(0), torch.zeros(0), wire["warning"])
    try:
        return applied(wire, geometry, server)
    except SteeringWireError as err:
        raise SteeringRequestError(str(err)) from None


__all__ = ["CONFIG_KEY", "MAX_ABS_COEFFICIENT", "RESOLVED_KEPT", "RESOLVED_MAX_HEADS", "SALT_PREFIX", "WIRE_KEY",
           "SteeringWireError", "admit", "admitted", "admitted_steering", "applied", "fields_key",
           "remember", "request_fields_of", "resolve", "steering_name", "wire_steering", "config_entry",
           "heads_document", "plugin_enabled", "served_heads", "offline_request", "request_cache_salt",
           "steering_salt", "ENV_DEFAULT", "ENV_DUAL", "ENV_GEOMETRY", "ENV_HEADS", "ENV_ON",
           "RequestSteering", "PluginHeads", "head_slots", "parse_geometry", "parse_request",
           "read_heads_file", "request_ask", "plugin_heads"]
