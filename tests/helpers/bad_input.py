"""What the bad-input tests write: a heads file for another model, and any file."""

from __future__ import annotations

HEADS = {"format": "juice-heads/1", "model": {"name": "other", "model_type": "llama", "n_layers": 3, "n_heads": 4,
                                               "head_dim": 8, "vocab_size": 160, "weights_sha256_16": "0" * 16},
         "direction": "parametric", "k": 1, "alphas_positive": [1.0], "alphas_negative": [-1.0],
         "positive_heads": ["L0H0"], "negative_heads": ["L1H1"]}
"""A heads file's JSON made for another model ('other', 3 layers x 4 heads)."""


def write(path, text):
    """Write `text` to `path`, making its folder; return `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
