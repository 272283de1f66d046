"""The per-token tables the steered vLLM models fill before each forward
(:meth:`juice.vllm.models.SteerableMixin._juice_plan`; issue 46, part 7): each token takes its
request's coefficients, padding tokens none, and nothing is read back from the device (so a GPU
step makes no host synchronisation for them). Runs the mixin's method alone in vLLM's
environment; tests/integration/test_vllm.py checks the tokens of whole steered forwards."""

from __future__ import annotations

import subprocess

import pytest

from juice.vllm.launch import find_vllm_python

VLLM_PYTHON = find_vllm_python(required=False)
pytestmark = pytest.mark.skipif(VLLM_PYTHON is None, reason="no vLLM environment (run scripts/install-vllm.sh)")

SETUP = """
import types, torch
from juice.vllm import models
from juice.vllm.processor import BATCH
from juice.vllm.options import RequestSteering

L, H, MAX = 3, 4, 32
SLOTS = [(1, 0), (2, 3), (0, 1)]

def mixin(device):
    m = object.__new__(models.SteerableMixin)
    m.juice_max_tokens, m.juice_dirty, m.juice_compiled = MAX, 0, False
    m.juice_geometry = types.SimpleNamespace(n_layers=L, n_heads=H)
    m.juice_head_slice, m.juice_slots = slice(0, H), SLOTS
    m.model = types.SimpleNamespace(juice_factor=torch.ones(MAX, L, H, 1, device=device),
                                    juice_add=torch.zeros(MAX, len(SLOTS), 1, device=device))
    return m

def plan(m, starts, n_tokens, rows):
    models.get_forward_context = lambda: types.SimpleNamespace(
        attn_metadata={"layer.0": types.SimpleNamespace(query_start_loc=starts)})
    BATCH.rows.clear()
    BATCH.rows.update(rows)
    return m._juice_plan(n_tokens)
"""


