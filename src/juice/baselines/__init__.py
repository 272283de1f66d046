"""The paper's baselines (Sec. 4.1-4.2): Prompt, PH3 (Jin et al. 2024) and CAD (Shi et al. 2023);
the adaptive decoders beside them (AdaCAD, CK-PLUG); and TriState-Bench's (CoCoA, COIECD and
its own GRD, :mod:`juice.data.tristate`)."""
