"""A study's outcomes (:mod:`juice.when_to_steer.outcomes`): what the offline analyses read."""

from __future__ import annotations

from helpers.outcomes import synthetic


def test_outcomes_survive_json_and_select_by_half():
    from juice.when_to_steer.outcomes import Outcomes

    o = synthetic()
    again = Outcomes.from_json(o.to_json())
    assert again.verdicts == o.verdicts and again.half == o.half and again.betas == o.betas
    assert again.signal == [round(x, 7) for x in o.signal]
    test = o.where(half="test")
    assert set(test.half) == {"test"} and len(test) == len(o) // 2
    assert Outcomes.concatenate([o.where(half="validation"), test]).verdicts["use"]["original"] == \
        [*o.where(half="validation").verdicts["use"]["original"], *test.verdicts["use"]["original"]]


def test_a_question_is_known_where_the_question_alone_states_the_true_answer():
    o = synthetic(right=lambda m, s, q, t: q % 3 == 0)
    known = o.known()
    assert known == [int(q) % 3 == 0 for q in o.question]
    assert any(known) and not all(known)


def _write_halves(folder, o, decoding):
    import json

    from juice.when_to_steer.outcomes import HALVES, half_to_json

    folder.mkdir(parents=True, exist_ok=True)
    for half in HALVES:
        d = decoding(half) if callable(decoding) else decoding
        (folder / f"outcomes-{half}.json").write_text(json.dumps(half_to_json(o.where(half=half), d)), encoding="utf-8")


def test_two_halves_decoded_apart_join_into_the_outcomes_one_run_writes(tmp_path):
    """A study decoded a half at a time is analyzed as if one run had decoded both: the joined
    halves hold what `outcomes.json` holds, with the same SHA-256 (a record's `outcomes_sha256`)."""
    from juice.io import write_json_atomic
    from juice.when_to_steer.outcomes import Outcomes, outcomes_sha256, read_outcomes

    o = synthetic(half_of=lambda q: "validation" if q < 7 else "test")
    whole = Outcomes.concatenate([o.where(half="validation"), o.where(half="test")])
    write_json_atomic(tmp_path / "one" / "outcomes.json", whole.to_json())
    _write_halves(tmp_path / "two", o, {"code": "abc", "model": "m", "settings": "s"})
    one, two = read_outcomes(tmp_path / "one"), read_outcomes(tmp_path / "two")
    assert two.to_json() == one.to_json() and two.half[0] == "validation" and two.half[-1] == "test"
    import hashlib

    assert outcomes_sha256(two) == hashlib.sha256((tmp_path / "one" / "outcomes.json").read_bytes()).hexdigest()


def test_halves_decoded_by_different_code_or_only_one_half_are_refused(tmp_path):
    import pytest

    from juice.when_to_steer.outcomes import half_to_json, read_outcomes

    o = synthetic()
    _write_halves(tmp_path / "mixed", o, lambda half: {"code": half, "model": "m", "settings": "s"})
    with pytest.raises(ValueError, match="different code"):
        read_outcomes(tmp_path / "mixed")
    _write_halves(tmp_path / "one", o, {"code": "abc"})
    (tmp_path / "one" / "outcomes-test.json").unlink()
    with pytest.raises(FileNotFoundError, match="outcomes-test.json"):
        read_outcomes(tmp_path / "one")
    with pytest.raises(ValueError, match="one half"):
        half_to_json(o, {"code": "abc"})
    (tmp_path / "one" / "outcomes-test.json").write_text(
        (tmp_path / "one" / "outcomes-validation.json").read_text(encoding="utf-8"), encoding="utf-8")
    with pytest.raises(ValueError, match="not the test half"):
        read_outcomes(tmp_path / "one")