def run_in_vllm(code: str) -> str:
    done = subprocess.run([VLLM_PYTHON, "-c", SETUP + code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_each_token_takes_its_requests_coefficients_and_padding_none():
    """Random batches (requests with no tokens, padding tokens past the last request, a larger
    forward before a smaller one): the tables equal each request's coefficients repeated over its
    `query_start_loc` range, 1 and 0 elsewhere; an unsteered forward after them resets every row
    an earlier one wrote."""
    out = run_in_vllm("""
g = torch.Generator().manual_seed(0)
m = mixin("cpu")
for trial in range(40):
    n_requests = int(torch.randint(1, 7, (1,), generator=g))
    counts = torch.randint(0, 5, (n_requests,), generator=g)
    starts = torch.zeros(n_requests + 1, dtype=torch.int32)
    starts[1:] = counts.cumsum(0)
    n_tokens = int(starts[-1]) + int(torch.randint(0, 4, (1,), generator=g))
    if n_tokens == 0:
        continue
    rows, scale, add = {}, torch.zeros(n_requests, L, H), torch.zeros(n_requests, L, H)
    for i in range(n_requests):
        kind = int(torch.randint(0, 3, (1,), generator=g))
        if kind == 1:
            scale[i] = torch.randn(L, H, generator=g)
        elif kind == 2:
            for layer, head in SLOTS:
                add[i, layer, head] = float(torch.randn(1, generator=g))
        if kind:
            rows[i] = RequestSteering("june" if kind == 1 else "juice", scale[i].clone(), add[i].clone(), None)
    state = plan(m, starts, n_tokens, rows)
    if not rows:
        assert state is None and m.juice_dirty == 0 and bool((m.model.juice_factor == 1).all())
        continue
    actual = int(starts[-1])
    factor = torch.ones(n_tokens, L, H)
    factor[:actual] = (1 + scale).repeat_interleave(counts, dim=0)
    coefficient = torch.zeros(n_tokens, len(SLOTS))
    per_request = torch.stack([add[:, layer, head] for layer, head in SLOTS], dim=1)
    coefficient[:actual] = per_request.repeat_interleave(counts, dim=0)
    assert torch.equal(m.model.juice_factor[:n_tokens, ..., 0], factor), trial
    assert torch.equal(m.model.juice_add[:n_tokens, :, 0], coefficient), trial
    assert state.juice_rows.tolist() == [i for i in range(n_requests) if bool(add[i].ne(0).any())]
plan(m, torch.tensor([0, 2], dtype=torch.int32), 2, {})
assert bool((m.model.juice_factor == 1).all()) and bool((m.model.juice_add == 0).all()) and m.juice_dirty == 0
m.juice_compiled = True   # compiled hooks read the tables every step: an unsteered step sets the rows it reads
m.model.juice_factor.fill_(float("nan")), m.model.juice_add.fill_(float("nan"))
plan(m, torch.tensor([0, 2], dtype=torch.int32), 5, {})
assert bool((m.model.juice_factor[:5] == 1).all()) and bool((m.model.juice_add[:5] == 0).all())
print("checked")
""")
    assert out.strip().endswith("checked")


def test_the_tables_are_filled_without_reading_the_device():
    """The batch's `query_start_loc` and the tables on PyTorch's meta device, which holds no
    values: any read back to the host (`.to("cpu")`, `int()`, `.tolist()`) raises there. The plan
    still fills the tables and names the steered layers and JuICE requests, so it reads nothing
    from the device (it read `query_start_loc` to the host, and failed here, before issue 46's
    part 7)."""
    out = run_in_vllm("""
m = mixin("meta")
starts = torch.tensor([0, 3, 4, 4, 6], dtype=torch.int32, device="meta")
june, juice = torch.zeros(L, H), torch.zeros(L, H)
june[1, 2], juice[2, 3] = 0.5, 2.0
state = plan(m, starts, 8, {0: RequestSteering("june", june, torch.zeros(L, H), None),
                            3: RequestSteering("juice", torch.zeros(L, H), juice, None)})
print(sorted(state.scaled), sorted(state.added), state.juice_rows.tolist(), m.juice_dirty)
""")
    assert out.split("\n")[-2] == "[1] [2] [3] 8"


def test_shadow_rows_take_their_juice_rows_and_the_tables_go_back_to_the_identity():
    """Issue 93: JuICE's run 1 as shadow rows appended after a forward's rows
    (:meth:`~juice.vllm.models.SteerableMixin._juice_shadow_rows`). Every JuICE token row gets
    one shadow row, not steered (factor 1, add 0), taking its JuICE row's input (`juice_source`)
    and giving it its head outputs (`juice_partner`); the live attention's slots gain -1 for them,
    the clean attention gets the JuICE rows' own slots (the batch's, every request being JuICE
    here, or the sub-batch's); a forward that would pass max_num_batched_tokens gets none; after
    the forward every index table is the identity again."""
    out = run_in_vllm("""
m = mixin("cpu")
m.juice_shadow_limit, m.juice_clean_names = MAX, {"l.0_clean"}
ident = torch.arange(MAX)
m.juice_identity = ident
m.model.juice_source, m.model.juice_partner = ident.clone(), ident.clone()
m.model.juice_shadowed = torch.zeros((), dtype=torch.bool)
live, clean = torch.arange(100, 106), torch.arange(200, 206)
context = types.SimpleNamespace(attn_metadata={"l.0": "meta", "l.0_clean": "meta"},
                                slot_mapping={"l.0": live, "l.0_clean": clean})
juice = torch.zeros(L, H)
juice[2, 3] = 2.0
steer = lambda: RequestSteering("juice", torch.zeros(L, H), juice.clone(), None)
starts = torch.tensor([0, 4, 6], dtype=torch.int32)
state = plan(m, starts, 7, {0: steer(), 1: steer()})   # every request JuICE; one padding row
models.get_forward_context = lambda: context
shadows, metadata, slots = m._juice_shadow_rows(state, 7)
assert (shadows.start, shadows.count, shadows.tokens.tolist()) == (7, 6, list(range(6)))
assert m.model.juice_source[7:13].tolist() == list(range(6)) and m.model.juice_source[:7].tolist() == list(range(7))
assert m.model.juice_partner[:6].tolist() == list(range(7, 13)) and int(m.model.juice_partner[6]) == 6
assert bool((m.model.juice_factor[7:13] == 1).all()) and bool((m.model.juice_add[7:13] == 0).all())
assert bool(m.model.juice_shadowed) and m.juice_dirty == 13
assert slots["l.0"].tolist() == list(range(100, 106)) + [-1] * 7 and slots["l.0_clean"].tolist() == list(range(200, 206))
assert metadata["l.0_clean"] == "meta"
m._juice_unshadow(shadows)
assert torch.equal(m.model.juice_source, ident) and torch.equal(m.model.juice_partner, ident)
assert not bool(m.model.juice_shadowed)
# one request in two JuICE: the sub-batch's rows, slots and metadata for the clean attention
state = plan(m, starts, 6, {1: steer()})
models.get_forward_context = lambda: context
m._juice_sub_batch = lambda s: (torch.tensor([4, 5]), {"l.0": "sub", "l.0_clean": "sub"},
                                {"l.0": live[4:6], "l.0_clean": clean[4:6]})
shadows, metadata, slots = m._juice_shadow_rows(state, 6)
assert shadows.tokens.tolist() == [4, 5] and m.model.juice_partner[:6].tolist() == [0, 1, 2, 3, 6, 7]
assert m.model.juice_source[6:8].tolist() == [4, 5]
assert metadata == {"l.0": "meta", "l.0_clean": "sub"} and slots["l.0_clean"].tolist() == [204, 205]
assert slots["l.0"].tolist() == list(range(100, 106)) + [-1, -1]
m._juice_unshadow(shadows)
assert torch.equal(m.model.juice_partner, ident) and torch.equal(m.model.juice_source, ident)
m.juice_shadow_limit = 7   # 6 rows and 2 shadow rows would pass it: run 1 runs separately
state = plan(m, starts, 6, {1: steer()})
models.get_forward_context = lambda: context
assert m._juice_shadow_rows(state, 6) is None
print("checked")
""")
    assert out.strip().endswith("checked")
