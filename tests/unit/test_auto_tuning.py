"""auto's validation search (juice.when_to_steer.auto_tuning.fit_policy): the splits of one size
are scored together, and the choice is the one a loop over every gate and split, in order, keeps
(highest total, then no gate, fewer bins, less steered candidates, the earlier gate signal; the
earliest on a full tie)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from juice.data.context_types import CONTEXT_TYPES
from juice.when_to_steer.auto import CANDIDATES, MAX_THRESHOLDS, THRESHOLD_GRID
from juice.when_to_steer.auto_tuning import GATE_GRID, _midpoints, fit_policy, objective_weights
from juice.when_to_steer.signals import GATE_SIGNALS

pytestmark = pytest.mark.unit


def _loop_choice(verdicts, signal, types, sources, relevance):
    """The search as one loop over every gate and split (the definition the vectorised search
    keeps): (gate signal, gate, its candidate, thresholds, picks) of the first best key."""
    names = [c for c in CANDIDATES if c in verdicts]
    n = len(signal)
    has = np.array([t != "none" for t in types])
    weight, _ = objective_weights(types, sources)
    x = np.array(signal)
    score = np.stack([weight * np.array(verdicts[c], dtype=float) * has for c in names])
    fixed = float((weight * np.array(verdicts["original"], dtype=float))[~has].sum())
    cuts = _midpoints(x[has], THRESHOLD_GRID)
    gates = [(None, None, None)] + [(g, t, j) for g in GATE_SIGNALS if g in relevance
                                    for t in _midpoints(np.array(relevance[g])[has], GATE_GRID)
                                    for j in range(len(names))]
    steer_rank = np.array([CANDIDATES.index(c) for c in names])
    best = None
    for name, gate, pick in gates:
        below = np.zeros(n, dtype=bool) if gate is None else has & (np.array(relevance[name]) < gate)
        gated = 0.0 if gate is None else float(score[pick][below].sum())
        live = score * ~below
        rank = 0 if name is None else GATE_SIGNALS.index(name)
        for k in range(MAX_THRESHOLDS + 1):
            for edges in itertools.combinations(cuts, k):
                onehot = np.zeros((n, k + 1))
                onehot[np.arange(n), np.searchsorted(np.array(edges), x, side="right") if k else 0] = 1.0
                per_bin = live @ onehot
                picks = np.round(per_bin, 9).argmax(0)
                total = fixed + gated + float(per_bin[picks, np.arange(k + 1)].sum())
                key = (round(total, 9), gate is None, -k, -int(steer_rank[picks].sum()), -rank)
                if best is None or key > best[0]:
                    best = (key, name, gate, pick, edges, tuple(names[j] for j in picks))
    return best[1:]


@settings(max_examples=25, deadline=None)
@given(st.integers(12, 60), st.integers(2, len(CANDIDATES)), st.integers(0, 2), st.integers(0, 2 ** 31 - 1))
def test_the_search_chooses_what_a_loop_over_every_gate_and_split_chooses(n, candidates, gate_signals, seed):
    rng = np.random.default_rng(seed)
    types = [str(t) for t in rng.choice(CONTEXT_TYPES, size=n)]
    sources = [str(s) for s in rng.choice(["a", "b"], size=n)]
    names = list(CANDIDATES[:candidates])
    verdicts = {c: [bool(v) for v in rng.random(n) < rng.uniform(0.2, 0.8)] for c in names}
    signal = [float(v) for v in np.round(rng.random(n), 1)]   # coarse: ties between splits and candidates
    relevance = {g: [float(v) for v in np.round(rng.random(n), 1)] for g in GATE_SIGNALS[:gate_signals]}
    fit = fit_policy(verdicts, signal, types, sources, {c: (1.0, -1.0) for c in names},
                     relevance=relevance or None)
    name, gate, pick, edges, picks = _loop_choice(verdicts, signal, types, sources, relevance)
    if len(set(picks)) == 1:   # fit_policy drops thresholds that change nothing
        edges, picks = (), picks[:1]
    assert fit.policy.thresholds == tuple(float(e) for e in edges)
    assert fit.policy.picks == picks
    assert fit.policy.relevance == (None if gate is None else float(gate))
    if gate is not None:
        assert fit.policy.gate == name and fit.policy.irrelevant == names[pick]
