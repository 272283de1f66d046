"""The four results of the paper's Sec. 5, run as code (`juice toy all`).

1. Prop. 5.1, construction: the constructed transformer solves factual recall and induction.
2. Prop. 5.2, learning: gradient descent from zero on the second layer (first layer fixed,
   linearized attention, orthogonal embeddings) learns the superposed W_OV and W_KQ; a full
   softmax model trained with Adam is checked for the same structure.
3. Cor. 5.3, knowledge conflict: the output switches from the inductive to the factual answer
   where exp(C1) C3 = exp(C2) C4.
4. Prop. 5.4, JuICE vs JuNE/PH3: when induction dominates, knocking out the identified context
   heads in one run does not give the factual answer; JuICE's dual run does.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch

from juice.stage1 import ALPHAS_NEGATIVE, ALPHAS_POSITIVE, HeadScores, select_heads
from juice.interventions import Head
from juice.theory.construction import Constants, construct, predicted_factual
from juice.theory.model import TwoLayerTransformer, Vocabulary
from juice.theory.tasks import TaskBatch, factual_recall, induction, knowledge_conflict


@dataclass(frozen=True)
class ToyConfig:
    n_subjects: int = 20
    n_noise: int = 60
    d: int = 2048
    seq_len: int = 12
    n_eval: int = 300
    seed: int = 0


def _accuracy(logits: torch.Tensor, target: torch.Tensor) -> float:
    return float((logits.argmax(-1) == target).double().mean())


# ------------------------------------------------------------------ 1. construction


def run_construction(cfg: ToyConfig) -> dict[str, Any]:
    vocab = Vocabulary(cfg.n_subjects, cfg.n_noise)
    g = torch.Generator().manual_seed(cfg.seed)
    model = construct(vocab, cfg.d, cfg.seq_len, seed=cfg.seed)
    fact, ind = factual_recall(vocab, cfg.seq_len, cfg.n_eval, g), induction(vocab, cfg.seq_len, cfg.n_eval, g)
    with torch.no_grad():
        return {
            "factual_recall_accuracy": _accuracy(model(fact.tokens), fact.factual),
            "induction_accuracy": _accuracy(model(ind.tokens), ind.inductive),
            "constants": asdict(Constants()),
            "n_eval": cfg.n_eval,
        }


# ------------------------------------------------------------------ 2. learning


def orthogonal_setup(vocab: Vocabulary) -> dict[str, torch.Tensor]:
    """Strictly orthogonal phi, phi' = W_OV^(1) phi and mu (Assumption G.2): one basis each."""
    n = vocab.size
    eye = torch.eye(3 * n, dtype=torch.float64)
    return {"phi": eye[:n], "phi_prev": eye[n:2 * n], "mu": eye[2 * n:]}


def first_layer_output(tokens: torch.Tensor, basis: dict[str, torch.Tensor]) -> torch.Tensor:
    """A perfect "copy the previous token" first layer, positions ignored (Prop. G.2):
    x_t = phi(z_t) + phi'(z_{t-1})."""
    x = basis["phi"][tokens].clone()
    x[:, 1:] += basis["phi_prev"][tokens[:, :-1]]
    return x


def one_layer_logits(x: torch.Tensor, w_ov: torch.Tensor, w_kq: torch.Tensor, mu: torch.Tensor) -> torch.Tensor:
    """Prop. G.2's model: f(X) = W_lin^T W_OV X sigma, sigma_j = (1 + x_j^T W_KQ x_T) / T."""
    t = x.shape[1]
    sigma = (1 + torch.einsum("bkd,bd->bk", x, x[:, -1] @ w_kq.T)) / t     # x_k^T W_KQ x_T
    attended = torch.einsum("bk,bkd->bd", sigma, x)                      # X sigma
    return attended @ w_ov.T @ mu.T                                      # W_lin^T W_OV X sigma


