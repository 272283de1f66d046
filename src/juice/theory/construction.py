"""Prop. 5.1: weights that solve factual recall and induction at once (paper Eq. 2-4).

    W_KQ^(1) = C sum_t p_t p_{t+1}^T                      (attend to the previous position)
    W_OV^(1) = a random (orthogonal) matrix                 (phi'(i) = W_OV^(1) phi(i))
    W_KQ^(2) = C1 phi'(q) phi(q)^T + C2 sum_s phi(s) phi(q)^T
    W_OV^(2) = C3 sum_{k in N} mu(k) phi(k)^T + C4 sum_s mu(G*(s)) phi(s)^T

The second layer is a superposition: from the query q it attends to the token after an earlier
q (score C1, induction) and to any subject (score C2, factual recall), and it writes the
attended noise token (C3) or the subject's answer (C4).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from juice.theory.model import TwoLayerTransformer, Vocabulary


@dataclass(frozen=True)
class Constants:
    C: float = 20.0
    C1: float = 6.0
    C2: float = 6.0
    C3: float = 10.0
    C4: float = 10.0


def construct(vocab: Vocabulary, d: int = 512, seq_len: int = 12, constants: Constants = Constants(),
              seed: int = 0) -> TwoLayerTransformer:
    """Build the Prop. 5.1 transformer with random near-orthogonal embeddings (Assumption 5.1)."""
    model = TwoLayerTransformer(vocab, d, seq_len, seed=seed, softmax=True)
    g = torch.Generator().manual_seed(seed + 1)
    phi, p, mu = model.embed.data, model.pos.data, model.unembed.data
    ov1, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    c = constants
    with torch.no_grad():
        model.w_kq[0].copy_(c.C * p[:-1].T @ p[1:])                       # sum_t p_t p_{t+1}^T
        model.w_ov[0].copy_(ov1)
        phi_q = phi[vocab.q]
        subjects = list(vocab.subjects)
        model.w_kq[1].copy_(c.C1 * torch.outer(ov1 @ phi_q, phi_q)
                            + c.C2 * torch.outer(phi[subjects].sum(0), phi_q))
        noise, answers = list(vocab.noise), [vocab.answer_of(s) for s in subjects]
        model.w_ov[1].copy_(c.C3 * mu[noise].T @ phi[noise] + c.C4 * mu[answers].T @ phi[subjects])
    return model


def predicted_factual(constants: Constants) -> bool:
    """Corollary 5.3: factual answer iff exp(C1) C3 < exp(C2) C4."""
    import math

    return math.exp(constants.C1) * constants.C3 < math.exp(constants.C2) * constants.C4
