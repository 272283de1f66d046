"""The pipeline on vLLM: :class:`VllmEngine`, the :class:`juice.engine.backend.Engine` that answers the
stages with steered requests to vLLM's OpenAI server running juice's plugin.

Why a server (docs/reproducing.md, "On vLLM"): vLLM lives in its own Python environment (its CPU
build pins transformers below juice's floor), and its OpenAI server is where vLLM already does
the batching, the placement and every kind of parallelism, behind one address: tensor
parallelism (`--tensor-parallel-size`), data parallelism with vLLM's own load balancing
(`--data-parallel-size`), Ray across nodes (`--distributed-executor-backend ray`). The engine
starts that server with juice's launcher (:func:`juice.vllm.launch.launch_plan`, the command
`juice serve --engine vllm` runs), passes on the caller's vLLM arguments, and stops it when
closed; juice schedules nothing itself. With `offline=True` (`--vllm-offline`) there is no server:
the same asks go, batch by batch, to vLLM's offline `LLM` in one process of vLLM's Python
(:mod:`juice.vllm.offline`), built from the same engine arguments.

What each stage's question becomes (juice's request protocol, :mod:`juice.steering_request`, sent
flat in `vllm_xargs`; prompts as juice's own token ids, BOS included; decoded text from juice's
tokenizer, so only the model's arithmetic is vLLM's):

- steered generation: one completion per stream, greedy (`temperature` 0), `max_tokens` new
  tokens with vLLM's own end-of-sequence ignored and juice's EOS as the one stop token where the
  caller stops at EOS; the first step's log-probabilities of the probe tokens from vLLM's
  `logprob_token_ids` (raw, before any logits processor); a steering as per-head coefficients
  (JuNE's or JuICE's method with `heads` as coefficients): JuNE and pruning scale the heads' live
  outputs, JuICE adds its coefficients times run 1's outputs. A stop rule on the text
  (`stop_text`: exact match's five words) is applied afterwards to the returned tokens, exactly
  as juice's engine applies it after each step, so the stored text is the same.
- teacher forcing (forced tokens): the prompt and the forced tokens as one prompt, their
  log-probabilities from vLLM's `prompt_logprobs`.
- Stage 1's probabilities and PH3's knock-out logit differences: one single-token request per
  (head, alpha) with that head's coefficient, `logprob_token_ids` holding the target (the logit
  difference of two tokens is the difference of their log-probabilities).

What vLLM cannot run is handed to juice's engine in this process, with one log line per reason
(:meth:`VllmEngine.decodes`): CAD and AdaCAD (each token chosen from two distributions), `auto`
(a question-only second sequence per request), sampling with juice's generator, a repetition
penalty, and the post-norm site.

JuICE adds only to heads whose run-1 outputs the server keeps, the heads of its heads files: the
engine starts its server without heads files (Original, JuNE, pruning, Stage 1), and where a
call asks JuICE to add to other heads it restarts the server once with a heads file naming
them (`<workdir>/vllm-slots-<digest>.json`), so the main job starts vLLM twice (before Stage 1's
heads are known, and after).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from juice.engine.backend import JUICE_ENGINE
from juice.engine.streams import Generation, Stream
from juice.interventions import Head, HeadSelection
from juice.methods import UNSTEERED, coefficients_method
from juice.models import LoadedModel
from juice.progress import OnProgress
from juice.tokens import PromptTooLongError, context_length, token_ids

MAX_MODEL_LEN = 8192
"""The server's context (`--max-model-len`) unless the caller's vLLM arguments set one: the paper's
prompts are short, and the model's full context would make vLLM reserve its KV cache for it."""

COMPILATION_ARGS = ("--enforce-eager", "--compilation-config", "-cc")
"""vLLM arguments that choose how the model runs (compiled or eager). Where the caller gives none,
the engine runs vLLM eagerly on a CPU, whose compiled start costs more than it saves in a main job
(measured on 2 cores with the embedded Gemma: the server up in 48 s eager against 99 s compiled,
134 s with a cold compile cache, twice per main job; compiled decoding 1.09x to 1.24x faster,
docs/vllm.md), and in vLLM's default mode (piecewise CUDA graphs) on a GPU."""

