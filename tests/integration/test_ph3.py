"""PH3's path patching (juice.baselines.ph3): the batched one-token computation against one full
hooked forward per head on every architecture, batched = one by one, a last-layer head by hand
(Llama, and Gemma 3 with its post-attention norm), the signs of engineered memory and context
heads, the prompt builder's counterfactuals, and resume from a checkpoint."""

from __future__ import annotations

import copy

import pytest
import torch

import juice.baselines.ph3 as ph3
from juice.baselines.ph3 import (
    NO_CONTEXT,
    OTHER_ITEM,
    PatchingPrompt,
    heads_to_prune,
    path_patching_effects,
    path_patching_ld,
    ph3_patching_prompts,
)
from juice.data.records import ConflictExample, ContextualExample
from juice.interventions import Head, captured_heads, projection_input_hooks
from juice.models import wrap_model
from juice.io import UnitCheckpoint
from juice.tokens import answer_first_token, encode


def _tok(lm, word: str) -> int:
    return lm.tokenizer.convert_tokens_to_ids(word)


def _prompts(lm) -> list[PatchingPrompt]:
    """Two units whose prompt and counterfactual differ in length."""
    return [
        PatchingPrompt("the capital of france is tokyo . the capital of france is",
                       "the capital of germany is rome . the capital of germany is",
                       _tok(lm, "paris"), _tok(lm, "tokyo")),
        PatchingPrompt("question : who plays golf ? w40 plays tennis . answer :",
                       "question : who plays basketball ? answer :", _tok(lm, "golf"), _tok(lm, "tennis")),
    ]


def _all_heads(lm) -> list[Head]:
    g = lm.heads.geometry
    return [Head(l, h) for l in range(g.n_layers) for h in range(g.n_heads)]


def _outputs(lm, prompt):
    """Token ids, every layer's head outputs `[seq, n_heads, head_dim]`, last-position logits."""
    ids = encode(lm.tokenizer, [prompt]).input_ids.to(lm.device)
    with torch.no_grad(), captured_heads(lm.heads, range(lm.heads.geometry.n_layers)) as store:
        logits = lm.model(input_ids=ids).logits[0, -1]
    return ids, {l: h[0].clone() for l, h in store.items()}, logits


def _naive_ld(lm, pp, head, freeze=True, every_position=False):
    """One full-sequence forward of the original prompt with hooks: every head set to its output on
    the original prompt at every position (if `freeze`), the sender's output replaced by its output
    on the counterfactual at the last position (or at every position, for prompts of equal length)."""
    ids, original, _ = _outputs(lm, pp.prompt)
    _, counterfactual, _ = _outputs(lm, pp.counterfactual)
    g = lm.heads.geometry

    def hook(layer, x):
        h = x.view(*x.shape[:-1], g.n_heads, -1).clone()
        if freeze:
            h[0] = original[layer]
        if layer == head.layer:
            if every_position:
                h[0, :, head.head] = counterfactual[layer][:, head.head]
            else:
                h[0, -1, head.head] = counterfactual[layer][-1, head.head]
        return h.reshape(x.shape)

    with torch.no_grad(), projection_input_hooks(lm.heads, {l: hook for l in range(g.n_layers)}):
        logits = lm.model(input_ids=ids).logits[0, -1]
    return float(logits[pp.parametric_token] - logits[pp.context_token])


# ------------------------------------------------------------------ the computation


def test_batched_path_patching_equals_one_full_hooked_forward_per_head(tiny):
    heads = _all_heads(tiny)
    for pp in _prompts(tiny):
        clean, lds = path_patching_ld(tiny, pp, heads, max_rows=5)   # several chunks
        _, _, logits = _outputs(tiny, pp.prompt)
        assert abs(clean - float(logits[pp.parametric_token] - logits[pp.context_token])) < 1e-5
        naive = torch.tensor([_naive_ld(tiny, pp, h) for h in heads], dtype=torch.float64)
        torch.testing.assert_close(lds, naive, rtol=0, atol=1e-5)
        assert (lds - clean).abs().max() > 1e-3   # the patches do something


