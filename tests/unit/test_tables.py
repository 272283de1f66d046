"""Result tables: cells per domain and conflict type, the "Average" as the mean of the domains'
accuracies, paired differences over the same items, and bad input."""

from __future__ import annotations

import pytest

from juice.eval.runner import ItemResult
from juice.eval.stats import bootstrap_interval, paired_difference_interval
from juice.eval.tables import AVERAGE, comparisons, interval_table


def result(domain: str, subject: str, method: str, correct: bool, conflict_type: str = "clean") -> ItemResult:
    return ItemResult(domain, subject, conflict_type, method, "", correct, False, 0.0, 0.0)


def test_cells_differences_and_the_average_of_domains_of_different_sizes():
    # domain a: 4 items, JuICE right on all, Original on 1; domain b: 1 item, both wrong
    rows = [result("a", f"s{i}", "JuICE", True) for i in range(4)]
    rows += [result("a", f"s{i}", "Original", i == 0) for i in range(4)]
    rows += [result("b", "t", "JuICE", False), result("b", "t", "Original", False)]
    table = interval_table(rows, ["Original", "JuICE"])
    juice, original = table.cells["JuICE"], table.cells["Original"]
    assert juice["a"]["clean"] == bootstrap_interval([1, 1, 1, 1])
    assert juice["b"]["clean"].mean == 0.0
    # the paper's average over domains: (100% + 0%) / 2, not the pooled 80%; n counts every item
    assert (juice[AVERAGE]["clean"].mean, juice[AVERAGE]["clean"].n) == (0.5, 5)
    assert original[AVERAGE]["clean"].mean == pytest.approx((0.25 + 0.0) / 2)
    diff = table.differences["JuICE - Original"]
    assert diff["a"]["clean"] == paired_difference_interval([1, 1, 1, 1], [1, 0, 0, 0])
    assert diff[AVERAGE]["clean"].mean == pytest.approx((0.75 + 0.0) / 2)
    assert list(table.differences) == ["JuICE - Original"]


def test_keep_restricts_to_the_chosen_items_and_pairs_only_shared_items():
    rows = [result("a", "x", "JuICE", True), result("a", "y", "JuICE", False),
            result("a", "x", "Original", False)]   # Original never ran on y
    table = interval_table(rows, ["Original", "JuICE"])
    assert table.differences["JuICE - Original"]["a"]["clean"].n == 1
    known = interval_table(rows, ["Original", "JuICE"], keep=lambda r: r.subject == "y")
    assert known.cells["JuICE"]["a"]["clean"].n == 1 and known.cells["Original"]["a"]["clean"].n == 0


def test_a_duplicate_item_is_an_error_not_an_overwrite():
    rows = [result("a", "x", "JuICE", True), result("a", "x", "JuICE", False)]
    with pytest.raises(ValueError, match="two results"):
        interval_table(rows, ["JuICE"])


def test_comparisons_focus_first_then_against_the_baseline():
    assert comparisons(["Original", "Prompt", "JuNE", "JuICE"]) == [
        ("JuICE", "Original"), ("JuICE", "Prompt"), ("JuICE", "JuNE"), ("Prompt", "Original"), ("JuNE", "Original")]
