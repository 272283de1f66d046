"""juice's one request protocol (:mod:`juice.steering_request`): the fields, their defaults and
their errors, and `juice serve` answering the table of request bodies (tests/helpers/request_protocol.py)
that `juice serve --engine vllm` must answer alike (tests/integration/test_vllm.py)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, strategies as st

from conftest import build_tiny
from juice.architectures import HeadGeometry
from juice.interventions import Head
from juice.steering import JuICE, JuNE, Prune
from juice.steering_request import (MAX_ABS_BETA, ServedHeads, SteeringAsk, SteeringRequestError, parse_spec,
                                    read_steering)
from helpers.request_protocol import (BODIES, CONTEXTUAL, PARAMETRIC, TUNED_PARAMETRIC, answers, check_table,
                                      serving, write_heads_files)

GEOMETRY = HeadGeometry(4, 4, 8)
TWO = ServedHeads({"parametric": PARAMETRIC, "contextual": CONTEXTUAL},
                  {"parametric": TUNED_PARAMETRIC, "contextual": {}}, geometry=GEOMETRY)


def test_defaults_fill_in_from_the_heads_files():
    assert read_steering(None, TWO) == SteeringAsk("original")
    assert read_steering({}, TWO) == SteeringAsk("original")
    june = read_steering({"direction": "memory"}, TWO)   # the tuned method and betas, no warning
    assert (june.method, june.direction, june.beta_plus, june.beta_minus, june.warning) == (
        "june", "parametric", 3.0, -0.5, None)
    untuned = read_steering({"direction": "Context"}, TWO)
    assert (untuned.method, untuned.beta_plus, untuned.beta_minus) == ("juice", 2.0, 0.0)
    assert "juice tune" in untuned.warning
    assert read_steering({"method": "ph3", "heads": "L1H1 L2H0"}, TWO).heads == (Head(1, 1), Head(2, 0))


def test_a_request_without_the_field_gets_the_default_then_the_only_tuned_file_then_original():
    only_tuned = ServedHeads({"parametric": PARAMETRIC}, {"parametric": TUNED_PARAMETRIC})
    assert read_steering(None, only_tuned).method == "june"
    only_untuned = ServedHeads({"contextual": CONTEXTUAL}, {"contextual": {}})
    assert read_steering(None, only_untuned).method == "original"
    operator = ServedHeads({"contextual": CONTEXTUAL}, {"contextual": {}},
                           default=parse_spec("method:juice,beta_plus:1,beta_minus:-1"))
    ask = read_steering(None, operator)
    assert (ask.method, ask.beta_plus, ask.beta_minus, ask.warning) == ("juice", 1.0, -1.0, None)
    assert read_steering({"method": "original"}, operator).method == "original"   # the request's own field wins
    assert read_steering(None, ServedHeads()).method == "original"
    with pytest.raises(SteeringRequestError, match="no heads for direction 'contextual'; this server has none"):
        read_steering({"direction": "context"}, ServedHeads())
    with pytest.raises(SteeringRequestError, match="say juice.direction: this server has heads for no direction"):
        read_steering({"method": "juice"}, ServedHeads())


def test_the_steering_equals_the_library_presets():
    ask = read_steering({"method": "juice", "direction": "parametric", "beta_plus": 1.5, "beta_minus": -1}, TWO)
    assert torch.equal(ask.steering(GEOMETRY, TWO).coefficients, JuICE(GEOMETRY, PARAMETRIC, 1.5, -1).coefficients)
    ask = read_steering({"method": "june", "direction": "parametric"}, TWO)
    assert torch.equal(ask.steering(GEOMETRY, TWO).coefficients, JuNE(GEOMETRY, PARAMETRIC, 3.0, -0.5).coefficients)
    assert ask.steering(GEOMETRY, TWO).kind == "scale"
    ask = read_steering({"method": "ph3", "heads": ["L1H1", "L2H0"]}, TWO)
    prune = ask.steering(GEOMETRY, TWO)
    assert prune.kind == "scale" and torch.equal(prune.coefficients,
                                                  Prune(GEOMETRY, [Head(1, 1), Head(2, 0)]).coefficients)
    assert read_steering({"method": "original"}, TWO).steering(GEOMETRY, TWO).kind == "none"


@pytest.mark.parametrize("label, juice, status, piece, warns", [b for b in BODIES if b[2] == 400],
                         ids=[b[0] for b in BODIES if b[2] == 400])
def test_every_refusal_of_the_table_is_one_line(label, juice, status, piece, warns):
    with pytest.raises(SteeringRequestError) as err:
        read_steering(juice, TWO)
    assert piece in str(err.value) and "\n" not in str(err.value)


@given(st.one_of(st.booleans(), st.text(max_size=5), st.floats(allow_nan=True), st.none(), st.integers()))
def test_a_beta_is_a_finite_number_within_the_bound_or_refused(value):
    fields = {"method": "june", "direction": "context", "beta_plus": value}
    ok = value is None or (not isinstance(value, (bool, str)) and abs(value) <= MAX_ABS_BETA)
    if ok:
        assert read_steering(fields, TWO).beta_plus == (2.0 if value is None else float(value))
    else:
        with pytest.raises(SteeringRequestError, match="juice.beta_plus must be"):
            read_steering(fields, TWO)


def test_parse_spec_reads_betas_as_numbers_and_heads_as_a_list():
    assert parse_spec("method:ph3,heads:L1H1 L2H0") == {"method": "ph3", "heads": ["L1H1", "L2H0"]}
    assert parse_spec("method:juice,beta_plus:2") == {"method": "juice", "beta_plus": 2.0}
    with pytest.raises(ValueError, match="beta_plus must be a number"):
        parse_spec("beta_plus:x")


@pytest.mark.integration
def test_juice_serve_answers_the_protocol_table(tmp_path):
    from juice.apps.server import create_app
    from juice.stage1 import load_heads
    from juice.tokens import token_ids

    lm = build_tiny("llama")
    files = write_heads_files(tmp_path, lm.fingerprint())
    app = create_app(lm, [load_heads(f, lm) for f in files], model_name="tiny")
    with serving(app) as base:
        got = answers(base, "tiny", token_ids(lm.tokenizer, "the capital of france is"))
    check_table(got)


def test_a_beta_outside_the_tuned_range_is_served_with_a_warning_naming_the_range():
    """Issue 92: `beta_plus: -5` toward memory is inside the protocol's bound (|beta| <= 100) but
    outside the betas the heads file was tuned over; it is served, with one line that says so."""
    ask = read_steering({"method": "june", "direction": "memory", "beta_plus": -5, "beta_minus": 1}, TWO)
    assert (ask.beta_plus, ask.beta_minus) == (-5.0, 1.0)
    assert ask.warning == ("june with beta_plus=-5 and beta_minus=1, outside the range the heads file was tuned "
                           "over (beta_plus 0..5, beta_minus -3..0): untested there, the text may not be an answer")
    assert read_steering({"method": "june", "direction": "memory", "beta_plus": 0, "beta_minus": -3}, TWO).warning is None
    # a file that records no range (no grid, no beta_range) is compared with nothing
    bare = ServedHeads({"parametric": PARAMETRIC}, {"parametric": {"june": {"beta_plus": 3.0, "beta_minus": -0.5}}})
    assert read_steering({"method": "june", "beta_plus": -5}, bare).warning is None


@pytest.mark.parametrize("value", [None, {"method": "original"}, {"method": "JuICE", "direction": "context"},
                                   {"method": "june", "direction": "parametric"}, {"direction": "memory"},
                                   {"method": "ph3", "heads": "L1H1"},
                                   {"method": "june", "heads": {"L1H1": 1.0}}])
def test_a_request_finds_its_method_once_and_builds_with_that_entry(value, monkeypatch):
    """Issue 91: a method's name is read where the request enters: the parse finds its registry
    entry once, and building the steering uses that entry (no second lookup, no listing of the
    registry on a request that is right)."""
    from juice.methods import Registry

    calls = []
    for name in ("find", "__getitem__", "values", "items", "__iter__"):
        real = getattr(Registry, name)
        monkeypatch.setattr(Registry, name, lambda self, *a, _real=real, _name=name: calls.append(_name)
                            or _real(self, *a))
    ask = read_steering(value, TWO)
    ask.steering(GEOMETRY, TWO)
    assert calls in (["find"], ["__getitem__"]), calls   # by the request's name, or the heads file's tuned one