def test_patching_the_last_position_only_equals_patching_every_position(tiny):
    """With every other head frozen nothing moves between positions: for prompts of equal length,
    patching the sender at every position gives the same last-position LD."""
    pp = PatchingPrompt("the capital of france is tokyo . the capital of france is",
                        "the capital of spain is berlin . the capital of spain is",
                        _tok(tiny, "paris"), _tok(tiny, "tokyo"))
    _, lds = path_patching_ld(tiny, pp, _all_heads(tiny))
    every = torch.tensor([_naive_ld(tiny, pp, h, every_position=True) for h in _all_heads(tiny)],
                         dtype=torch.float64)
    torch.testing.assert_close(lds, every, rtol=0, atol=1e-5)


def test_batched_equals_one_head_at_a_time_and_any_chunking(tiny_gemma3):
    lm = tiny_gemma3
    heads = _all_heads(lm)
    pp = _prompts(lm)[0]
    clean, together = path_patching_ld(lm, pp, heads)
    _, chunked = path_patching_ld(lm, pp, heads, max_rows=1)
    _, shuffled = path_patching_ld(lm, pp, heads[::-1], max_rows=7)
    alone = torch.tensor([path_patching_ld(lm, pp, [h])[1][0] for h in heads], dtype=torch.float64)
    for other in (chunked, shuffled.flip(0), alone):
        torch.testing.assert_close(together, other, rtol=0, atol=1e-5)
    empty_clean, empty = path_patching_ld(lm, pp, [])
    assert empty.numel() == 0 and abs(empty_clean - clean) < 1e-5
    with pytest.raises(IndexError):
        path_patching_ld(lm, pp, [Head(lm.heads.geometry.n_layers, 0)])


def test_a_last_layer_head_by_hand_llama(tiny_llama):
    """Llama: residual + o_proj(patched heads), the MLP block, the final norm, the LM head."""
    lm = tiny_llama
    g = lm.heads.geometry
    last = g.n_layers - 1
    pp = _prompts(lm)[0]
    _, lds = path_patching_ld(lm, pp, [Head(last, h) for h in range(g.n_heads)])
    for h in range(g.n_heads):   # nothing downstream to freeze: the path patch is the activation patch
        assert abs(float(lds[h]) - _naive_ld(lm, pp, Head(last, h), freeze=False)) < 1e-5
    layer, resid_in, z = _last_layer_with_head_patched(lm, pp, 1)
    with torch.no_grad():
        mid = resid_in + layer.self_attn.o_proj(z.reshape(-1))
        out = mid + layer.mlp(layer.post_attention_layernorm(mid))
        logits = lm.logits(lm.model.model.norm(out))
    assert abs(float(lds[1]) - float(logits[pp.parametric_token] - logits[pp.context_token])) < 1e-5


def _last_layer_with_head_patched(lm, pp, head: int):
    """The last layer, its residual input at the last position, and its heads' outputs there
    `[n_heads, head_dim]` with `head`'s taken from the counterfactual prompt (by hand, for the
    path-patching checks below)."""
    last = lm.heads.geometry.n_layers - 1
    ids, original, _ = _outputs(lm, pp.prompt)
    _, counterfactual, _ = _outputs(lm, pp.counterfactual)
    with torch.no_grad():
        resid_in = lm.model.model(input_ids=ids, output_hidden_states=True).hidden_states[last][0, -1]
    z = original[last][-1].clone()
    z[head] = counterfactual[last][-1, head]
    return lm.model.model.layers[last], resid_in, z


def test_a_last_layer_head_by_hand_gemma3_renormalizes_the_patched_attention_output(tiny_gemma3):
    """Gemma 3 normalizes the attention output before the residual add: the norm is recomputed on
    the layer's patched attention output (module docstring, "Paths")."""
    lm = tiny_gemma3
    last = lm.heads.geometry.n_layers - 1
    pp = _prompts(lm)[1]
    _, lds = path_patching_ld(lm, pp, [Head(last, 2)])
    layer, resid_in, z = _last_layer_with_head_patched(lm, pp, 2)
    with torch.no_grad():
        mid = resid_in + layer.post_attention_layernorm(layer.self_attn.o_proj(z.reshape(-1)))
        out = mid + layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(mid)))
        logits = lm.logits(lm.model.model.norm(out))
    assert abs(float(lds[0]) - float(logits[pp.parametric_token] - logits[pp.context_token])) < 1e-5