PROMPTS_PER_REQUEST = 32
"""Prompts sent in one HTTP request where they share their steering and settings (vLLM schedules
each as its own request)."""

IN_FLIGHT = 64
"""HTTP requests the engine keeps open at once per vLLM engine core (vLLM batches what they carry):
times the data-parallel size (:func:`data_parallel_size`), so that every core's batch is full."""


ASKS_PER_CALL = 4096
"""Offline (:class:`juice.vllm.offline.OfflineWorker`): asks per `LLM.generate` call."""



def dtype_arguments(dtype: torch.dtype, cuda: bool, extra: Sequence[str]) -> list[str]:
    """The `--dtype` the pipeline's vLLM is started with, as juice's launcher chooses it
    (:func:`juice.vllm.launch.server_command`): none where `extra` names one; on the CPU the
    model's dtype in juice (float32 by default: the heads file's checksum is at it); on a GPU
    vLLM's own (the model's dtype, bfloat16 for most) unless the run asked for another than
    juice's float32 default (a float32 attention backend is not what a GPU serves with; a heads
    file made at float32 still fits, :data:`juice.models.BF16_DIGEST_KEY`).

    >>> dtype_arguments(torch.float32, False, [])
    ['--dtype', 'float32']
    >>> dtype_arguments(torch.float32, True, [])
    []
    >>> dtype_arguments(torch.float16, True, [])
    ['--dtype', 'float16']
    >>> dtype_arguments(torch.float32, True, ["--dtype=float32"])
    []
    """
    if any(a.split("=")[0] == "--dtype" for a in extra) or (cuda and dtype == torch.float32):
        return []
    return ["--dtype", str(dtype).removeprefix("torch.")]

class VllmEngineError(RuntimeError):
    """vLLM could not serve the pipeline: the server refused its configuration at start, stopped,
    or answered a request with an error (one line naming the fix where there is one)."""


@dataclass
class _Server:
    process: subprocess.Popen
    url: str
    slots: frozenset[Head]
    log: Path
    worker: Any = None   # offline: the juice.vllm.offline.OfflineWorker (no url)


@dataclass
class _Ask:
    """One completion to ask for: a prompt's token ids and its settings."""

    ids: list[int]
    xargs: dict[str, Any]
    max_tokens: int
    stop: tuple[int, ...] = ()
    probes: tuple[int, ...] = ()
    prompt_logprobs: bool = False
    result: dict[str, Any] | None = field(default=None, repr=False)


