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
    rows = [result("a", f"s{i}", "juice", True) for i in range(4)]
    rows += [result("a", f"s{i}", "original", i == 0) for i in range(4)]
    rows += [result("b", "t", "juice", False), result("b", "t", "original", False)]
    table = interval_table(rows, ["original", "juice"])
    juice, original = table.cells["juice"], table.cells["original"]
    assert juice["a"]["clean"] == bootstrap_interval([1, 1, 1, 1])
    assert juice["b"]["clean"].mean == 0.0
    # the paper's average over domains: (100% + 0%) / 2, not the pooled 80%; n counts every item
    assert (juice[AVERAGE]["clean"].mean, juice[AVERAGE]["clean"].n) == (0.5, 5)
    assert original[AVERAGE]["clean"].mean == pytest.approx((0.25 + 0.0) / 2)
    diff = table.differences["juice - original"]
    assert diff["a"]["clean"] == paired_difference_interval([1, 1, 1, 1], [1, 0, 0, 0])
    assert diff[AVERAGE]["clean"].mean == pytest.approx((0.75 + 0.0) / 2)
    assert list(table.differences) == ["juice - original"]


def test_keep_restricts_to_the_chosen_items_and_pairs_only_shared_items():
    rows = [result("a", "x", "juice", True), result("a", "y", "juice", False),
            result("a", "x", "original", False)]   # Original never ran on y
    table = interval_table(rows, ["original", "juice"])
    assert table.differences["juice - original"]["a"]["clean"].n == 1
    known = interval_table(rows, ["original", "juice"], keep=lambda r: r.subject == "y")
    assert known.cells["juice"]["a"]["clean"].n == 1 and known.cells["original"]["a"]["clean"].n == 0


def test_a_duplicate_item_is_an_error_not_an_overwrite():
    rows = [result("a", "x", "juice", True), result("a", "x", "juice", False)]
    with pytest.raises(ValueError, match="two results"):
        interval_table(rows, ["juice"])


def test_comparisons_focus_first_then_against_the_baseline():
    assert comparisons(["original", "prompt", "june", "juice"]) == [
        ("juice", "original"), ("juice", "prompt"), ("juice", "june"), ("prompt", "original"), ("june", "original")]


def test_a_table_is_keyed_by_rows_and_titled_where_it_is_shown():
    """Issue 91: results and tables carry the registry's row keys; `titled` names rows and paired
    differences by title (JuICE, PH3-l, "JuICE - Original") for what renders or records them, and
    leaves a label that is no row alone."""
    rows = [result("a", "x", "juice", True), result("a", "x", "original", False), result("a", "x", "ph3-l", True),
            result("a", "x", "Question-only", False)]
    table = interval_table(rows, ["original", "ph3-l", "Question-only", "juice"])
    shown = table.titled()
    assert list(shown.cells) == ["Original", "PH3-l", "Question-only", "JuICE"]
    assert list(shown.differences)[:2] == ["JuICE - Original", "JuICE - PH3-l"]
    assert shown.cells["JuICE"] is table.cells["juice"] and shown.to_json()["bootstrap"] == table.to_json()["bootstrap"]