# ------------------------------------------------------------------ signs


def _engineered(lm, pp, head: Head, sign: float):
    """A copy of `lm` whose `head` (last layer) writes `sign * s * v` on the original prompt and
    nothing on the counterfactual, v the direction that raises LD: a memory head for sign +1, a
    context head for sign -1."""
    model = copy.deepcopy(lm.model)
    edited = wrap_model(model, lm.tokenizer, name="engineered")
    _, original, _ = _outputs(edited, pp.prompt)
    _, counterfactual, _ = _outputs(edited, pp.counterfactual)
    z0, z1 = original[head.layer][-1, head.head], counterfactual[head.layer][-1, head.head]
    a = z0 - (z0 @ z1) / (z1 @ z1) * z1                 # a . z1 = 0, a . z0 = |a|^2
    w_u = model.lm_head.weight
    v = model.model.norm.weight * (w_u[pp.parametric_token] - w_u[pp.context_token])
    d = lm.heads.geometry.head_dim
    with torch.no_grad():
        o_proj = model.model.layers[head.layer].self_attn.o_proj.weight
        o_proj[:, head.head * d:(head.head + 1) * d] = sign * 20.0 * torch.outer(v / v.norm(), a / (a @ a))
    return edited


def test_an_engineered_memory_head_is_the_top_memory_head_and_its_mirror_the_top_context_head(tiny_llama):
    lm = tiny_llama
    pp = _prompts(lm)[0]
    target = Head(lm.heads.geometry.n_layers - 1, 1)
    memory = path_patching_effects(_engineered(lm, pp, target, +1.0), [pp])
    context = path_patching_effects(_engineered(lm, pp, target, -1.0), [pp])
    assert memory.effects[target] < -1.0 and context.effects[target] > 1.0
    assert memory.ranked("memory")[0] == target and target not in memory.ranked("context")
    assert context.ranked("context")[0] == target and target not in context.ranked("memory")
    # PH3 prunes the opposing kind: memory heads to follow the context, context heads to follow memory
    assert heads_to_prune(memory, "contextual", 1) == (target,)
    assert heads_to_prune(context, "parametric", 1) == (target,)
    for scores in (memory, context):
        assert all(scores.effects[h] < 0 for h in scores.ranked("memory"))
        assert all(scores.effects[h] > 0 for h in scores.ranked("context"))


# ------------------------------------------------------------------ builder


def _fact(subject, answer, context):
    prompts = {"clean": f"the capital of {subject} is",
               "substitution": f"the capital of {subject} is {context} . the capital of {subject} is",
               "coherent": f"{subject} is known for its vibrant culture . its capital city is {context} . "
                           f"the capital of {subject} is"}
    return ConflictExample("world_capital", subject, (answer,), context, prompts)


def test_the_builder_pairs_each_conflict_prompt_with_another_items_prompt_of_its_type(tiny_llama):
    lm = tiny_llama
    items = [_fact("france", "paris", "tokyo"), _fact("spain", "paris", "rome"),   # shares "paris" with france
             _fact("japan", "tokyo", "berlin"), _fact("germany", "berlin", "madrid")]
    pps = ph3_patching_prompts(lm, items)
    assert [pp.prompt for pp in pps] == [ex.prompts[t] for ex in items for t in ("substitution", "coherent")]
    assert all(pp.counterfactual_kind == OTHER_ITEM for pp in pps)
    for ex, pp in zip([ex for ex in items for _ in range(2)], pps):
        assert pp.parametric_token == answer_first_token(lm.tokenizer, pp.prompt, ex.answer)
        assert pp.context_token == answer_first_token(lm.tokenizer, pp.prompt, ex.context_answer)
    partner = {ex.prompts[t]: ex for ex in items for t in ("substitution", "coherent")}
    for ex, t, pp in zip([ex for ex in items for _ in range(2)], ["substitution", "coherent"] * 4, pps):
        other = partner[pp.counterfactual]
        assert other is not ex and pp.counterfactual == other.prompts[t]   # same type, another item
    # the next item in order, skipping those that share an answer first token with this prompt
    # (france: spain shares "paris", japan "tokyo"; japan: germany shares "berlin", france "tokyo")
    by_subject = {ex.subject: partner[pp.counterfactual].subject for ex, pp in zip(items, pps[::2])}
    assert by_subject == {"france": "germany", "spain": "japan", "japan": "spain", "germany": "france"}


