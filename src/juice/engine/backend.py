"""What the pipeline asks of an engine, and juice's own engine behind that interface.

The paper's stages (Stage 1's head scores, PH3's knock-out scores, the tuning, the test and the
context-type evaluations; :mod:`juice.pipeline`) ask an engine for three things:

- steered generation: :meth:`Engine.generate`, the signature of :func:`juice.engine.generate`
  (streams under a steering, greedy, with first-step probabilities of probe tokens, a stop rule,
  or forced tokens whose log-probabilities are returned);
- the probability of a target token at a prompt's last position, clean and under single-head
  scalings `H <- H + alpha * H` (:meth:`Engine.intervention_probs`; Stage 1, paper Alg. 2), for
  one prompt or for many at once (:meth:`Engine.intervention_probs_many`, what Stage 1 asks: an
  engine that serves requests batches a (head, alpha) over the prompts);
- the logit difference of two tokens there, clean and under the same scalings
  (:meth:`Engine.intervention_logit_differences`; PH3's knock-out scorer).

:data:`JUICE_ENGINE` answers them with this package's decoding loop and :mod:`juice.readout`'
growing batch, in this process; :class:`juice.vllm.engine.VllmEngine` answers them with steered
requests to vLLM's OpenAI server (juice's plugin), which does the batching, placement and
parallelism. A stage receives an engine and never asks which one it is: it reads what the engine
can do (its capabilities: `in_process`, `every_stream`, :meth:`Engine.model_device`,
:func:`stage_key`), and an engine says which streams it decodes itself (:meth:`Engine.decodes`),
so the results can record it. An engine's name is read once, where it enters
(:func:`juice.engines.engine_class`); an engine is made by its class's :meth:`Engine.open`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from torch import Tensor

from juice.engine.batch import generate
from juice.engine.streams import Generation, Stream
from juice.interventions import Head
from juice.models import LoadedModel
from juice.progress import OnProgress


@runtime_checkable
class Engine(Protocol):
    """An engine the pipeline's stages run on (module docstring).

    Attributes:
        name: "juice" (this process's engine) or "vllm" (vLLM's server with juice's plugin),
            recorded in the results (`protocol.engine`); read by no stage.
        prompts_per_call: how many prompts Stage 1 gives :meth:`intervention_probs_many` at once
            (1 where the engine gains nothing from more: a checkpoint then holds every prompt).
        in_process: it decodes in this process, on juice's loaded copy of the model (loaded when
            the run starts); otherwise juice's copy is deferred (:class:`juice.models.DeferredModel`)
            and loaded only by a stage handed to juice's engine.
        every_stream: it decodes every kind of stream itself (auto's choices, stateful contrasts
            such as GRD's gate), so a command that needs them all (auto's fit, TriState-Bench)
            may run on it.
    """

    name: str
    prompts_per_call: int
    in_process: bool
    every_stream: bool

    @classmethod
    def open(cls, model: str, workdir: str | Path, vllm_args: Sequence[str] = (), *,
             log: Callable[[str], None] = print, offline: bool = False) -> "Engine":
        """The engine a command or run uses (an engine that starts a server is closed by its
        caller: use it as a context manager).

        Raises:
            ValueError: settings this engine does not take (vLLM's arguments on juice's engine).
        """

    @classmethod
    def model_device(cls, device: str, stage1_in_process: bool = False) -> str:
        """Where juice's own copy of the model goes when a run on this engine asks for `device`
        ("auto", "cpu", "cuda:1", ...), `stage1_in_process` saying whether Stage 1 is asked onto
        juice's engine (`--stage1-engine juice`)."""

    def check(self, lm: LoadedModel) -> None:
        """Refuse, before any stage runs, a model or set-up this engine cannot serve (one line
        naming the fix)."""

    def decodes(self, stream: Stream) -> str | None:
        """None where this engine decodes `stream` itself; else the one-line reason it hands the
        stream to juice's own engine (e.g. CAD's two distributions per step on vLLM)."""

    def generate(self, lm: LoadedModel, prompts: Sequence[str], streams: Sequence[Stream], max_new_tokens: int = 10,
                 *, probe_tokens: Tensor | None = None, max_rows: int | str = 64,
                 on_progress: OnProgress | None = None, forced_tokens: Tensor | None = None,
                 stop_at_eos: bool = False, stop_text: Callable[[str], bool] | None = None) -> Generation:
        """:func:`juice.engine.generate`'s contract: one entry per stream, in order (texts,
        `[n_streams, max_new_tokens]` tokens, `[n_streams, k]` first-step probe probabilities,
        `[n_streams, max_new_tokens]` forced log-probabilities in nats). An engine in this process
        (`in_process`) also takes `checkpoint`, where a stage keeps its decoded chunks
        (:func:`juice.engine.generate`'s; :func:`juice.pipeline.stages.chunk_checkpoint`)."""

    def intervention_probs(self, lm: LoadedModel, prompt: str, target_token: int,
                           interventions: Sequence[tuple[Head, float]], max_rows: int | str = 256
                           ) -> tuple[float, Tensor]:
        """The softmax probability of `target_token` at `prompt`'s last position, clean and under
        each intervention (one head scaled alone at every position, `H <- H + alpha * H`).

        Returns:
            (clean probability, `[len(interventions)]` probabilities, float64 or float32)."""

    def intervention_probs_many(self, lm: LoadedModel, targets: Sequence[tuple[str, int]],
                                interventions: Sequence[tuple[Head, float]], max_rows: int | str = 256
                                ) -> list[tuple[float, Tensor]]:
        """:meth:`intervention_probs` for each (prompt, target token) of `targets`, in order: the
        same values, asked together."""

    def intervention_logit_differences(self, lm: LoadedModel, prompt: str, pair: tuple[int, int],
                                       interventions: Sequence[tuple[Head, float]], max_rows: int | str = 256
                                       ) -> tuple[float, Tensor]:
        """`logit(pair[0]) - logit(pair[1])` at the last position, clean and under each
        intervention (PH3's logit difference, :func:`juice.baselines.ph3.logit_difference_effects`).

        Returns:
            (clean difference, `[len(interventions)]` differences, float64)."""