def superposition_terms(vocab: Vocabulary, w_ov: torch.Tensor, w_kq: torch.Tensor, phi, phi_prev, mu) -> dict:
    """Projections of W_OV and W_KQ on the constructed terms (mean of u^T W v over each term's
    rank-1 parts) and on every other pair of basis directions (mean |u^T W v|, max |u^T W v|)."""
    subjects, noise, q = list(vocab.subjects), list(vocab.noise), vocab.q
    answers = [vocab.answer_of(s) for s in subjects]
    ov = mu @ w_ov @ torch.cat([phi, phi_prev]).T          # [N, 2N]: mu(i)^T W_OV v_j
    kq = torch.cat([phi, phi_prev]) @ w_kq @ phi.T          # [2N, N]: v_k^T W_KQ phi(j)
    n = vocab.size
    c3 = ov[noise, noise].mean()
    c4 = ov[answers, subjects].mean()
    c1 = kq[n + q, q]
    c2 = kq[subjects, q].mean()
    ov_mask = torch.ones_like(ov, dtype=torch.bool)
    ov_mask[noise, noise] = False
    ov_mask[answers, subjects] = False
    kq_mask = torch.ones_like(kq, dtype=torch.bool)
    kq_mask[n + q, q] = False
    kq_mask[subjects, q] = False
    return {
        "W_OV": {"C3 sum_k mu(k) phi(k)^T": float(c3), "C4 sum_s mu(G*(s)) phi(s)^T": float(c4),
                 "other terms, mean |.|": float(ov[ov_mask].abs().mean()),
                 "other terms, max |.|": float(ov[ov_mask].abs().max()),
                 "spurious mu(G*(s)) phi'(s)^T": float(ov[answers, [n + s for s in subjects]].mean())},
        "W_KQ": {"C1 phi'(q) phi(q)^T": float(c1), "C2 sum_s phi(s) phi(q)^T": float(c2),
                 "other terms, mean |.|": float(kq[kq_mask].abs().mean()),
                 "other terms, max |.|": float(kq[kq_mask].abs().max())},
    }


def run_learning(cfg: ToyConfig, steps: int = 200, lr: float = 5.0, adam_steps: int = 300) -> dict[str, Any]:
    """Prop. 5.2: full-batch gradient descent from zero on the linearized second layer; then the
    full softmax two-layer model with Adam (all four matrices trained, random embeddings)."""
    vocab = Vocabulary(cfg.n_subjects, cfg.n_noise)
    g = torch.Generator().manual_seed(cfg.seed)
    n_train = 400
    fact, ind = factual_recall(vocab, cfg.seq_len, n_train, g), induction(vocab, cfg.seq_len, n_train, g)
    tokens = torch.cat([fact.tokens, ind.tokens])
    targets = torch.cat([fact.factual, ind.inductive])
    basis = orthogonal_setup(vocab)
    x = first_layer_output(tokens, basis)
    dim = x.shape[-1]
    w_ov = torch.zeros(dim, dim, dtype=torch.float64, requires_grad=True)
    w_kq = torch.zeros(dim, dim, dtype=torch.float64, requires_grad=True)
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(one_layer_logits(x, w_ov, w_kq, basis["mu"]), targets)
        w_ov.grad = w_kq.grad = None
        loss.backward()
        with torch.no_grad():
            w_ov -= lr * w_ov.grad
            w_kq -= lr * w_kq.grad
        losses.append(float(loss.detach()))
    with torch.no_grad():
        test_f, test_i = factual_recall(vocab, cfg.seq_len, cfg.n_eval, g), induction(vocab, cfg.seq_len, cfg.n_eval, g)
        acc_f = _accuracy(one_layer_logits(first_layer_output(test_f.tokens, basis), w_ov, w_kq, basis["mu"]), test_f.factual)
        acc_i = _accuracy(one_layer_logits(first_layer_output(test_i.tokens, basis), w_ov, w_kq, basis["mu"]), test_i.inductive)
        terms = superposition_terms(vocab, w_ov, w_kq, basis["phi"], basis["phi_prev"], basis["mu"])
    return {
        "linear_second_layer": {
            "steps": steps, "lr": lr, "loss_first": losses[0], "loss_last": losses[-1], "losses": losses[::10],
            "factual_accuracy": acc_f, "induction_accuracy": acc_i, "projections": terms,
        },
        "softmax_two_layer_adam": _train_softmax(cfg, vocab, tokens, targets, adam_steps, g),
    }


