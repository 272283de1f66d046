"""Batched, cached decoding (paper Stage 2: JuICE, JuNE; CAD and AdaCAD; sampling; teacher
forcing): the names this module has always offered, now defined in :mod:`juice.engine`, the one
decoding loop (issue 34). New code imports from :mod:`juice.engine`."""

from __future__ import annotations

from juice.engine.batch import KV_CACHES, PAD_SLACK, decode_chunks, generate, greedy_generate, length_buckets
from juice.engine.forward import compiled_forward, forward_last, plan_applier
from juice.engine.streams import Contrast, ContrastRule, Generation, Stream

__all__ = ["Contrast", "ContrastRule", "Generation", "KV_CACHES", "PAD_SLACK", "Stream", "compiled_forward",
           "decode_chunks", "forward_last", "generate", "greedy_generate", "length_buckets", "plan_applier"]