class VllmEngine:
    """The pipeline's stages on vLLM (module docstring). A context manager: the server it started
    is stopped on exit.

    Args:
        model: the model as juice names it (embedded alias, `.gguf`, folder or hub id); vLLM is
            given the folder :func:`juice.vllm.launch.served_folder` makes of it.
        workdir: where its heads files and the server's log go.
        vllm_args: more arguments for vLLM's server, e.g. `--tensor-parallel-size=2`,
            `--data-parallel-size=2`, `--distributed-executor-backend=ray`, `--enforce-eager`.
        log: called with one line per event (server start, a stage handed to juice's engine).
        start_timeout: seconds the server may take to answer `/health`.
        env: more environment variables for the server (e.g. `RAY_ADDRESS`; the server also
            inherits this process's environment).
        offline: no server: vLLM's offline `LLM` with juice's plugin in one process of vLLM's
            Python (:class:`juice.vllm.offline.OfflineWorker`), asked in one `LLM.generate` call
            per batch, with the same engine arguments.

    Attributes:
        starts: seconds each server start took, in order.
    """

    name = "vllm"
    prompts_per_call = PROMPTS_PER_REQUEST   # Stage 1: each (head, alpha) of these prompts in one request
    in_process = False
    every_stream = False   # CAD's two distributions per step, auto's choices, GRD's gate: juice's engine

    @classmethod
    def open(cls, model: str, workdir: str | Path, vllm_args: Sequence[str] = (), *,
             log: Callable[[str], None] = print, offline: bool = False) -> "VllmEngine":
        """A :class:`VllmEngine` (its server starts at the first stage that asks it)."""
        return cls(model, workdir, vllm_args, log=log, offline=offline)

    @classmethod
    def model_device(cls, device: str, stage1_in_process: bool = False) -> str:
        """Where juice's own process puts its copy of the model (its tokenizer, the heads file's
        fingerprint, and the stages vLLM cannot run: PH3's path patching, CAD, AdaCAD, `auto`):
        for device "auto", the CPU, so that vLLM's server has the GPUs to itself (it takes 90% of
        a GPU's memory by default), unless Stage 1 runs on juice's engine (`stage1_in_process`):
        then "auto" (a GPU where there is one), the device that stage is asked onto juice's
        engine for (:meth:`check` refuses it beside vLLM's default share); otherwise `device` as
        given."""
        return "cpu" if device == "auto" and not stage1_in_process else device

    def __init__(self, model: str, workdir: str | Path, vllm_args: Sequence[str] = (), *,
                 log: Callable[[str], None] = print, start_timeout: float = 1800.0,
                 env: Mapping[str, str] | None = None, offline: bool = False) -> None:
        self.model, self.workdir, self.vllm_args = model, Path(workdir), list(vllm_args)
        self.log, self.start_timeout, self.env, self.offline = log, start_timeout, dict(env or {}), offline
        self.server: _Server | None = None
        self.starts: list[float] = []
        self.requests = 0
        self._said: set[str] = set()

    def platform(self) -> dict:
        """What vLLM's Python runs on (:func:`juice.vllm.launch.vllm_platform`): CUDA or not, the
        device, vLLM's and its torch's versions."""
        from juice.vllm.launch import find_vllm_python, vllm_platform

        return vllm_platform(find_vllm_python())

    def provenance(self) -> dict:
        """For results.json's `protocol.engine`: vLLM's version, its torch and device, how juice
        asked it (`transport`: "server", HTTP requests; "offline", `LLM.generate` calls), the calls
        made (`requests`) and the starts of its server or offline worker."""
        platform = self.platform()
        return {"vllm": platform["vllm"], "vllm_torch": platform["torch"], "vllm_device": platform["device"],
                "transport": "offline" if self.offline else "server", "requests": self.requests,
                "server_starts_s": [round(s, 1) for s in self.starts], "vllm_args": list(self.vllm_args)}

    # --- lifecycle -----------------------------------------------------------------------------
    def __enter__(self) -> "VllmEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the server this engine started (its whole process group), if any."""
        if self.server is None:
            return
        server, self.server = self.server, None
        _stop(server.process)

    def check(self, lm: LoadedModel) -> None:
        """Refuse, before any stage, what this engine cannot serve.

        Raises:
            VllmEngineError: the model's architecture has no steered class in juice's plugin;
                juice's copy of the model on a GPU beside vLLM's default 90% share
                (:func:`check_shared_gpu`).
            juice.vllm.launch.VllmNotFoundError: no Python with vLLM.
            juice.extras.MissingExtraError: no `openai` client (the vllm extra).
        """
        from juice.extras import require
        from juice.vllm import steered_architectures
        from juice.vllm.launch import find_vllm_python

        require("vllm", "--engine vllm")

        served, steered = lm.architectures, steered_architectures()
        if not any(a in steered for a in served):
            raise VllmEngineError(f"juice's vLLM plugin steers {', '.join(sorted(steered))}; this model is "
                                  f"{', '.join(served) or 'of an unknown architecture'}: run with --engine juice")
        find_vllm_python()
        check_shared_gpu(lm, self.vllm_args)

    def _ensure(self, lm: LoadedModel, juice_heads: set[Head]) -> _Server:
        """The running server, started (or restarted once, with the union of the heads) where
        none runs or JuICE must add to heads it keeps no run-1 output of."""
        if self.server is not None and juice_heads <= self.server.slots:
            if self.server.process.poll() is None:
                return self.server
            raise VllmEngineError(f"vLLM's {'offline worker' if self.offline else 'server'} stopped (exit "
                                  f"{self.server.process.returncode}); its log: "
                                  f"{self.server.log}")
        slots = frozenset(juice_heads | (self.server.slots if self.server else set()))
        self.close()
        self.check(lm)
        self.server = self._start(lm, slots)
        return self.server

    def _start(self, lm: LoadedModel, slots: frozenset[Head]) -> _Server:
        from juice.stage1.heads_file import HeadsArtifact, save_heads
        from juice.vllm.launch import describe, launch_plan

        self.workdir.mkdir(parents=True, exist_ok=True)
        heads = []
        if slots:
            ordered = tuple(sorted(slots))
            digest = hashlib.sha256(" ".join(map(str, ordered)).encode()).hexdigest()[:12]
            path = self.workdir / f"vllm-slots-{digest}.json"
            save_heads(HeadsArtifact(lm.fingerprint(), "parametric", len(ordered), [], [], HeadSelection(ordered, ()),
                                     data={"purpose": "the heads JuICE adds to: the vLLM engine keeps their run-1 "
                                                      "outputs"}), path)
            heads.append(path)
        extra = list(self.vllm_args)
        cuda = bool(self.platform()["cuda"])   # the device vLLM will use, not this process's torch
        if not cuda and not any(a.split("=")[0] in COMPILATION_ARGS or a.startswith("-O") for a in extra):
            extra.append("--enforce-eager")   # on a CPU the compiled start costs more than it saves
        extra += dtype_arguments(lm.dtype, cuda, extra)
        own_length = any(a.split("=")[0] == "--max-model-len" for a in extra)
        limit = context_length(lm)
        port = _free_port()
        g = lm.geometry
        python, command, env = launch_plan(self.model, heads, port=port, extra=extra,
                                           max_model_len=None if own_length else min(limit or MAX_MODEL_LEN,
                                                                                     MAX_MODEL_LEN),
                                           geometry=f"{g.n_layers}x{g.n_heads}", base={**os.environ, **self.env})
        log_path = self.workdir / "vllm-server.log"
        what = f"JuICE adds to {', '.join(map(str, sorted(slots)))}" if slots else "no heads files"
        if self.offline:
            return self._start_offline(python, command, env, slots, what)
        self.log(f"vLLM: starting its OpenAI server with juice's plugin ({what}); log {log_path}")
        with open(log_path, "ab") as out:
            out.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {describe(command, env)}\n".encode())
            out.flush()
            started = time.perf_counter()
            process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                       cwd=str(self.workdir))
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_healthy(process, url, log_path, self.start_timeout)
        except BaseException:
            _stop(process)
            raise
        self.starts.append(time.perf_counter() - started)
        self.log(f"vLLM: ready in {self.starts[-1]:.0f} s")
        return _Server(process, url, slots, log_path)

    def _start_offline(self, python: str, command: list[str], env: dict[str, str], slots: frozenset[Head],
                       what: str) -> _Server:
        from juice.vllm.offline import OfflineWorker, OfflineWorkerError, engine_arguments

        log_path = self.workdir / "vllm-offline.log"
        self.log(f"vLLM: starting its offline LLM with juice's plugin ({what}); log {log_path}")
        started = time.perf_counter()
        worker = OfflineWorker(python, engine_arguments(command), env, log_path, self.workdir)
        try:
            worker.wait_ready(self.start_timeout)
        except OfflineWorkerError as err:
            _stop(worker.process)
            raise VllmEngineError(f"vLLM's offline LLM stopped at start: {_why(log_path)} (log: {log_path})"
                                  if worker.poll() is not None else f"{err}") from None
        except BaseException:
            _stop(worker.process)
            raise
        self.starts.append(time.perf_counter() - started)
        self.log(f"vLLM: ready in {self.starts[-1]:.0f} s")
        return _Server(worker.process, "", slots, log_path, worker)

    # --- what it decodes ------------------------------------------------------------------------
    def decodes(self, stream: Stream) -> str | None:
        if stream.contrast is not None:
            return "CAD and AdaCAD choose each token from two distributions, which one vLLM request does not give"
        if stream.choice is not None:
            return "auto decides per request from a second, question-only sequence, which a vLLM request cannot carry"
        if stream.sampling is not None:
            return "sampled decoding uses juice's random generator"
        if stream.repetition_penalty != 1.0:
            return "a repetition penalty is applied by juice's token choice"
        if stream.steering.steers and stream.steering.site != "o_proj_input":
            return f"the plugin steers at the output projection's input, not at {stream.steering.site}"
        return None

    def _hand_back(self, reason: str) -> None:
        if reason not in self._said:
            self._said.add(reason)
            self.log(f"vLLM: handed to juice's engine: {reason}")

    # --- generation -------------------------------------------------------------------------------
    def generate(self, lm: LoadedModel, prompts: Sequence[str], streams: Sequence[Stream], max_new_tokens: int = 10,
                 *, probe_tokens: Tensor | None = None, max_rows: int | str = 64,
                 on_progress: OnProgress | None = None, forced_tokens: Tensor | None = None,
                 stop_at_eos: bool = False, stop_text: Callable[[str], bool] | None = None, **options: Any
                 ) -> Generation:
        """:func:`juice.engine.generate`'s contract (module docstring: how each stream becomes a
        request); streams vLLM cannot decode are decoded by juice's engine in the same call.

        Raises:
            ValueError: max_new_tokens < 1; `stop_text` with `forced_tokens`.
            PromptTooLongError: a prompt does not fit the model's context with the new tokens.
            VllmEngineError: the server refused or stopped.
        """
        if max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        if stop_text is not None and forced_tokens is not None:
            raise ValueError("stop_text does not apply to forced_tokens (teacher forcing feeds every token)")
        n = len(streams)
        mine, theirs = [], []
        for i, s in enumerate(streams):
            reason = self.decodes(s)
            (mine if reason is None else theirs).append(i)
            if reason is not None:
                self._hand_back(reason)
        tokens = torch.zeros(n, max_new_tokens, dtype=torch.long)
        texts: list[str] = [""] * n
        first = None if probe_tokens is None else torch.zeros(probe_tokens.shape, dtype=torch.float32)
        forced_lp = None if forced_tokens is None else torch.zeros(n, max_new_tokens, dtype=torch.float64)
        if theirs:
            sub = lambda t: None if t is None else t[theirs]   # noqa: E731
            gen = JUICE_ENGINE.generate(lm, prompts, [streams[i] for i in theirs], max_new_tokens,
                                        probe_tokens=sub(probe_tokens), max_rows=max_rows, on_progress=on_progress,
                                        forced_tokens=sub(forced_tokens), stop_at_eos=stop_at_eos,
                                        stop_text=stop_text, **options)
            _scatter(theirs, gen, tokens, texts, first, forced_lp)
        if mine:
            gen = self._generate(lm, prompts, [streams[i] for i in mine], max_new_tokens,
                                 None if probe_tokens is None else probe_tokens[mine],
                                 None if forced_tokens is None else forced_tokens[mine], stop_at_eos, stop_text,
                                 on_progress)
            _scatter(mine, gen, tokens, texts, first, forced_lp)
        return Generation(tokens, texts, first, forced_lp)

    def _generate(self, lm: LoadedModel, prompts: Sequence[str], streams: Sequence[Stream], max_new_tokens: int,
                  probes: Tensor | None, forced: Tensor | None, stop_at_eos: bool,
                  stop_text: Callable[[str], bool] | None, on_progress: OnProgress | None) -> Generation:
        tokenizer = lm.tokenizer
        ids = {p: token_ids(tokenizer, prompts[p]) for p in {s.prompt for s in streams}}
        limit = context_length(lm)
        longest = max(len(v) for v in ids.values())
        if limit is not None and longest > limit - max_new_tokens:
            raise PromptTooLongError(f"a prompt has {longest} tokens; the model's context holds "
                                     f"{limit - max_new_tokens} with {max_new_tokens} new tokens")
        eos = tokenizer.eos_token_id if stop_at_eos and forced is None else None
        asks = []
        for k, s in enumerate(streams):
            prompt = ids[s.prompt]
            if forced is not None:
                asks.append(_Ask(prompt + forced[k].tolist(), _steering_xargs(s.steering), 1, prompt_logprobs=True))
            else:
                asks.append(_Ask(prompt, _steering_xargs(s.steering), max_new_tokens,
                                 () if eos is None else (int(eos),),
                                 () if probes is None else tuple(int(t) for t in probes[k].tolist())))
        juice_heads = {h for s in streams if s.steering.dual_run for h in _nonzero(s.steering.coefficients)}
        self._run(lm, asks, juice_heads, on_progress)
        n = len(streams)
        fill = eos if eos is not None else tokenizer.pad_token_id
        tokens = torch.full((n, max_new_tokens), -1 if fill is None else fill, dtype=torch.long)
        texts = []
        first = None if probes is None else torch.zeros(probes.shape, dtype=torch.float32)
        forced_lp = None if forced is None else torch.zeros(n, max_new_tokens, dtype=torch.float64)
        for k, ask in enumerate(asks):
            if forced is not None:
                start = len(ids[streams[k].prompt])
                lps = ask.result["prompt_logprobs"][start: start + max_new_tokens]
                forced_lp[k] = torch.tensor([_prompt_logprob_of(step, int(t))
                                             for step, t in zip(lps, forced[k].tolist())], dtype=torch.float64)
                tokens[k] = forced[k]
                texts.append(tokenizer.decode(forced[k].tolist(), skip_special_tokens=True))
                continue
            out = _cut(list(ask.result["token_ids"]), eos, stop_text, tokenizer)
            tokens[k, : len(out)] = torch.tensor(out, dtype=torch.long)
            texts.append(tokenizer.decode(out[: out.index(eos)] if eos in out else out, skip_special_tokens=True))
            if first is not None:
                step = ask.result["top_logprobs"][0]
                first[k] = torch.tensor([math.exp(_logprob_of(step, t)) for t in ask.probes], dtype=torch.float32)
        return Generation(tokens, texts, first, forced_lp)

    # --- Stage 1 and PH3's knock-out ---------------------------------------------------------------
    def _last_position_logprobs(self, lm: LoadedModel, targets: Sequence[tuple[str, Sequence[int]]],
                                interventions: Sequence[tuple[Head, float]]) -> list[tuple[list[float], Tensor]]:
        """Per (prompt, tokens) of `targets`: the tokens' log-probabilities at the prompt's last
        position, clean and under each intervention (`[len(interventions), len(tokens)]`). Every
        prompt's ask under one intervention shares its steering, so :meth:`_run` sends them in one
        request: 1 + len(interventions) requests for up to :data:`PROMPTS_PER_REQUEST` prompts."""
        steerings = [_steering_xargs(None)] + [_per_head_xargs("scale", [(head, alpha)]) for head, alpha in interventions]
        per_prompt = []
        for prompt, tokens in targets:
            ids, probes = token_ids(lm.tokenizer, prompt), tuple(int(t) for t in tokens)
            per_prompt.append([_Ask(ids, xargs, 1, probes=probes) for xargs in steerings])
        self._run(lm, [a for asks in per_prompt for a in asks], set(), None)
        out = []
        for asks in per_prompt:
            values = torch.tensor([[_logprob_of(a.result["top_logprobs"][0], t) for t in a.probes] for a in asks],
                                  dtype=torch.float64)
            out.append((values[0].tolist(), values[1:]))
        return out

    def intervention_probs(self, lm, prompt, target_token, interventions, max_rows=256):
        return self.intervention_probs_many(lm, [(prompt, target_token)], interventions, max_rows)[0]

    def intervention_probs_many(self, lm, targets, interventions, max_rows=256):
        found = self._last_position_logprobs(lm, [(p, [t]) for p, t in targets], interventions)
        return [(math.exp(clean[0]), values[:, 0].exp()) for clean, values in found]

    def intervention_logit_differences(self, lm, prompt, pair, interventions, max_rows=256):
        ((clean, values),) = self._last_position_logprobs(lm, [(prompt, pair)], interventions)
        return clean[0] - clean[1], values[:, 0] - values[:, 1]

    # --- requests -----------------------------------------------------------------------------------
    def _run(self, lm: LoadedModel, asks: list[_Ask], juice_heads: set[Head], on_progress: OnProgress | None) -> None:
        """Send every ask to the server (started as needed), grouped into HTTP requests of asks
        that share their settings, or offline to the worker (:meth:`_run_offline`), and store each
        one's result."""
        server = self._ensure(lm, juice_heads)
        if server.worker is not None:
            self._run_offline(server.worker, asks, on_progress)
            return
        groups: dict[str, list[_Ask]] = {}
        for ask in asks:
            key = json.dumps([ask.xargs, ask.max_tokens, ask.stop, ask.prompt_logprobs], sort_keys=True)
            groups.setdefault(key, []).append(ask)
        batches = []
        for members in groups.values():
            batch: list[_Ask] = []
            probes: set[int] = set()
            for ask in members:
                if batch and (len(batch) == PROMPTS_PER_REQUEST or len(probes | set(ask.probes)) > 128):
                    batches.append(batch)
                    batch, probes = [], set()
                batch.append(ask)
                probes |= set(ask.probes)
            batches.append(batch)
        self.requests += len(batches)
        asyncio.run(_send(server.url, self.model, batches, on_progress,
                          in_flight=IN_FLIGHT * data_parallel_size(self.vllm_args)))

    def _run_offline(self, worker, asks: list[_Ask], on_progress: OnProgress | None) -> None:
        """Every ask in `LLM.generate` calls of up to :data:`ASKS_PER_CALL` (vLLM batches them as
        its scheduler allows; the chunks only pace the progress)."""
        from juice.vllm.offline import OfflineWorkerError

        for start in range(0, len(asks), ASKS_PER_CALL):
            chunk = asks[start: start + ASKS_PER_CALL]
            message = [{"ids": a.ids, "xargs": a.xargs, "max_tokens": a.max_tokens, "stop": list(a.stop),
                        "probes": list(a.probes), "prompt_logprobs": a.prompt_logprobs} for a in chunk]
            try:
                results = worker.ask(message)
            except OfflineWorkerError as err:
                raise VllmEngineError(str(err)) from None
            for ask, result in zip(chunk, results):
                ask.result = result
            self.requests += 1
            if on_progress:
                on_progress(len(chunk))


