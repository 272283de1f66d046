"""The paper's Sec. 5 theory, run as code (small sizes, fixed seeds)."""

from __future__ import annotations

import torch

from juice.theory.construction import Constants, construct, predicted_factual
from juice.theory.experiments import ToyConfig, run_conflict, run_construction, run_juice_vs_june, run_learning
from juice.theory.model import Vocabulary
from juice.theory.tasks import factual_recall, induction, knowledge_conflict

CFG = ToyConfig(n_eval=120)


def test_tasks_are_sampled_as_the_paper_enumerates():
    v, g = Vocabulary(5, 30), torch.Generator().manual_seed(1)
    f = factual_recall(v, 10, 50, g)
    assert (f.tokens[:, -1] == v.q).all()
    assert ((f.tokens[:, :-1] < v.n_subjects).sum(1) == 1).all()
    ind = induction(v, 10, 50, g)
    for row, b in zip(ind.tokens, ind.inductive):
        qs = (row == v.q).nonzero().flatten().tolist()
        assert len(qs) == 2 and qs[1] == 9 and 1 <= qs[0] <= 7 and row[qs[0] + 1] == b
        assert (row == b).sum() == 1
    c = knowledge_conflict(v, 10, 50, g)
    assert (c.factual == c.tokens.clamp(max=v.n_subjects).min(1).values + v.n_subjects).all()


def test_construction_solves_both_tasks():
    r = run_construction(CFG)
    assert r["factual_recall_accuracy"] == 1.0 and r["induction_accuracy"] == 1.0


def test_conflict_output_flips_where_the_corollary_says():
    r = run_conflict(CFG, grid=(3.0, 5.0, 7.0))
    assert r["agreement"] == 1.0
    v, g = Vocabulary(CFG.n_subjects, CFG.n_noise), torch.Generator().manual_seed(3)
    batch = knowledge_conflict(v, CFG.seq_len, 100, g)
    for c1, c2 in ((7.0, 3.0), (3.0, 7.0)):
        consts = Constants(C1=c1, C2=c2, C3=10.0, C4=10.0)
        pred = construct(v, CFG.d, CFG.seq_len, consts)(batch.tokens).argmax(-1)
        target = batch.factual if predicted_factual(consts) else batch.inductive
        assert float((pred == target).double().mean()) > 0.95


def test_juice_recovers_the_factual_answer_where_june_does_not():
    r = run_juice_vs_june(CFG)
    assert r["original_factual"] < 0.05
    assert r["conflict_only"]["negative_heads"] == ["L0H0", "L1H0"]
    rows = r["conflict_only"]["factual_accuracy"]
    assert rows["-1"]["two_runs"] > 0.95   # JuICE; one run: JuNE, and PH3 at beta -1
    assert all(v["one_run"] < 0.5 for b, v in rows.items() if float(b) <= -1)


def test_gradient_descent_learns_the_superposed_terms():
    r = run_learning(ToyConfig(n_subjects=10, n_noise=30, n_eval=100), steps=60, adam_steps=10)
    lin = r["linear_second_layer"]
    assert lin["loss_last"] < lin["loss_first"]
    ov, kq = lin["projections"]["W_OV"], lin["projections"]["W_KQ"]
    for term in ("C3 sum_k mu(k) phi(k)^T", "C4 sum_s mu(G*(s)) phi(s)^T"):
        assert ov[term] > 5 * ov["other terms, mean |.|"]
    for term in ("C1 phi'(q) phi(q)^T", "C2 sum_s phi(s) phi(q)^T"):
        assert kq[term] > 5 * kq["other terms, mean |.|"]
