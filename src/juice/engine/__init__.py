"""juice's decoding engine: one decoding loop for every caller.

- :mod:`juice.engine.streams`: what is decoded (:class:`Stream`, :class:`Contrast`, :class:`Choice`,
  :class:`Generation`) and the one function that lays streams out as batch rows and a
  :class:`~juice.interventions.RowPlan` (:func:`~juice.engine.streams.row_layout`);
- :mod:`juice.engine.forward`: the cached forward, its compiled form, the plan's site, and the
  KV cache edits of rows joining and leaving;
- :mod:`juice.engine.session`: :class:`DecodingSession`, the loop: prefill (shared clean rows,
  the growing prefill), the per-step forward, token choice, EOS and stop rules, rows joining and
  leaving, contrastive rows, forced tokens, the static cache;
- :mod:`juice.engine.batch`: :func:`generate`, the batch driver (chunks, the runtime guard);
- :mod:`juice.engine.sampling`: how a step chooses its token; :mod:`juice.engine.guard`: the
  runtime check that batched decoding equals one at a time; :mod:`juice.engine.likelihood`:
  teacher forcing (a continuation's log-probabilities under a steering);
- :mod:`juice.engine.backend`: what the pipeline's stages ask of an engine (juice's or vLLM's).

Its drivers: :func:`generate` (evaluation, tuning, the baselines, :class:`juice.Steerer`'s
`generate` and `stream`) and `juice serve`'s worker (:mod:`juice.apps.server.worker`), which
keeps one session open.
"""

from __future__ import annotations

from juice.engine.batch import KV_CACHES, PAD_SLACK, decode_chunks, generate, greedy_generate, length_buckets
from juice.engine.forward import compiled_forward, forward_last, plan_applier
from juice.engine.session import DecodingSession, StepToken
from juice.engine.streams import (INSTRUCTED, QUESTION_ALONE, Choice, ChoiceRule, Contrast, ContrastRule, Generation,
                                  Instructed, QuestionAlone, StatefulContrastRule, Stream, row_layout)

__all__ = ["INSTRUCTED", "Instructed", "QUESTION_ALONE", "Choice", "ChoiceRule", "QuestionAlone", "Contrast", "ContrastRule", "DecodingSession", "Generation", "KV_CACHES", "PAD_SLACK", "StatefulContrastRule",
           "StepToken", "Stream",
           "compiled_forward", "decode_chunks", "forward_last", "generate", "greedy_generate", "length_buckets",
           "plan_applier", "row_layout"]