def test_the_builder_on_contextual_items_and_the_one_item_fallback(tiny_llama):
    lm = tiny_llama

    def item(dataset, uid, passage, question, ctx, par):
        return ContextualExample(dataset, uid, f"context : {passage} question : {question} answer :",
                                 f"question : {question} answer :", (ctx,), (par,), "qa", "nqswap")

    a = item("nqswap", "0", "w40 plays golf", "who plays golf ?", "w40", "w41")
    b = item("nqswap", "1", "w42 wrote the book", "who wrote the book ?", "w42", "w43")
    c = item("memo", "0", "w44 is a city", "what is w44 ?", "city", "country")
    pa, pb, pc = ph3_patching_prompts(lm, [a, b, c])
    assert (pa.prompt, pa.counterfactual, pa.counterfactual_kind) == (a.prompt, b.prompt, OTHER_ITEM)
    assert (pb.prompt, pb.counterfactual) == (b.prompt, a.prompt)
    assert (pc.prompt, pc.counterfactual) == (c.prompt, a.prompt)   # alone in its dataset: another dataset's item
    assert (pa.parametric_token, pa.context_token) == (_tok(lm, "w41"), _tok(lm, "w40"))
    (alone,) = ph3_patching_prompts(lm, [a])
    assert (alone.counterfactual, alone.counterfactual_kind) == (a.question, NO_CONTEXT)
    fact = _fact("france", "paris", "tokyo")
    assert [(pp.counterfactual, pp.counterfactual_kind) for pp in ph3_patching_prompts(lm, [fact])] == \
        [(fact.prompts["clean"], NO_CONTEXT)] * 2
    assert ph3_patching_prompts(lm, []) == []


# ------------------------------------------------------------------ aggregation and checkpoint


def test_effects_average_the_change_over_prompts_and_resume_from_a_checkpoint(tiny_llama, tmp_path, monkeypatch):
    lm = tiny_llama
    prompts = _prompts(lm)
    heads = _all_heads(lm)
    per_prompt = [path_patching_ld(lm, pp, heads) for pp in prompts]
    expected = sum(lds - clean for clean, lds in per_prompt) / len(prompts)
    seen = []
    ck = UnitCheckpoint(tmp_path / "units.json", "scope")
    first = path_patching_effects(lm, prompts, checkpoint=ck, on_progress=seen.append)
    assert seen == [1, 1]   # one unit per prompt
    torch.testing.assert_close(first.effects.flatten(), expected, rtol=0, atol=1e-9)
    assert first.effects.shape == (lm.heads.geometry.n_layers, lm.heads.geometry.n_heads)
    torch.testing.assert_close(first.clean_ld, torch.tensor([c for c, _ in per_prompt]), rtol=0, atol=1e-6)

    def fail(*args, **kwargs):
        raise AssertionError("a checkpointed prompt was recomputed")

    monkeypatch.setattr(ph3, "path_patching_ld", fail)
    again = path_patching_effects(lm, prompts, checkpoint=UnitCheckpoint(tmp_path / "units.json", "scope"))
    assert torch.equal(first.effects, again.effects) and torch.equal(first.clean_ld, again.clean_ld)
    with pytest.raises(ValueError, match="at least one"):
        path_patching_effects(lm, [])