def _steering_xargs(steering) -> dict[str, Any]:
    """A steering as the request protocol's flat `vllm_xargs` (explicit per-head coefficients)."""
    if steering is None or not steering.steers or not bool(steering.coefficients.ne(0).any()):
        return {"juice_method": UNSTEERED}
    return _per_head_xargs(steering.kind, [(Head(int(layer), int(head)), steering.coefficients[layer, head])
                                           for layer, head in torch.nonzero(steering.coefficients).tolist()])


def _per_head_xargs(kind: str, coefficients: Sequence[tuple[Head, float]]) -> dict[str, Any]:
    """Per-head coefficients of a steering of `kind` as `vllm_xargs`, sent as the method that
    takes them (:func:`juice.methods.coefficients_method`: JuNE's scale, JuICE's add)."""
    return {"juice_method": coefficients_method(kind).name,
            "juice_heads": [f"{head}={float(c)!r}" for head, c in coefficients]}


def _nonzero(coefficients: Tensor) -> set[Head]:
    return {Head(int(layer), int(head)) for layer, head in torch.nonzero(coefficients).tolist()}


def _logprob_of(step: dict[str, float] | None, token: int) -> float:
    """A token's log-probability in one step of vLLM's answer (`{"token_id:<id>": logprob}`)."""
    if not step or f"token_id:{token}" not in step:
        raise VllmEngineError(f"vLLM's answer lacks the log-probability of token {token}")
    return float(step[f"token_id:{token}"])