def _train_softmax(cfg: ToyConfig, vocab: Vocabulary, tokens, targets, steps: int, g) -> dict[str, Any]:
    d = 256
    model = TwoLayerTransformer(vocab, d, cfg.seq_len, seed=cfg.seed, softmax=True)
    gen = torch.Generator().manual_seed(cfg.seed + 7)
    with torch.no_grad():
        for p in [*model.w_kq, *model.w_ov]:
            p.copy_(torch.randn(d, d, generator=gen, dtype=torch.float64) * 0.02)
    opt = torch.optim.Adam([*model.w_kq, *model.w_ov], lr=3e-3)
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(model(tokens), targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    with torch.no_grad():
        test_f = factual_recall(vocab, cfg.seq_len, cfg.n_eval, g)
        test_i = induction(vocab, cfg.seq_len, cfg.n_eval, g)
        conflict = knowledge_conflict(vocab, cfg.seq_len, cfg.n_eval, g)
        logits_c = model(conflict.tokens)
        phi, mu = model.embed, model.unembed
        phi_prev = phi @ model.w_ov[0].T                     # learned phi'(i) = W_OV^(1) phi(i)
        terms = superposition_terms(vocab, model.w_ov[1], model.w_kq[1], phi, phi_prev, mu)
    return {
        "steps": steps, "loss_first": losses[0], "loss_last": losses[-1],
        "factual_accuracy": _accuracy(model(test_f.tokens), test_f.factual),
        "induction_accuracy": _accuracy(model(test_i.tokens), test_i.inductive),
        "conflict_outputs_factual": _accuracy(logits_c, conflict.factual),
        "conflict_outputs_inductive": _accuracy(logits_c, conflict.inductive),
        "projections": terms,
    }


# ------------------------------------------------------------------ 3. knowledge conflict


def run_conflict(cfg: ToyConfig, grid: tuple[float, ...] = (2.0, 3.5, 5.0, 6.5, 8.0),
                 c3: float = 10.0, c4: float = 4.0) -> dict[str, Any]:
    """Cor. 5.3: sweep C1 x C2 (C3, C4 fixed); measured share of factual answers on conflict
    sequences vs the predicted side of exp(C1) C3 = exp(C2) C4."""
    vocab = Vocabulary(cfg.n_subjects, cfg.n_noise)
    g = torch.Generator().manual_seed(cfg.seed)
    batch = knowledge_conflict(vocab, cfg.seq_len, cfg.n_eval, g)
    cells = []
    for c1 in grid:
        for c2 in grid:
            constants = Constants(C1=c1, C2=c2, C3=c3, C4=c4)
            model = construct(vocab, cfg.d, cfg.seq_len, constants, seed=cfg.seed)
            with torch.no_grad():
                logits = model(batch.tokens)
            cells.append({"C1": c1, "C2": c2, "factual": _accuracy(logits, batch.factual),
                          "inductive": _accuracy(logits, batch.inductive),
                          "predicted_factual": predicted_factual(constants)})
    agree = sum((c["factual"] > 0.5) == c["predicted_factual"] for c in cells) / len(cells)
    return {"C3": c3, "C4": c4, "grid": list(grid), "cells": cells, "agreement": agree,
            "boundary": f"C2 = C1 + log(C3/C4) = C1 + {math.log(c3 / c4):.3f}"}


# ------------------------------------------------------------------ 4. JuICE vs JuNE / PH3


def _probs(model, tokens, target, **kw) -> torch.Tensor:
    return model(tokens, **kw).softmax(-1).gather(1, target[:, None])[:, 0]


def toy_head_scores(model: TwoLayerTransformer, sets: dict[str, TaskBatch],
                    alphas=(*ALPHAS_POSITIVE, *ALPHAS_NEGATIVE)) -> HeadScores:
    """Paper Alg. 2 on the toy model: each of its two heads scaled alone by each alpha; score =
    change in probability of the factual answer, summed over the set, per conflict type."""
    scores = torch.zeros(len(sets), 2, 1, len(alphas), dtype=torch.float64)
    with torch.no_grad():
        for j, batch in enumerate(sets.values()):
            base = _probs(model, batch.tokens, batch.factual)
            for layer in range(2):
                for a, alpha in enumerate(alphas):
                    scales = torch.zeros(2, dtype=torch.float64)
                    scales[layer] = alpha
                    scores[j, layer, 0, a] = (_probs(model, batch.tokens, batch.factual, scales=scales) - base).sum()
    return HeadScores(scores, tuple(alphas), len(ALPHAS_POSITIVE), tuple(sets), torch.zeros(len(sets), 0))


def toy_june(model, tokens, coefficients: torch.Tensor) -> torch.Tensor:
    """JuNE / PH3 in one run: H_l <- H_l + beta_l H_l (beta = -1 prunes the head)."""
    return model(tokens, scales=coefficients)


def toy_juice(model, tokens, coefficients: torch.Tensor) -> torch.Tensor:
    """JuICE: run 1 saves the head outputs; run 2 adds beta_l times them (paper Alg. 1)."""
    saved: dict[int, torch.Tensor] = {}
    model(tokens, capture=saved)
    return model(tokens, additions={l: coefficients[l] * saved[l] for l in range(2) if coefficients[l] != 0})


def run_juice_vs_june(cfg: ToyConfig, constants: Constants = Constants(C1=8.0, C2=4.0, C3=10.0, C4=10.0),
                      betas=(-0.5, -1.0, -2.0, -3.0)) -> dict[str, Any]:
    """Prop. 5.4: induction dominates (exp(C1) C3 >> exp(C2) C4). Heads are identified with this
    project's Alg. 3 (`juice.stage1.select_heads`) on toy scores (Alg. 2), once on conflict
    sequences only (as PH3 and the proposition identify "context heads") and once with the
    consistency filter over factual-recall and conflict sequences."""
    vocab = Vocabulary(cfg.n_subjects, cfg.n_noise)
    g = torch.Generator().manual_seed(cfg.seed)
    model = construct(vocab, cfg.d, cfg.seq_len, constants, seed=cfg.seed)
    head_set = knowledge_conflict(vocab, cfg.seq_len, 4, g)
    clean_set = factual_recall(vocab, cfg.seq_len, 4, g)
    test = knowledge_conflict(vocab, cfg.seq_len, cfg.n_eval, g)
    out: dict[str, Any] = {"constants": asdict(constants)}
    with torch.no_grad():
        out["original_factual"] = _accuracy(model(test.tokens), test.factual)
        out["original_inductive"] = _accuracy(model(test.tokens), test.inductive)
        for label, sets in (("conflict_only", {"conflict": head_set}),
                            ("consistency_filter", {"clean": clean_set, "conflict": head_set})):
            selection = select_heads(toy_head_scores(model, sets), k=2)
            heads = [h.layer for h in selection.negative]
            rows = {}
            for beta in betas:
                coeff = torch.zeros(2, dtype=torch.float64)
                coeff[heads] = beta
                rows[f"{beta:g}"] = {
                    "one_run": _accuracy(toy_june(model, test.tokens, coeff), test.factual),   # JuNE; PH3 at -1
                    "two_runs": _accuracy(toy_juice(model, test.tokens, coeff), test.factual),   # JuICE
                }
            out[label] = {"negative_heads": [str(Head(h, 0)) for h in heads],
                          "positive_heads": [str(h) for h in selection.positive], "factual_accuracy": rows}
    return out


def headline(name: str, r: dict[str, Any]) -> str:
    """One line summarising a result for the terminal."""
    if name == "construction":
        return f"factual recall accuracy {r['factual_recall_accuracy']:.3f}, induction accuracy {r['induction_accuracy']:.3f}"
    if name == "learning":
        lin, soft = r["linear_second_layer"], r["softmax_two_layer_adam"]
        ov, kq = lin["projections"]["W_OV"], lin["projections"]["W_KQ"]
        c1, c2 = kq["C1 phi'(q) phi(q)^T"], kq["C2 sum_s phi(s) phi(q)^T"]
        c3, c4 = ov["C3 sum_k mu(k) phi(k)^T"], ov["C4 sum_s mu(G*(s)) phi(s)^T"]
        return (f"GD loss {lin['loss_first']:.3f} -> {lin['loss_last']:.3f}, accuracy factual "
                f"{lin['factual_accuracy']:.2f} induction {lin['induction_accuracy']:.2f}; W_OV terms C3 {c3:.3f} "
                f"C4 {c4:.3f} vs other {ov['other terms, mean |.|']:.4f}; W_KQ C1 {c1:.3f} C2 {c2:.3f} vs other "
                f"{kq['other terms, mean |.|']:.4f}; softmax+Adam: factual {soft['factual_accuracy']:.2f} "
                f"induction {soft['induction_accuracy']:.2f}")
    if name == "conflict":
        return f"measured side agrees with exp(C1) C3 vs exp(C2) C4 in {r['agreement']:.0%} of {len(r['cells'])} cells"
    rows = r["conflict_only"]["factual_accuracy"]
    return (f"original factual {r['original_factual']:.2f}; heads {r['conflict_only']['negative_heads']}; "
            + "; ".join(f"beta {b}: JuNE/PH3 {v['one_run']:.2f} JuICE {v['two_runs']:.2f}" for b, v in rows.items()))
