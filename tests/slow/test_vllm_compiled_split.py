"""JuICE's run 1 through vLLM's own piecewise compilation (issue 65): on a GPU, vLLM splits the
traced forward at its splitting ops, captures the pieces between them as CUDA graphs and runs the
splitting ops eagerly; run 1's op must be a splitting op alone, or replay would add another
step's clean outputs. vLLM's CPU build compiles differently (one Inductor graph), so the test puts
its compilation mode back to VLLM_COMPILE (tests/vllm_env/run_offline.py, `piecewise_on_cpu`):
Dynamo traces the steered model, vLLM's `split_graph` splits it (recorded), Inductor compiles the
pieces; only the CUDA graph capture is missing, so run 1 runs separately, as under CUDA graphs
(not as shadow rows: a graph replays a fixed batch). Slow tier: vLLM in a subprocess, from its own
environment; skips without it."""

from __future__ import annotations

from helpers.vllm import CONTEXTUAL, PARAMETRIC, equality_case, needs_vllm, tiny_llama_dir  # noqa: E402

RUN1 = "juice.clean_run"
"""How run 1's op (:data:`juice.vllm.constraints.CLEAN_RUN_OP`) prints as a traced node's target."""
SHADOW = "juice.shadow_attention"
"""How the shadow rows' attention op (:data:`juice.vllm.constraints.SHADOW_ATTENTION_OP`) prints."""


@needs_vllm
def test_run_1_is_a_splitting_piece_of_its_own_in_vllms_piecewise_compilation(tmp_path):
    lm, folder = tiny_llama_dir(tmp_path)
    steerings = [None, {"method": "juice", "direction": "parametric", "beta_plus": 2.0, "beta_minus": -1.0},
                 {"method": "june", "direction": "contextual", "beta_plus": 1.5, "beta_minus": 0.0}]
    max_tokens = 6
    case = equality_case(lm, folder, tmp_path, ["the capital of france is paris", "japan tokyo spain"],
                         {"parametric": PARAMETRIC, "contextual": CONTEXTUAL}, steerings, max_tokens=max_tokens,
                         llm={"enforce_eager": False, "enable_prefix_caching": False},
                         env={"JUICE_TEST_PIECEWISE_ON_CPU": "1"}, separate_run1=True)
    record = case["compilation"]
    pieces = [piece for split in record["splits"] for piece in split]
    print("\n".join(f"splitting {'|'.join(ops)}" if splitting else f"compiled  {len(ops)} ops" for splitting, ops in pieces))
    holding = [(splitting, ops) for splitting, ops in pieces if any(RUN1 in op for op in ops)]
    assert holding, "run 1's op is not in the traced forward"
    assert all(splitting and len(ops) == 1 for splitting, ops in holding), holding   # alone, run eagerly
    assert any(not splitting for splitting, _ in pieces), "no compiled piece: vLLM did not split"
    # The shadow rows' attention op is traced inside the compiled pieces (a no-op in a replayed step).
    assert any(SHADOW in op for splitting, ops in pieces if not splitting for op in ops)
    # Every forward with a JuICE row ran run 1's body once; the others called the op, which returned.
    assert record["forwards_with_juice"] > 0 and record["run1"] == record["forwards_with_juice"]
    assert case["mixed"] == case["expected"]
    assert case["alone"] == case["expected"]
    assert len({tuple(t) for t in case["expected"]}) >= 3, "the steerings should change the tokens"
