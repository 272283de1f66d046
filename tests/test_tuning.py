"""Beta tuning: the grid, the objective and the tie-break (paper App. D.1)."""

from __future__ import annotations

from juice.eval.runner import ItemResult
from juice.eval.tuning import GridSetting, grid_name, grid_points


def _r(method, t, correct, p):
    return ItemResult("d", "s", t, method, "", correct, False, p, 0.0)


def test_grid_points_average_over_conflict_types_and_keep_the_tie_break():
    a, b = grid_name("juice", 1, -1), grid_name("juice", 2, 0)
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

    best_of = {"A": grid_name("juice", 1, 0), "B": grid_name("juice", 3, -2)}

    def fake_run(lm, items, steerings, direction, conflict_types, max_rows, on_progress):
        out = []
        for ex in items:
            for t in conflict_types:
                for name in steerings:
                    method = name.split(":")[0]
                    right = name == best_of[ex.domain] or (method == "june" and name == grid_name("june", 2, -1))
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
