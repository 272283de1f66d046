"""Property tests (hypothesis): answer normalization, exact match, the splits and the loaders never
crash on any input with anything but their documented errors."""

from __future__ import annotations

import json
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from juice.data.memotrap import MemoTrapFormatError, load_memotrap
from juice.data.nqswap import load_nqswap
from juice.data.paraconflict import build_domain, load_paraconflict_json
from juice.data.splits import split_test
from juice.data.metrics import is_correct
from juice.text import contains_answer, first_words, first_words_final, normalize_answer

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
text = st.text(max_size=60)
words = st.text(alphabet=st.characters(categories=("L", "N")), min_size=1, max_size=10)


@FAST
@given(text)
def test_normalization_is_idempotent_and_leaves_words_and_single_spaces(s):
    n = normalize_answer(s)
    assert normalize_answer(n) == n
    assert n == n.strip() and "  " not in n
    assert not re.search(r"[^\w ]|_", n)
    assert n == n.lower()


@FAST
@given(st.lists(words, min_size=1, max_size=4), text, text)
def test_an_answer_is_found_wherever_it_stands_between_non_words(answer_words, left, right):
    answer = " ".join(answer_words)
    if not normalize_answer(answer):
        return   # e.g. only articles: never matches, by design
    assert contains_answer(f"{left} {answer} {right}", [answer])
    assert contains_answer(f"({answer}).", [answer])


@FAST
@given(text, st.lists(text, max_size=3), st.integers(min_value=0, max_value=8))
def test_matching_never_crashes(prediction, answers, n):
    assert isinstance(contains_answer(prediction, answers), bool)
    assert len(first_words(prediction, n).split()) <= n


EXAMPLES = build_domain("world_capital")


@FAST
@given(st.integers(min_value=0, max_value=len(EXAMPLES)), st.integers(), st.floats(min_value=0, max_value=1))
def test_splits_are_disjoint_complete_and_seeded(n, seed, fraction):
    pool, test = split_test(EXAMPLES[:n], seed=seed, test_fraction=fraction)
    assert sorted(e.subject for e in pool + test) == sorted(e.subject for e in EXAMPLES[:n])
    assert not {e.subject for e in pool} & {e.subject for e in test}
    assert split_test(EXAMPLES[:n], seed=seed, test_fraction=fraction) == (pool, test)


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                           max_leaves=8)
row_keys = ["Subject", "Answer", "Answer_ns", "Distracted Token", "Clean Prompt", "Substitution Conflict",
            "Coherent Conflict"]
paraconflict_rows = st.lists(st.dictionaries(st.sampled_from(row_keys), json_values | st.text(max_size=12),
                                             max_size=7), max_size=3)


@FAST
@given(st.one_of(json_values, paraconflict_rows), st.binary(max_size=20))
def test_the_paraconflict_loader_raises_only_its_documented_errors(tmp_path_factory, data, garbage):
    folder = tmp_path_factory.mktemp("pc")
    for path, content in ((folder / "a.json", json.dumps(data).encode()), (folder / "b.json", garbage)):
        path.write_bytes(content)
        try:
            examples = load_paraconflict_json(path)
        except ValueError as err:
            assert str(path) in str(err)
        else:
            assert all(ex.answers and ex.prompts for ex in examples)


@FAST
@given(st.lists(st.one_of(json_values, st.dictionaries(
    st.sampled_from(["question", "sub_context", "sub_answer", "org_answer", "org_context"]),
    json_values | st.text(max_size=12), max_size=5)), max_size=3), st.binary(max_size=20))
def test_the_nqswap_loader_raises_only_its_documented_errors(tmp_path_factory, rows, garbage):
    folder = tmp_path_factory.mktemp("nq")
    lines = b"\n".join(json.dumps(r).encode() for r in rows) + b"\n" + garbage
    (folder / "nqswap.jsonl").write_bytes(lines)
    try:
        load_nqswap(folder / "nqswap.jsonl")
    except ValueError as err:
        assert "NQ-Swap" in str(err)


@FAST
@given(st.lists(st.lists(st.text(max_size=15), min_size=0, max_size=4), max_size=4), st.binary(max_size=20))
def test_the_memotrap_loader_raises_only_its_documented_errors(tmp_path_factory, rows, garbage):
    import csv
    import io

    folder = tmp_path_factory.mktemp("mt")
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["prompt", "classes", "answer_index"])
    writer.writerows(rows)
    path = folder / "1-proverb-ending.csv"
    path.write_bytes(buffer.getvalue().encode() + garbage)
    try:
        load_memotrap(path, "proverb_ending")
    except (MemoTrapFormatError, ValueError) as err:
        assert "proverb_ending" in str(err) or str(path) in str(err)


@FAST
@given(st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=9), st.lists(st.sampled_from([" ", "\n", "\t", "  ", "\u3000"]),
       min_size=9, max_size=9), text, st.lists(words, min_size=1, max_size=2))
def test_once_the_first_words_are_final_no_appended_text_changes_the_verdict(pieces, gaps, tail, answers):
    """Evaluation stops a row when `first_words_final` holds (juice.eval.runner.evaluate): then
    whatever the row would have decoded next cannot change its first five words or its verdict."""
    decoded = "".join(p + g for p, g in zip(pieces, gaps))[:-1] + pieces[-1][:1]
    if first_words_final(decoded):
        assert first_words(decoded + tail) == first_words(decoded)
        assert is_correct(decoded + tail, answers) == is_correct(decoded, answers)
    if "\ufffd" not in decoded and len(decoded.split()) >= 6:
        assert first_words_final(decoded)
