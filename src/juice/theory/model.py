"""The paper's two-layer attention-only transformer (Sec. 5 "Model Setup"; App. G.1).

`X <- X + W_OV X softmax(mask(X^T W_KQ X))` per layer, one head per layer, absolute positional
embeddings, residual stream, linear unembedding `W_lin = [mu(1), ..., mu(N)]`. Vectors are
rows here: a sequence is `[batch, T, d]`, and the attention score of key `k` for query `t` is
`x_k^T W_KQ x_t`, as in the paper.

The vocabulary is laid out as subjects S, answers A (G*(S_i) = A_i), the trigger/query token q,
and noise tokens N.
"""

from __future__ import annotations

from dataclasses import dataclass
import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class Vocabulary:
    """Token ids: subjects `0..n_subjects-1`, answers next, then q, then the noise tokens."""

    n_subjects: int
    n_noise: int

    @property
    def size(self) -> int:
        return 2 * self.n_subjects + 1 + self.n_noise

    @property
    def subjects(self) -> range:
        return range(0, self.n_subjects)

    @property
    def answers(self) -> range:
        return range(self.n_subjects, 2 * self.n_subjects)

    @property
    def q(self) -> int:
        return 2 * self.n_subjects

    @property
    def noise(self) -> range:
        return range(2 * self.n_subjects + 1, self.size)

    def answer_of(self, subject: Tensor | int):
        """G*: the bijection from subjects to answers."""
        return subject + self.n_subjects


def random_unit_vectors(n: int, d: int, generator: torch.Generator) -> Tensor:
    """`[n, d]` i.i.d. uniform on the unit sphere (Assumption 5.1: near-orthogonal for large d)."""
    v = torch.randn(n, d, generator=generator, dtype=torch.float64)
    return v / v.norm(dim=-1, keepdim=True)


class TwoLayerTransformer(nn.Module):
    """Two attention-only layers, one head each (paper Sec. 5).

    Attributes:
        embed: `[N, d]` token embeddings phi(i) (rows).
        pos: `[T, d]` positional embeddings p_t.
        unembed: `[N, d]` unembeddings mu(i) (rows of W_lin^T).
        w_kq, w_ov: per layer `[d, d]`.
        softmax: softmax attention (True) or the paper's linearized attention of Prop. 5.2,
            `sigma_j = (1 + x_j^T W_KQ x_t) / t` (uniform at zero initialisation).
    """

    def __init__(self, vocab: Vocabulary, d: int, seq_len: int, *, seed: int = 0, softmax: bool = True,
                 embed: Tensor | None = None, pos: Tensor | None = None, unembed: Tensor | None = None):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.vocab, self.d, self.seq_len, self.softmax = vocab, d, seq_len, softmax
        self.embed = nn.Parameter(embed if embed is not None else random_unit_vectors(vocab.size, d, g), requires_grad=False)
        self.pos = nn.Parameter(pos if pos is not None else random_unit_vectors(seq_len, d, g), requires_grad=False)
        self.unembed = nn.Parameter(unembed if unembed is not None else random_unit_vectors(vocab.size, d, g),
                                    requires_grad=False)
        self.w_kq = nn.ParameterList([nn.Parameter(torch.zeros(d, d, dtype=torch.float64)) for _ in range(2)])
        self.w_ov = nn.ParameterList([nn.Parameter(torch.zeros(d, d, dtype=torch.float64)) for _ in range(2)])

    # -- head interventions: `scales[l]` multiplies head l's output by (1 + alpha) -----------------

    def attention(self, layer: int, x: Tensor, last_only: bool = False) -> Tensor:
        """Head output of `layer`: `W_OV X sigma(mask(X^T W_KQ X))`, `[batch, T, d]` (or
        `[batch, 1, d]` for the last query position only)."""
        t = x.shape[1]
        queries = x[:, -1:] if last_only else x
        scores = queries @ self.w_kq[layer].T @ x.transpose(1, 2)   # [b, query, key]: x_k^T W_KQ x_q
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()[-queries.shape[1]:]
        if self.softmax:
            weights = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        else:
            counts = torch.arange(1, t + 1, dtype=x.dtype, device=x.device)[-queries.shape[1]:, None]
            weights = ((1 + scores) / counts).masked_fill(~causal, 0.0)
        return (weights @ x) @ self.w_ov[layer].T                  # W_OV sum_k w_qk x_k

    def forward(self, tokens: Tensor, *, scales: Tensor | None = None,
                additions: dict[int, Tensor] | None = None, capture: dict[int, Tensor] | None = None) -> Tensor:
        """Logits at the last position, `[batch, N]`.

        The second layer is computed at the last position only (all the logits need).

        Args:
            tokens: `[batch, T]` token ids.
            scales: `[batch, 2]` or `[2]` alphas: head l's output becomes `H + alpha * H`.
            additions: layer -> tensor added to that head's output (JuICE's run 2), shaped as
                `capture` returns it.
            capture: if given, filled with layer -> head output (JuICE's run 1): `[batch, T, d]`
                for layer 0, `[batch, 1, d]` for layer 1.
        """
        x = self.embed[tokens] + self.pos[: tokens.shape[1]]
        for layer in range(2):
            h = self.attention(layer, x, last_only=layer == 1)
            if scales is not None:
                a = scales[..., layer]
                h = h * (1 + (a[:, None, None] if a.dim() else a))
            if additions is not None and layer in additions:
                h = h + additions[layer]
            if capture is not None:
                capture[layer] = h.detach()
            x = x + h if layer == 0 else x[:, -1:] + h
        return x[:, -1] @ self.unembed.T
