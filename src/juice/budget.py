"""How many batch rows fit a memory budget (`--max-rows auto`).

Every hot path here puts interventions or streams in the batch dimension, so peak memory grows
with rows x sequence length. The estimate per row is deliberately simple and conservative:

- transient activations of one decoder layer, kept alive together during its forward: the
  residual stream and its normed copy, queries, keys, values and the attention output
  (about 6 x hidden), the MLP's gate, up and activated intermediate (3 x intermediate), and the
  attention scores and probabilities (2 x heads x sequence);
- the KV cache of every layer (2 x KV heads x head_dim per token per layer);
- last-position logits with their softmax and one temporary (3 x the vocabulary): for a
  262k-word vocabulary and short prompts this is the largest term.

All in the model's dtype. The budget defaults to a fraction of the memory the device reports free
(`torch.cuda.mem_get_info` on a GPU, `MemAvailable` of /proc/meminfo on a CPU).
"""

from __future__ import annotations

from pathlib import Path

import torch

from juice.models import LoadedModel

DEFAULT_FRACTION = 0.25
MAX_AUTO_ROWS = 512


def row_bytes(config, seq_len: int, dtype: torch.dtype = torch.float32, *, kv_cache: bool = True) -> int:
    """Estimated peak bytes one batch row of `seq_len` tokens adds (module docstring).

    Args:
        config: a transformers config (text part used).
        seq_len: tokens per row (prompt plus new tokens).
    """
    text = config.get_text_config()
    d = int(getattr(text, "hidden_size", None) or getattr(text, "n_embd"))
    n_heads = int(getattr(text, "num_attention_heads", None) or getattr(text, "n_head"))
    kv_heads = int(getattr(text, "num_key_value_heads", None) or n_heads)
    head_dim = int(getattr(text, "head_dim", None) or d // n_heads)
    ffn = int(getattr(text, "intermediate_size", None) or getattr(text, "n_inner", None) or 4 * d)
    n_layers = int(getattr(text, "num_hidden_layers", None) or getattr(text, "n_layer"))
    vocab = int(text.vocab_size)
    size = torch.empty((), dtype=dtype).element_size()
    per_token = 6 * d + 3 * ffn + 2 * n_heads * seq_len
    cache = n_layers * 2 * kv_heads * head_dim if kv_cache else 0
    return size * (seq_len * (per_token + cache) + 3 * vocab)


def available_bytes(device: torch.device) -> int:
    """Free memory the device reports: CUDA's free bytes, or MemAvailable on Linux CPUs
    (4 GiB when neither can be read)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 4 << 30


def auto_max_rows(
    lm: LoadedModel, seq_len: int, *, budget_bytes: int | None = None, fraction: float = DEFAULT_FRACTION,
    cap: int = MAX_AUTO_ROWS,
) -> int:
    """Most batch rows of `seq_len` tokens that fit `budget_bytes` (default: `fraction` of the
    device's free memory), at least 1 and at most `cap`.

    Raises:
        ValueError: seq_len < 1 or a non-positive budget.
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    if budget_bytes is None:
        budget_bytes = int(fraction * available_bytes(lm.device))
    if budget_bytes <= 0:
        raise ValueError(f"the memory budget must be positive, got {budget_bytes}")
    per_row = row_bytes(lm.config, seq_len, lm.dtype)
    return max(1, min(cap, budget_bytes // per_row))


def resolve_max_rows(value: int | str, lm: LoadedModel, seq_len: int) -> int:
    """`value` as a row count: an int is kept, "auto" is :func:`auto_max_rows`.

    Raises:
        ValueError: neither a positive int nor "auto".
    """
    if isinstance(value, str):
        if value == "auto":
            return auto_max_rows(lm, seq_len)
        if not value.isdigit():
            raise ValueError(f"max rows must be a positive integer or 'auto', not {value!r}")
        value = int(value)
    if value < 1:
        raise ValueError(f"max rows must be >= 1, got {value}")
    return value
