"""Beta tuning: the grid, the objective and the tie-break (paper App. D.1)."""

from __future__ import annotations

from juice.evaluation import ItemResult
from juice.tuning import grid_name, grid_points


def _r(method, t, correct, p):
    return ItemResult("d", "s", t, method, "", correct, False, p, 0.0)


def test_grid_points_average_over_conflict_types_and_keep_the_tie_break():
    a, b = grid_name("juice", 1, -1), grid_name("juice", 2, 0)
    results = [
        _r(a, "clean", True, 0.5), _r(a, "clean", True, 0.5), _r(a, "coherent", False, 0.1), _r(a, "coherent", True, 0.1),
        _r(b, "clean", True, 0.9), _r(b, "clean", False, 0.9), _r(b, "coherent", True, 0.9), _r(b, "coherent", True, 0.9),
    ]
    pa, pb = grid_points(results, ("clean", "coherent"))
    assert (pa.beta_plus, pa.beta_minus) == (1.0, -1.0)
    assert pa.accuracy == 75.0 and pb.accuracy == 75.0 and pa.per_type == (100.0, 50.0)
    assert max((pa, pb), key=lambda g: g.key) is pb   # same accuracy: higher answer probability wins
