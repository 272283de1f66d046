"""`juice analyze` knockout, superposition and interventions: the knock-outs against naive
references (weights zeroed, layers removed, one forward each), the superposition ranking against a
hand loop, run once against run twice, and each command's --quick files on a tiny model."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import juice.analysis.knockout as ko
from juice.analysis.common import AnalysisOptions, write_outputs
from juice.analysis.knockout import Component, all_components, count_interval, knockout_readout
from juice.analysis.multiple import cumulative_probs, run_multiple
from juice.reference import cumulative_probs_naive, knockout_readout_naive
from juice.analysis.superposition import rank_heads, run_superposition
from juice.data.paraconflict import build_domain
from juice.interventions import Head, head_coefficients, scaled_heads
from juice.tokens import answer_first_token, encode

PROMPT = "the capital of france is paris . the capital of germany is"
TOKENS = [5, 9, 17]


def _readout(logits):
    return logits.softmax(-1)[:, TOKENS]


@torch.inference_mode()
def _probs(lm, prompt=PROMPT):
    """The readout of one plain forward, on the CPU (where `knockout_readout` returns its own)."""
    ids = encode(lm.tokenizer, [prompt]).input_ids.to(lm.device)
    return lm.model(input_ids=ids).logits[0, -1].float().softmax(-1)[TOKENS].cpu()


def _tiny(tiny_models, arch):
    """The session's tiny model of `arch` (shared with the `tiny` fixture's cache)."""
    from conftest import build_tiny

    if arch not in tiny_models:
        tiny_models[arch] = build_tiny(arch)
    return tiny_models[arch]


def _copy(lm):
    from juice.models import wrap_model

    return wrap_model(copy.deepcopy(lm.model), lm.tokenizer, name=lm.name)


# ---------------------------------------------------------------- Fig. 3 knock-outs


@pytest.mark.parametrize("arch", ["llama", "gemma3_text", "gpt2", "phi"])
def test_attention_knockout_equals_zeroing_its_output_projection(arch, tiny_models):
    lm = _tiny(tiny_models, arch)
    comps = [Component("attention", layer) for layer in range(lm.heads.geometry.n_layers)]
    _, batched = knockout_readout(lm, PROMPT, comps, _readout)
    for layer in range(lm.heads.geometry.n_layers):
        ref = _copy(lm)
        proj = ref.heads.projections[layer]
        with torch.no_grad():
            proj.weight.zero_()
            if getattr(proj, "bias", None) is not None:
                proj.bias.zero_()
        torch.testing.assert_close(batched[layer], _probs(ref), atol=1e-6, rtol=1e-5)


def test_attention_knockout_equals_knocking_out_every_head_of_the_layer(tiny_llama):
    g = tiny_llama.heads.geometry
    _, batched = knockout_readout(tiny_llama, PROMPT, [Component("attention", 1)], _readout)
    with scaled_heads(tiny_llama.heads, head_coefficients(g, {Head(1, h): -1.0 for h in range(g.n_heads)})):
        expected = _probs(tiny_llama)
    torch.testing.assert_close(batched[0], expected, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "gemma3_text"])
def test_mlp_knockout_equals_zeroing_its_down_projection(arch, tiny_models):
    lm = _tiny(tiny_models, arch)
    _, batched = knockout_readout(lm, PROMPT, [Component("mlp", l) for l in range(3)], _readout)
    for layer in range(3):
        ref = _copy(lm)
        with torch.no_grad():
            ref.heads.layers[layer].mlp.down_proj.weight.zero_()
        torch.testing.assert_close(batched[layer], _probs(ref), atol=1e-6, rtol=1e-5)


def test_layer_knockout_equals_removing_the_layer(tiny_llama):
    _, batched = knockout_readout(tiny_llama, PROMPT, [Component("layer", l) for l in range(3)], _readout)
    for layer in range(3):
        ref = _copy(tiny_llama)
        ref.model.model.layers = torch.nn.ModuleList(m for i, m in enumerate(ref.model.model.layers) if i != layer)
        torch.testing.assert_close(batched[layer], _probs(ref), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "gemma2", "gemma3_text", "gpt2", "gpt_neox", "phi", "qwen2"])
def test_batched_knockouts_equal_one_forward_each(arch, tiny_models):
    lm = _tiny(tiny_models, arch)
    comps = all_components(lm.heads.geometry.n_layers)
    clean, batched = knockout_readout(lm, PROMPT, comps, _readout, max_rows=4)   # 3 chunks
    clean_ref, naive = knockout_readout_naive(lm, PROMPT, comps, _readout)
    torch.testing.assert_close(clean.cpu(), clean_ref.cpu(), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(batched.cpu(), naive.cpu(), atol=1e-6, rtol=1e-5)
    assert (batched - clean).abs().max() > 1e-4   # the knock-outs change something


def test_count_interval_equals_a_naive_bootstrap_loop():
    rng = np.random.default_rng(3)
    deltas = rng.normal(0.01, 0.05, size=(9, 3, 3, 5))
    got = count_interval(deltas, 1000, seed=7)
    idx = np.random.default_rng(7).integers(0, 9, size=(1000, 9))
    boot = np.array([(deltas[i].mean(0) > 0).all(0).sum(-1) for i in idx])   # [1000, kinds]
    for ki, kind in enumerate(ko.KINDS):
        assert got[kind][0] == int((deltas.mean(0)[:, ki] > 0).all(0).sum())
        assert got[kind][1:] == pytest.approx(tuple(np.quantile(boot[:, ki], [0.025, 0.975])))


def test_unknown_component_kind_is_a_one_line_value_error(tiny_llama):
    with pytest.raises(ValueError, match="unknown component kind"):
        knockout_readout(tiny_llama, PROMPT, [Component("residual", 0)], _readout)
    with pytest.raises(IndexError):
        knockout_readout(tiny_llama, PROMPT, [Component("mlp", 3)], _readout)


# ---------------------------------------------------------------- superposition


def test_superposition_ranks_equal_a_hand_loop(tiny_llama):
    lm = tiny_llama
    g = lm.heads.geometry
    items = build_domain("world_capital", 0)[:2]
    deltas, _ = ko.head_knockout_deltas(lm, items, ("substitution",), max_rows=5)
    got = rank_heads(deltas[:, 0, 0].mean(0))
    hand = {Head(layer, head): 0.0 for layer in range(g.n_layers) for head in range(g.n_heads)}
    for ex in items:
        prompt = ex.prompts["substitution"]
        token = answer_first_token(lm.tokenizer, prompt, ex.context_answer)
        ids = encode(lm.tokenizer, [prompt]).input_ids.to(lm.device)
        with torch.inference_mode():
            p0 = float(lm.model(input_ids=ids).logits[0, -1].softmax(-1)[token])
            for head in hand:
                with scaled_heads(lm.heads, head_coefficients(g, {head: -1.0})):
                    p = float(lm.model(input_ids=ids).logits[0, -1].softmax(-1)[token])
                hand[head] += (p - p0) / len(items)
    expected = sorted(hand, key=lambda h: -hand[h])
    assert got[:4] == expected[:4]
    assert [hand[h] for h in got] == pytest.approx([hand[h] for h in expected], abs=1e-7)


# ---------------------------------------------------------------- Table 3 / Fig. 6


@pytest.mark.parametrize("arch", ["llama", "gemma3_text", "gpt2"])
def test_cumulative_run_once_and_twice_equal_separate_forwards(arch, tiny_models):
    lm = _tiny(tiny_models, arch)
    ranked = [Head(2, 1), Head(0, 3), Head(1, 0), Head(0, 1), Head(2, 2)]
    got = cumulative_probs(lm, PROMPT, 7, ranked, [1, 2, 3, 4, 5], max_rows=5)   # 3 chunks
    ref = cumulative_probs_naive(lm, PROMPT, 7, ranked, [1, 2, 3, 4, 5])
    assert got[0] == pytest.approx(ref[0], abs=1e-7)
    torch.testing.assert_close(got[1], ref[1], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got[2], ref[2], atol=1e-6, rtol=1e-5)


def test_run_once_equals_run_twice_at_one_head_and_differs_from_the_second_on(tiny_llama):
    ranked = [Head(0, 2), Head(2, 1), Head(1, 3)]
    clean, once, twice = cumulative_probs(tiny_llama, PROMPT, 7, ranked, [1, 2, 3])
    assert float(once[0]) == pytest.approx(float(twice[0]), abs=1e-7)
    assert abs(float(once[0]) - clean) > 1e-5                 # the head matters
    assert (once[1:] - twice[1:]).abs().min() > 1e-6          # a later head sees a changed residual stream
    # heads of one layer only: nothing downstream of the first differs, so both ways agree
    same_layer = [Head(1, 0), Head(1, 2), Head(1, 3)]
    _, once, twice = cumulative_probs(tiny_llama, PROMPT, 7, same_layer, [1, 2, 3])
    torch.testing.assert_close(once, twice, atol=1e-6, rtol=1e-5)


# ---------------------------------------------------------------- the commands


@pytest.fixture(scope="module")
def quick_out(tmp_path_factory):
    """One output folder for the quick runs: the filtered items are decoded once."""
    return tmp_path_factory.mktemp("analysis")


def _options(out, **kw):
    return AnalysisOptions(out=out, quick=True, filter=False, max_rows=64, bootstrap_resamples=1000, **kw)


def test_knockout_quick_writes_its_files_and_resumes(tiny_llama, quick_out, monkeypatch):
    options = _options(quick_out)
    result = ko.run_knockout(tiny_llama, options)
    assert [p.name for p in result.files] == ["knockout.json", "knockout.md", "knockout.png"]
    data = json.loads((options.out / "knockout.json").read_text())
    assert data["n_items"] == ko.SIZES["quick"] and data["n_layers"] == 3
    cell = data["per_layer"]["attention"]["coherent"][1]
    assert cell["n"] == 3 and cell["low"] <= cell["mean"] <= cell["high"]
    assert cell["mean"] == pytest.approx(float(result.deltas[:, 2, 1, 1].mean()))
    assert "| Attention |" in (options.out / "knockout.md").read_text()

    def no_forward(*args, **kwargs):
        raise AssertionError("a finished prompt was recomputed")

    monkeypatch.setattr(ko, "knockout_readout", no_forward)
    again = ko.run_knockout(tiny_llama, options)              # every prompt comes from the checkpoint
    np.testing.assert_array_equal(again.deltas, result.deltas)


def test_superposition_quick_writes_its_files(tiny_llama, quick_out):
    result = run_superposition(tiny_llama, _options(quick_out))
    data = json.loads(result.files[0].read_text())
    assert [p.suffix for p in result.files] == [".json", ".md", ".png"]
    assert len(data["top"]) == 4 and data["n_items"] == 3
    top = result.top[0][0]
    assert data["top"][0]["substitution"]["context"]["mean"] == pytest.approx(
        float(result.deltas[:, 0, 0, top.layer, top.head].mean()))
    assert data["ranking"][0] == str(top)


def test_interventions_quick_writes_its_files(tiny_llama, quick_out):
    result = run_multiple(tiny_llama, _options(quick_out))
    data = json.loads(result.files[0].read_text())
    assert [p.suffix for p in result.files] == [".json", ".md", ".png"]
    assert len(data["held_in"]) == 2 and len(data["held_out"]) == 2
    assert result.ns[0] == 1 and all(g > 0 for g in result.individual_gain)
    np.testing.assert_allclose(result.once[:, 0], result.twice[:, 0], atol=1e-6)   # one head: the same
    assert data["run_once"]["1"]["n"] == 2


def test_analyze_all_quick_writes_a_report_linking_every_file(tiny_llama, quick_out, monkeypatch):
    import juice.apps.analyze as acli

    monkeypatch.setattr(acli, "load_for", lambda options: tiny_llama)
    real = acli.cli_options
    monkeypatch.setattr(acli, "cli_options", lambda *a: AnalysisOptions(
        **{**real(*a).__dict__, "filter": False, "bootstrap_resamples": 1000}))
    mine = tuple(c for c in acli.COMMANDS if c.module in ("knockout", "superposition", "multiple"))
    monkeypatch.setattr(acli, "COMMANDS", mine)
    out = quick_out / "all"
    (out / "state").mkdir(parents=True)
    for f in (quick_out / "state").iterdir():                 # the runs above: every prompt is checkpointed
        (out / "state" / f.name).write_bytes(f.read_bytes())
    res = CliRunner().invoke(acli.analyze_app, ["all", "--quick", "--out", str(out), "--max-rows", "64"])
    assert res.exit_code == 0, res.output
    report = (out / "report.md").read_text()
    for name in ("knockout", "superposition", "multiple"):
        for suffix in (".json", ".md", ".png"):
            assert f"]({name}{suffix})" in report
            assert (out / f"{name}{suffix}").is_file()


def test_bad_options_are_one_line_errors(tmp_path):
    with pytest.raises(ValueError, match="--quick or --full"):
        AnalysisOptions(quick=True, full=True)
    with pytest.raises(ValueError, match="max rows"):
        AnalysisOptions(max_rows="many")
    with pytest.raises(ValueError, match="plain file stem"):
        write_outputs(tmp_path, "a/b", {}, "")
    res = CliRunner().invoke(__import__("juice.apps.analyze", fromlist=["x"]).analyze_app,
                             ["knockout", "--quick", "--full"])
    assert res.exit_code != 0 and "--quick or --full" in res.output
