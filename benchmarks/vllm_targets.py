"""The vLLM plugin's speed targets, one set for both vLLM benchmarks (`bench_vllm.py` over HTTP,
`bench_vllm_modes.py` offline) and docs/vllm.md.

Each target is a lower bound on a throughput ratio (generated tokens/s), measured in the same run;
`target(ratio, batch)` gives the bound at a batch size (concurrent requests), or None where the
ratio has none at that size. The dual run over the README heads' layers 3-16 of 18 caps JuICE at
about 0.78x Original when compute-bound (the extra layers' share of the work), so its target sits
just under that cap.
"""

from __future__ import annotations

#: ratio -> {batch size (None: every size): lowest acceptable value}
TARGETS: dict[str, dict[int | None, float]] = {
    "original / stock": {None: 0.97},        # the plugin loaded, no request steered, against stock vLLM
    "june / original": {None: 0.97},         # every request JuNE, against every request Original
    "juice / original": {32: 0.75},          # every request JuICE
    "mixed / original": {8: 0.85, 32: 0.9},  # one request in four JuICE, the rest Original
    "vllm / juice serve": {None: 2.0},       # vLLM with the plugin against `juice serve`, same requests
    # Against stock vLLM compiled, offline (bench_vllm_modes.py; issue 93, run 1 as shadow rows):
    "june / stock": {None: 0.97},            # every request JuNE
    "juice / stock": {1: 0.92, 32: 0.80},    # every request JuICE (each design's cap: docs/vllm.md)
    "mixed / stock": {32: 0.90},             # one request in four JuICE
}


def target(ratio: str, batch: int) -> float | None:
    """The lowest acceptable value of `ratio` (a key of TARGETS) at `batch` concurrent requests,
    or None where that ratio has no target at that size."""
    bounds = TARGETS[ratio]
    return bounds.get(batch, bounds.get(None))


def verdict(ratio: str, batch: int, value: float) -> str:
    """'>= 0.75, met' / '>= 0.75, missed' / '' (no target at this size)."""
    bound = target(ratio, batch)
    return "" if bound is None else f">= {bound}, {'met' if value >= bound else 'missed'}"
