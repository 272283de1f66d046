"""The public facade: every name in `juice.__all__` resolves, the presets equal the records they
stand for, and the README's three-line example runs (on a tiny model)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import juice
from juice.steering import Steering, steering_coefficients


def test_every_public_name_resolves():
    for name in juice.__all__:
        assert getattr(juice, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        juice.nope  # noqa: B018


def test_no_public_function_is_shadowed_by_a_submodule():
    """A submodule named like a public function would replace it once imported
    (`juice.reproduce` was the Table 1 module): after importing every submodule, each public
    name is still what `_EXPORTS` says."""
    import importlib
    import pkgutil

    for info in pkgutil.walk_packages(juice.__path__, "juice."):
        if info.name.split(".")[1] not in ("analysis", "server", "cli") and info.name not in (
                "juice.vllm.models", "juice.vllm.processor"):   # extras-only modules; these two run inside vLLM
            importlib.import_module(info.name)
    for name, module in juice._EXPORTS.items():
        assert getattr(juice, name) is getattr(importlib.import_module(module), name), name
    assert callable(juice.reproduce) and callable(juice.reproduce_contextual)


def test_import_is_light():
    """`import juice` must not pull torch or transformers (the CLI's start-up time)."""
    code = "import sys, juice; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_presets_are_the_records_they_name(tiny_llama):
    sel = juice.HeadSelection((juice.Head(1, 2),), (juice.Head(0, 1), juice.Head(2, 3)))
    coeff = steering_coefficients(tiny_llama.heads.geometry, sel, 2.0, -1.0)
    j = juice.JuICE(tiny_llama, sel, 2.0, -1.0)
    assert j.kind == "add" and torch.equal(j.coefficients, coeff)
    n = juice.JuNE(tiny_llama.heads.geometry, sel, 2.0, -1.0)
    assert n.kind == "scale" and torch.equal(n.coefficients, coeff)
    p = juice.Prune(tiny_llama, [juice.Head(1, 2), juice.Head(1, 2)])   # a head named twice is zeroed once
    assert p.kind == "scale" and p.coefficients[1, 2] == -1.0 and p.coefficients.abs().sum() == 1.0
    with pytest.raises(IndexError):
        juice.JuICE(tiny_llama, juice.HeadSelection((juice.Head(9, 0),), ()), 1.0, 0.0)


def test_the_readme_example_runs(tiny_llama, tmp_path):
    sel = juice.HeadSelection((juice.Head(1, 2),), (juice.Head(0, 1),))
    path = tmp_path / "heads.json"
    from juice.stage1 import HeadsArtifact

    juice.save_heads(HeadsArtifact(tiny_llama.fingerprint(), "parametric", 1, [1.0], [-1.0], sel), path)
    lm = tiny_llama
    steer = juice.JuICE(lm, juice.load_heads(path, lm).selection, beta_plus=2, beta_minus=-1)
    out = juice.greedy_generate(lm, ["the capital of france is"], 4, steer)
    assert len(out.texts) == 1 and out.tokens.shape == (1, 4)
    assert torch.equal(out.tokens, juice.greedy_generate(lm, ["the capital of france is"], 4,
                                                         Steering("add", steer.coefficients)).tokens)
