"""The paper's baselines (Sec. 4.1-4.2): Prompt, PH3 (Jin et al. 2024) and CAD (Shi et al. 2023)."""
