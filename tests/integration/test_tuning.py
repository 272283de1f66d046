"""Beta tuning: the grid, the objective and the tie-break (paper App. D.1)."""

from __future__ import annotations

import torch

from juice.eval.runner import ItemResult
from juice.eval.tuning import GridSetting, grid_points


def _r(method, t, correct, p):
    return ItemResult("d", "s", t, method, "", correct, False, p, 0.0)


def test_grid_points_average_over_conflict_types_and_keep_the_tie_break():
    a, b = GridSetting("juice", 1, -1).label, GridSetting("juice", 2, 0).label
    results = [
        _r(a, "clean", True, 0.5), _r(a, "clean", True, 0.5), _r(a, "coherent", False, 0.1), _r(a, "coherent", True, 0.1),
        _r(b, "clean", True, 0.9), _r(b, "clean", False, 0.9), _r(b, "coherent", True, 0.9), _r(b, "coherent", True, 0.9),
    ]
    pa, pb = grid_points(results, ("clean", "coherent"), settings=[GridSetting("juice", 1, -1), GridSetting("juice", 2, 0)])
    assert (pa.beta_plus, pa.beta_minus) == (1.0, -1.0)
    assert pa.accuracy == 75.0 and pb.accuracy == 75.0 and pa.per_type == (100.0, 50.0)
    assert max((pa, pb), key=lambda g: g.key) is pb   # same accuracy: higher answer probability wins


def test_per_domain_tuning_picks_each_domains_betas_from_its_own_validation_only(tiny_llama, monkeypatch):
    """A synthetic case: in domain A only JuICE (1, 0) is ever right, in domain B only (3, -2);
    each domain must get its own best point, never the other's or the pooled one."""
    import juice.eval.tuning as tuning
    from juice.data.records import CONFLICT_TYPES
    from juice.interventions import HeadSelection
    from juice.interventions import Head

    best_of = {"A": GridSetting("juice", 1, 0).label, "B": GridSetting("juice", 3, -2).label}

    def fake_run(lm, items, steerings, direction, conflict_types, max_rows, on_progress, engine, checkpoint):
        out = []
        for ex in items:
            for t in conflict_types:
                for name in steerings:
                    method = name.split(":")[0]
                    right = name == best_of[ex.domain] or (method == "june" and name == GridSetting("june", 2, -1).label)
                    out.append(ItemResult(ex.domain, ex.subject, t, name, "", right, False, 0.5, 0.0))
        return out

    monkeypatch.setattr(tuning, "_run", fake_run)
    validation = {d: [type("Ex", (), {"domain": d, "subject": f"{d}{i}"})() for i in range(n)]
                  for d, n in (("A", 2), ("B", 3), ("C", 0))}
    sel = HeadSelection((Head(0, 0),), (Head(1, 1),))
    choices = tuning.tune_per_domain(tiny_llama, validation, sel, conflict_types=CONFLICT_TYPES)
    assert set(choices) == {"A", "B"}   # C has no validation items: no choice of its own
    assert (choices["A"].betas["juice"].beta_plus, choices["A"].betas["juice"].beta_minus) == (1.0, 0.0)
    assert (choices["B"].betas["juice"].beta_plus, choices["B"].betas["juice"].beta_minus) == (3.0, -2.0)
    assert choices["A"].betas["juice"].accuracy == 100.0 and choices["B"].n_validation == 3
    assert (choices["A"].betas["june"].beta_plus, choices["A"].betas["june"].beta_minus) == (2.0, -1.0)


def test_a_degeneration_margin_refuses_the_most_accurate_setting_when_it_breaks_the_text(tiny_llama, monkeypatch):
    """Issue 49: JuICE (5, 0) is the most accurate on validation but half its outputs repeat
    themselves; (2, 0) is less accurate and fluent. The paper's criterion (no margin) takes (5, 0);
    a margin of 10 points over Original's (the (0, 0) point: 0% degenerate) takes (2, 0); the
    refused setting's degeneration is what the choice records. PH3's k obeys the same rule."""
    import pytest

    import juice.eval.tuning as tuning
    from juice.baselines.ph3 import Ph3Scores
    from juice.interventions import Head, HeadSelection

    broken, fluent = GridSetting("juice", 5, 0).label, GridSetting("juice", 2, 0).label

    def fake_run(lm, items, steerings, direction, conflict_types, max_rows, on_progress, engine, checkpoint):
        out = []
        for ex in items:
            for t in conflict_types:
                for name in steerings:
                    k = int(ex.subject[1:])
                    right = name in (broken, "PH3-l:k=9") or (name in (fluent, "PH3-l:k=3") and k % 4 != 0)
                    text = " Paris, Paris, Paris, Paris" if name in (broken, "PH3-l:k=9") and k % 2 else " Paris."
                    out.append(ItemResult(ex.domain, ex.subject, t, name, text, right, False, 0.5, 0.0))
        return out

    monkeypatch.setattr(tuning, "_run", fake_run)
    g = tiny_llama.heads.geometry
    ph3 = {"PH3-l": Ph3Scores(torch.randn(g.n_layers, g.n_heads), torch.zeros(1))}
    validation = {"A": [type("Ex", (), {"domain": "A", "subject": f"s{i}"})() for i in range(8)]}
    sel = HeadSelection((Head(0, 0),), (Head(1, 1),))
    paper = tuning.tune_per_domain(tiny_llama, validation, sel, ph3, methods=("juice",))["A"]
    assert (paper.betas["juice"].beta_plus, paper.betas["juice"].degeneration) == (5.0, 50.0)
    assert paper.prune["PH3-l"].k == 9
    margin = tuning.tune_per_domain(tiny_llama, validation, sel, ph3, methods=("juice",), degeneration_margin=10)["A"]
    assert (margin.betas["juice"].beta_plus, margin.betas["juice"].degeneration) == (2.0, 0.0)
    assert margin.prune["PH3-l"].k == 3
    with pytest.raises(ValueError, match="margin"):
        tuning.tune_per_domain(tiny_llama, validation, sel, methods=("juice",), degeneration_margin=10,
                               beta_plus_grid=(1.0, 2.0))
