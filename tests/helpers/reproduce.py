"""The tiny Table 1 run that `juice reproduce --engine vllm`'s tests share."""

from __future__ import annotations

TINY = dict(limit=2, validation_size=2, filter=False, alphas_positive=(1.0, 3.0), alphas_negative=(-1.0,), k=2,
            ph3_dev_size=3, bootstrap_resamples=1000, domains=("world_capital", "athlete_sport"))
"""A Table 1 that runs every stage in seconds on the tiny model: two domains, two test items each."""