def _prompt_logprob_of(step: dict[str, Any] | None, token: int) -> float:
    """A prompt token's log-probability in vLLM's `prompt_logprobs` (`{"<id>": {"logprob": ...}}`)."""
    entry = (step or {}).get(str(token))
    if entry is None:
        raise VllmEngineError(f"vLLM's answer lacks the prompt log-probability of token {token}")
    return float(entry["logprob"] if isinstance(entry, dict) else entry)


def _cut(tokens: list[int], eos: int | None, stop_text: Callable[[str], bool] | None, tokenizer) -> list[int]:
    """The tokens juice's engine would have kept: up to and including the first EOS, or up to
    the step after which the text satisfies `stop_text` (checked after every token, as
    :func:`juice.engine.generate` does)."""
    out = []
    for t in tokens:
        out.append(t)
        if eos is not None and t == eos:
            break
        if stop_text is not None and stop_text(tokenizer.decode(out, skip_special_tokens=True)):
            break
    return out


def _scatter(index: list[int], gen: Generation, tokens: Tensor, texts: list[str], first: Tensor | None,
             forced_lp: Tensor | None) -> None:
    tokens[index] = gen.tokens
    for i, text in zip(index, gen.texts):
        texts[i] = text
    if first is not None:
        first[index] = gen.first_probs
    if forced_lp is not None:
        forced_lp[index] = gen.forced_logprobs