class JuiceEngine:
    """juice's own engine: :func:`juice.engine.generate` and the growing-batch sweeps of
    :mod:`juice.readout`, in this process, on the loaded model's device."""

    name = "juice"
    prompts_per_call = 1
    in_process = True
    every_stream = True

    @classmethod
    def open(cls, model, workdir, vllm_args=(), *, log=print, offline=False) -> "JuiceEngine":
        """:data:`JUICE_ENGINE`.

        Raises:
            ValueError: vLLM's arguments, or offline (one line)."""
        if vllm_args:
            raise ValueError("--vllm-arg is for --engine vllm")
        if offline:
            raise ValueError("--vllm-offline is for --engine vllm")
        return JUICE_ENGINE

    @classmethod
    def model_device(cls, device: str, stage1_in_process: bool = False) -> str:
        """`device` as asked: the model is this engine's."""
        return device

    def check(self, lm: LoadedModel) -> None:
        return None

    def decodes(self, stream: Stream) -> str | None:
        return None

    def generate(self, lm, prompts, streams, max_new_tokens=10, **options) -> Generation:
        return generate(lm, prompts, streams, max_new_tokens, **options)

    def intervention_probs(self, lm, prompt, target_token, interventions, max_rows=256):
        from juice.readout import intervention_probs

        return intervention_probs(lm, prompt, target_token, interventions, max_rows=max_rows)

    def intervention_probs_many(self, lm, targets, interventions, max_rows=256):
        """One prompt at a time: the growing batch is per prompt (:mod:`juice.readout`)."""
        return [self.intervention_probs(lm, prompt, target, interventions, max_rows) for prompt, target in targets]

    def intervention_logit_differences(self, lm, prompt, pair, interventions, max_rows=256):
        import torch

        from juice.readout import intervention_readout

        tokens = torch.tensor(list(pair))
        clean, values = intervention_readout(lm, prompt, interventions,
                                             lambda logits: logits[:, tokens.to(logits.device)], max_rows)
        return float(clean[0] - clean[1]), (values[:, 0] - values[:, 1]).double()

    def __repr__(self) -> str:
        return "JuiceEngine()"


JUICE_ENGINE = JuiceEngine()
"""juice's own engine, the default of every stage."""


def stage_key(engine: Engine | type[Engine]) -> dict[str, str]:
    """What a run's stage keys and its per-prompt checkpoint add for `engine` (an engine or its
    class): nothing for an engine in this process (juice's own keeps the keys it had before there
    were engines), its name otherwise (another engine's floats differ in the last bits, so a run
    resumed on another engine recomputes)."""
    return {} if engine.in_process else {"engine": engine.name}


def engine_or_default(engine: Engine | None) -> Engine:
    """`engine`, or :data:`JUICE_ENGINE` where None."""
    return JUICE_ENGINE if engine is None else engine


__all__ = ["Engine", "JUICE_ENGINE", "JuiceEngine", "engine_or_default", "stage_key"]
