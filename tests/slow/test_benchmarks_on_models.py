"""The GPU check's built-in Gemma 3 config against the embedded GGUF's (the slow tier: it reads the
model file; the other checks of the GPU scripts are tests/integration/test_benchmarks.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_gpu  # noqa: E402


def test_the_built_in_gemma3_config_is_the_embedded_ggufs():
    """The random-weight Gemma 3 270M that travels to the GPU machine as a config computes what the
    embedded model's architecture computes (the GGUF's config, field by field)."""
    from transformers import AutoConfig

    from juice.models import EMBEDDED_MODELS

    gguf = EMBEDDED_MODELS["gemma-3-270m"][1]()
    real = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name).to_dict()
    ours = dict(bench_gpu.CONFIGS["gemma-3-270m"])
    for key, value in ours.items():
        assert real[key] == value, key