def data_parallel_size(vllm_args: Sequence[str]) -> int:
    """vLLM's `--data-parallel-size` (`-dp`) among `vllm_args`, 1 where none is given."""
    args = list(vllm_args)
    for i, arg in enumerate(args):
        name, _, value = arg.partition("=")
        if name in ("--data-parallel-size", "-dp"):
            value = value or (args[i + 1] if i + 1 < len(args) else "1")
            try:
                return max(1, int(value))
            except ValueError:
                return 1
    return 1


async def _send(url: str, model: str, batches: list[list[_Ask]], on_progress: OnProgress | None,
                in_flight: int = IN_FLIGHT) -> None:
    from openai import APIError, AsyncOpenAI

    limit = asyncio.Semaphore(in_flight)
    async with AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=2, timeout=3600.0) as client:

        async def one(batch: list[_Ask]) -> None:
            first = batch[0]
            probes = sorted({t for a in batch for t in a.probes})
            body: dict[str, Any] = {"vllm_xargs": first.xargs, "ignore_eos": True, "return_token_ids": True,
                                    "return_tokens_as_token_ids": True}
            if first.stop:
                body["stop_token_ids"] = list(first.stop)
            if probes:
                body["logprob_token_ids"] = probes
            if first.prompt_logprobs:
                body["prompt_logprobs"] = 0
            async with limit:
                try:
                    response = await client.completions.create(
                        model=model, prompt=[a.ids for a in batch], max_tokens=first.max_tokens, temperature=0.0,
                        logprobs=1 if probes else None, extra_body=body)
                except APIError as err:
                    raise VllmEngineError(f"vLLM answered: {_message(err)}") from None
            for choice in response.choices:
                extra = choice.model_extra or {}
                top = choice.logprobs.top_logprobs if choice.logprobs is not None else None
                batch[choice.index].result = {"token_ids": extra.get("token_ids") or [], "top_logprobs": top or [],
                                              "prompt_logprobs": extra.get("prompt_logprobs") or []}
            if on_progress:
                on_progress(len(batch))

        await asyncio.gather(*(one(b) for b in batches))


