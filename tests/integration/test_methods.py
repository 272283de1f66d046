"""The method registry: one table the Steerer, `juice evaluate` (rows and contexts), `juice tune`,
the tables and the request protocol read; building a method = the presets it names; adding a
method is one entry."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import juice
from juice import methods
from juice.methods import REGISTRY, MethodInputs, MethodSpec, build, lookup
from juice.stage1 import HeadsArtifact
from juice.steering import DEFAULT_BETAS, JuICE, JuNE, Prune, UntunedBetasWarning
from juice.tuned import TunedSettings

SEL = juice.HeadSelection((juice.Head(1, 2),), (juice.Head(0, 1),))


def artifact(tuned: dict | None = None, direction: str = "contextual") -> HeadsArtifact:
    return HeadsArtifact({}, direction, 1, [1.0], [-1.0], SEL, tuned=TunedSettings(tuned))


def test_names_aliases_and_the_request_protocol_come_from_the_table():
    assert lookup("JuICE").name == "juice" and lookup(" prune ").name == "ph3"
    with pytest.raises(ValueError, match="unknown method 'both'; choose from original, prompt"):
        lookup("both")
    with pytest.raises(ValueError, match="choose from juice, june$"):
        lookup("auto", ("juice", "june"))
    from juice import steerer, steering_request

    assert steering_request.METHODS == ("original", "prune", "june", "juice", "auto")   # table order
    assert steerer.METHODS == ("original", "june", "juice", "auto")
    assert methods.names(tune=True) == ("ph3", "june", "juice")
    assert methods.TUNED_STEERINGS == ("juice", "june")
    assert [s.title for s in REGISTRY.values()] == ["Original", "Prompt", "CAD", "AdaCAD", "CK-PLUG", "PH3", "JuNE",
                                                   "JuICE", "auto"]


def test_building_a_method_is_the_preset_it_names(tiny_llama):
    x = MethodInputs(tiny_llama, SEL, TunedSettings({"juice": {"beta_plus": 3.0, "beta_minus": -1.0}}))
    built = build("juice", x)
    assert built.settings == {"beta_plus": 3.0, "beta_minus": -1.0, "source": "tuned"} and built.warning is None
    assert torch.equal(built.method.steering.coefficients, JuICE(tiny_llama, SEL, 3.0, -1.0).coefficients)
    with pytest.warns(UntunedBetasWarning, match="june with untuned betas"):
        june = build("june", x)
    assert june.settings["source"] == "default" and (june.settings["beta_plus"], june.settings["beta_minus"]) == DEFAULT_BETAS
    assert torch.equal(june.method.steering.coefficients, JuNE(tiny_llama, SEL, *DEFAULT_BETAS).coefficients)
    given = build("juice", dataclasses.replace(x, beta_plus=1.0, beta_minus=0.0))
    assert given.settings["source"] == "given" and given.method.steering.coefficients[1, 2] == 1.0
    pruned = build("prune", MethodInputs(tiny_llama, pruned=[juice.Head(0, 1)]))
    assert torch.equal(pruned.method.steering.coefficients, Prune(tiny_llama, [juice.Head(0, 1)]).coefficients)
    assert build("adacad", MethodInputs()).method.adacad and build("cad", MethodInputs()).method.cad_alpha == 1.0


def test_what_a_method_needs_is_refused_before_a_model_loads():
    with pytest.raises(ValueError, match="juice needs a heads file"):
        methods.check("juice", None, has_heads=False)
    with pytest.raises(ValueError, match="PH3 needs its k"):
        methods.check("ph3", {"juice": {"beta_plus": 1.0, "beta_minus": 0.0}}, has_heads=True)
    with pytest.raises(ValueError, match="auto needs a policy"):
        methods.check("auto", {}, has_heads=True)
    assert methods.check("ph3", {"ph3": {"k": 1, "pruned": ["L0H1"]}}, has_heads=True).name == "ph3"


def test_a_new_method_is_one_entry(tiny_llama, monkeypatch):
    """The example of the module docstring: JuICE at half the tuned betas, added by one entry,
    is then a `juice evaluate` method on rows and on context types, and a Steerer method."""
    from juice.steerer import Steerer
    from juice.when_to_steer import context_methods
    from juice.workflow import evaluation_methods

    def half_juice(x: MethodInputs) -> methods.Built:
        built = build("juice", x, warn=False)
        bp, bm = built.settings["beta_plus"] / 2, built.settings["beta_minus"] / 2
        return methods.Built(build("juice", dataclasses.replace(x, beta_plus=bp, beta_minus=bm)).method,
                             {"beta_plus": bp, "beta_minus": bm})

    entry = MethodSpec("juice-half", "JuICE/2", half_juice, heads=True, tuned="betas", steerer=True, engine="juice")
    monkeypatch.setitem(REGISTRY, entry.name, entry)
    heads = artifact({"juice": {"beta_plus": 4.0, "beta_minus": -2.0}})
    rows, settings = evaluation_methods(tiny_llama, heads, ["original", "juice-half"])
    assert list(rows) == ["Original", "JuICE/2"] and settings["JuICE/2"] == {"beta_plus": 2.0, "beta_minus": -1.0}
    assert torch.equal(rows["JuICE/2"].steering.coefficients, JuICE(tiny_llama, SEL, 2.0, -1.0).coefficients)
    contexts, _ = context_methods(tiny_llama, [heads], ["juice-half"])
    assert list(contexts) == ["JuICE/2-ctx"]
    assert torch.equal(Steerer(tiny_llama, heads, method="juice-half").steering.coefficients,
                       rows["JuICE/2"].steering.coefficients)
    from juice import steerer, steering_request

    assert "juice-half" in steerer.METHODS and "juice-half" not in steering_request.METHODS   # read when asked
