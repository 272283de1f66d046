"""The paper's toy tasks (Sec. 5 "Task Setup", App. G.1), sampled as its enumerations say.

Positions below are 1-indexed in the docstrings (as in the paper) and 0-indexed in the code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from juice.theory.model import Vocabulary


@dataclass
class TaskBatch:
    """Sequences `tokens [n, T]` with the factual answer and the inductive answer per row
    (-1 where a task has none)."""

    tokens: Tensor
    factual: Tensor
    inductive: Tensor


def _noise(vocab: Vocabulary, n: int, exclude: int | None, g: torch.Generator) -> Tensor:
    pool = torch.tensor([t for t in vocab.noise if t != exclude])
    return pool[torch.randperm(len(pool), generator=g)[:n]]


def factual_recall(vocab: Vocabulary, seq_len: int, n: int, g: torch.Generator) -> TaskBatch:
    """1. s ~ S and i ~ [T-1] uniformly, z_i = s; 2. the other z_k (k < T) from N without
    replacement; 3. z_T = q, target G*(s)."""
    tokens = torch.empty(n, seq_len, dtype=torch.long)
    subjects = torch.randint(vocab.n_subjects, (n,), generator=g)
    for r in range(n):
        i = int(torch.randint(seq_len - 1, (1,), generator=g))
        row = _noise(vocab, seq_len - 1, None, g)
        row[i] = subjects[r]
        tokens[r, :-1], tokens[r, -1] = row, vocab.q
    return TaskBatch(tokens, vocab.answer_of(subjects), torch.full((n,), -1))


def _induction_positions(seq_len: int, g: torch.Generator) -> int:
    # j ~ [T-2] \ {1} (1-indexed) -> 0-indexed 1 .. T-3
    return 1 + int(torch.randint(seq_len - 3, (1,), generator=g))


def induction(vocab: Vocabulary, seq_len: int, n: int, g: torch.Generator) -> TaskBatch:
    """1. j ~ [T-2] \\ {1}, z_j = q, z_{j+1} = b ~ N; 2. the other tokens from N \\ {b} without
    replacement; 3. z_T = q, target b."""
    tokens = torch.empty(n, seq_len, dtype=torch.long)
    targets = torch.empty(n, dtype=torch.long)
    noise = torch.tensor(list(vocab.noise))
    for r in range(n):
        j = _induction_positions(seq_len, g)
        b = int(noise[torch.randint(len(noise), (1,), generator=g)])
        row = _noise(vocab, seq_len, b, g)
        row[j], row[j + 1], row[-1] = vocab.q, b, vocab.q
        tokens[r], targets[r] = row, b
    return TaskBatch(tokens, torch.full((n,), -1), targets)


def knowledge_conflict(vocab: Vocabulary, seq_len: int, n: int, g: torch.Generator) -> TaskBatch:
    """1. j ~ [T-2] \\ {1}, z_j = q, z_{j+1} = b ~ N; 2. i ~ [T-1] \\ {j, j+1}, s ~ S, z_i = s;
    3. z_T = q. Both answers recorded: factual G*(s), inductive b."""
    tokens = torch.empty(n, seq_len, dtype=torch.long)
    factual = torch.empty(n, dtype=torch.long)
    inductive = torch.empty(n, dtype=torch.long)
    noise = torch.tensor(list(vocab.noise))
    for r in range(n):
        j = _induction_positions(seq_len, g)
        b = int(noise[torch.randint(len(noise), (1,), generator=g)])
        free = [k for k in range(seq_len - 1) if k not in (j, j + 1)]
        i = free[int(torch.randint(len(free), (1,), generator=g))]
        s = int(torch.randint(vocab.n_subjects, (1,), generator=g))
        row = _noise(vocab, seq_len, b, g)
        row[j], row[j + 1], row[i], row[-1] = vocab.q, b, s, vocab.q
        tokens[r], factual[r], inductive[r] = row, vocab.answer_of(s), b
    return TaskBatch(tokens, factual, inductive)