def _message(err: Exception) -> str:
    body = getattr(err, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"]).splitlines()[0]
    return str(err).splitlines()[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


REFUSAL_MARKS = ("juice's vLLM plugin", "PluginConfigError", "ValueError:", "Error:")
"""Where to look in a server's log for the one line that says why it stopped at start."""


def _wait_healthy(process: subprocess.Popen, url: str, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise VllmEngineError(f"vLLM's server stopped at start: {_why(log)} (log: {log})")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise VllmEngineError(f"vLLM's server did not answer /health within {timeout:.0f} s (log: {log})")


def _why(log: Path) -> str:
    """The line of the server's log that says why it stopped (juice's refusal first)."""
    lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    start = max((i for i, line in enumerate(lines) if line.startswith("=== ")), default=0)
    lines = lines[start:]
    for mark in REFUSAL_MARKS:
        for line in reversed(lines):
            if mark in line:
                return line.strip()[-500:]
    return lines[-1].strip() if lines else "no output"


def _stop(process: subprocess.Popen) -> None:
    """End a server and every process it started (its own process group)."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        pass


def check_shared_gpu(lm: LoadedModel, vllm_args: Sequence[str]) -> None:
    """Refuse, before any stage, juice's copy of the model on a GPU beside vLLM's when vLLM would
    take its default 90% of the GPU's memory.

    Raises:
        VllmEngineError: juice's copy is on a CUDA device and `vllm_args` set no
            `--gpu-memory-utilization` (one line naming it).
    """
    if lm.device.type == "cuda" and not any(a.split("=")[0] == "--gpu-memory-utilization" for a in vllm_args):
        raise VllmEngineError("juice's copy of the model is on the GPU beside vLLM's, which takes 90% "
                              "of it by default: give vLLM a share, e.g. --vllm-arg=--gpu-memory-utilization=0.5, or "
                              "--device cpu")


__all__ = ["ASKS_PER_CALL", "COMPILATION_ARGS", "IN_FLIGHT", "MAX_MODEL_LEN", "PROMPTS_PER_REQUEST", "VllmEngine",
           "VllmEngineError",
           "check_shared_gpu", "data_parallel_size", "dtype_arguments"]
