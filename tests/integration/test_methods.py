"""The method registry: one table the Steerer, `juice evaluate` (rows and contexts), `juice tune`,
the tables and the request protocol read; building a method = the presets it names; adding a
method is one entry."""

from __future__ import annotations

import ast
import dataclasses
import json
import re

import pytest
import torch

import juice
import openai
from juice import methods
from juice.baselines.cad import CadPolicy, jsd_alpha
from juice.methods import REGISTRY, MethodInputs, MethodSpec, build, lookup, row_title
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

    assert steering_request.METHODS == ("original", "ph3", "june", "juice", "auto")   # table order, one name each
    assert steerer.METHODS == ("original", "june", "juice", "auto")
    assert methods.names(tune=True) == ("ph3", "june", "juice")
    assert methods.TUNED_STEERINGS == ("juice", "june")
    assert [s.title for s in REGISTRY.values()] == ["Original", "Prompt", "CAD", "AdaCAD", "CK-PLUG", "CoCoA", "COIECD",
                                                   "GRD", "PH3", "JuNE", "JuICE", "auto"]


def test_a_row_is_a_registry_method_and_its_variant_keyed_in_results_and_titled_where_shown():
    """Issue 91: rows travel as keys (the registry's name, then a variant) and are titled only
    where a table, page or record shows them; a title read back from a file is a key again."""
    from juice.methods import VARIANTS, Row, row_key, row_of, row_title

    assert Row("ph3", "l").key == "ph3-l" and Row("ph3", "l").title == "PH3-l"
    assert Row("ph3", "l-knockout").title == "PH3-l (knock-out)" and Row("juice", "ctx").title == "JuICE-ctx"
    assert Row("juice", "post-norm").title == "JuICE (post-norm)" and Row("original").key == "original"
    for name, spec in REGISTRY.items():
        for variant in ("", *VARIANTS):
            row = Row(name, variant)
            assert row_key(row.title) == row_key(row.key) == row.key and row_title(row.key) == row.title
            assert row_of(row.title) == row
    assert row_title("juice - original") == "JuICE - Original" and row_title("juice - ph3-s") == "JuICE - PH3-s"
    assert row_title("Question-only") == row_key("Question-only") == "Question-only"   # no row: unchanged
    assert row_key("juice:2:-1") == "juice:2:-1"
    with pytest.raises(ValueError, match="no variant 'big'"):
        Row("juice", "big")
    # a share of the tuned betas (the when-to-steer study's "juice/2-ctx", one of auto's candidates)
    half = Row("juice", "ctx", "/2")
    assert (half.key, half.title) == ("juice/2-ctx", "JuICE/2-ctx") and Row("juice", share="/2").key == "juice/2"
    assert row_of("JuICE/2-ctx") == row_of("juice/2-ctx") == half and row_key("JuICE/2-ctx - Original") == \
        "juice/2-ctx - original"
    assert row_of("nothing/2-ctx") is None and row_title("nothing/2-ctx") == "nothing/2-ctx"
    with pytest.raises(ValueError, match="a share is '/N'"):
        Row("juice", "ctx", "half")


class _EntryPoint:
    """An entry point of the `juice.methods` group, as :func:`importlib.metadata.entry_points` gives it."""

    def __init__(self, name: str, function) -> None:
        self.name, self.value, self._function = name, f"plugin:{name}", function

    def load(self):
        return self._function


def test_auto_registers_itself_as_a_plugin_and_the_registry_names_nothing_above_it():
    from pathlib import Path

    from juice.when_to_steer import auto

    assert [(p.name, p.value) for p in methods.plugin_entry_points()] == [("auto", "juice.when_to_steer.auto:register")]
    assert REGISTRY["auto"] is auto.SPEC and list(REGISTRY)[-1] == "auto"
    tree = ast.parse(Path(methods.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not any(m.startswith(("juice.when_to_steer", "juice.apps", "juice.pipeline")) for m in imported), imported
    called = {n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
              for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert not called & {"resolve_name", "import_module", "__import__"}   # nothing named in a string and imported


def test_a_thread_that_lists_the_registry_while_another_loads_the_plugins_waits_for_them(monkeypatch):
    import threading

    fresh = methods.Registry(methods._BUILT_IN)
    loading, listed = threading.Event(), {}

    def slow_plugin() -> None:
        loading.set()
        threading.Event().wait(0.3)   # a plugin whose import takes a while
        fresh.register(MethodSpec("late", "Late", lambda x: None))

    monkeypatch.setattr(methods, "plugin_entry_points", lambda group: [_EntryPoint("late", slow_plugin)])
    first = threading.Thread(target=lambda: listed.setdefault("first", list(fresh)))
    first.start()
    assert loading.wait(5)
    listed["second"] = list(fresh)   # while the first thread is still loading
    first.join()
    assert listed["first"][-1] == listed["second"][-1] == "late"


def test_a_checkout_not_installed_or_installed_before_its_plugins_reads_them_from_its_pyproject(monkeypatch):
    from juice.when_to_steer import auto

    # no installed entry point: a checkout on PYTHONPATH=src, or installed before the group existed
    monkeypatch.setattr(methods, "entry_points", lambda group: [])
    (point,) = methods.plugin_entry_points()
    assert (point.name, point.group) == ("auto", "juice.methods") and point.load() is auto.register


def test_a_plugin_registers_a_method_after_the_built_in_ones_when_first_listed(monkeypatch):
    fresh = methods.Registry(methods._BUILT_IN)
    half = MethodSpec("cad-half", "CAD/2", lambda x: methods.Built(juice.recipe.Method(contrast=CadPolicy(0.5))))
    calls = []

    def plug() -> None:
        calls.append(1)
        assert fresh.find("juice").name == "juice"   # a plugin's import may read the registry while it loads
        fresh.register(half)

    monkeypatch.setattr(methods, "plugin_entry_points", lambda group: [_EntryPoint("half", plug)] if group == "juice.methods" else [])
    assert fresh["juice"].title == "JuICE" and calls == []   # a built-in name loads no plugin
    assert list(fresh)[-1] == "cad-half" and fresh["cad-half"] is half and calls == [1]
    assert len(fresh) == len(methods._BUILT_IN) + 1 and calls == [1]   # loaded once
    fresh.register(half)   # the same spec again: nothing
    with pytest.raises(ValueError, match="method prune2: the name 'prune' is taken"):
        fresh.register(MethodSpec("prune2", "PH3/2", lambda x: None, aliases=("prune",)))

    def broken() -> None:
        raise ImportError("no module named nowhere")

    failing = methods.Registry(methods._BUILT_IN)
    monkeypatch.setattr(methods, "plugin_entry_points", lambda group: [_EntryPoint("broken", broken),
                                                                       _EntryPoint("half", lambda: failing.register(half))])
    failure = "the method plugin broken (plugin:broken) failed to register: ImportError: no module named nowhere"
    with pytest.warns(RuntimeWarning, match=re.escape(failure)):
        assert list(failing)[-1] == "cad-half"   # the plugin after the broken one still registers
    assert failing.failures == [failure]
    monkeypatch.setattr(methods, "REGISTRY", failing)
    with pytest.raises(ValueError, match=re.escape(f"unknown method 'broken'; choose from original") + ".*"
                       + re.escape(f"({failure})")):
        lookup("broken")


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
    assert build("adacad", MethodInputs()).method.contrast == CadPolicy(jsd_alpha)
    assert build("cad", MethodInputs()).method.contrast == CadPolicy(1.0)
    from juice.baselines.cocoa import CocoaPolicy
    from juice.baselines.coiecd import CoiecdPolicy
    from juice.baselines.grd import GrdPolicy

    assert build("cocoa", MethodInputs()).method.contrast == CocoaPolicy(0.5, 1.0, 100.0)
    assert build("coiecd", MethodInputs()).method.contrast == CoiecdPolicy(1.0, 4.0)
    grd = build("GRD", MethodInputs())
    assert grd.method.contrast == GrdPolicy(0.75, "full") and grd.settings == {"lambda": 0.75, "gate_mode": "full"}


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

    entry = MethodSpec("juice-half", "JuICE/2", half_juice, heads=True, tuned="betas", steerer=True, steering="add")
    monkeypatch.setitem(REGISTRY, entry.name, entry)
    heads = artifact({"juice": {"beta_plus": 4.0, "beta_minus": -2.0}})
    rows, settings = evaluation_methods(tiny_llama, heads, ["original", "juice-half"])
    assert list(rows) == ["original", "juice-half"] and settings["juice-half"] == {"beta_plus": 2.0, "beta_minus": -1.0}
    assert torch.equal(rows["juice-half"].steering.coefficients, JuICE(tiny_llama, SEL, 2.0, -1.0).coefficients)
    contexts, _ = context_methods(tiny_llama, [heads], ["juice-half"])
    assert list(contexts) == ["juice-half-ctx"] and row_title("juice-half-ctx") == "JuICE/2-ctx"
    assert torch.equal(Steerer(tiny_llama, heads, method="juice-half").steering.coefficients,
                       rows["juice-half"].steering.coefficients)
    from juice import steerer, steering_request

    assert "juice-half" in steerer.METHODS and "juice-half" not in steering_request.METHODS   # read when asked


def test_a_new_baseline_is_a_row_of_both_tables_and_a_sweep_from_its_entry(shared_data, tiny_llama, tmp_path,
                                                                           monkeypatch):
    """Issue 91: a baseline added as one entry with `tables` is a row of Table 1 and Table 2
    (`juice reproduce`, both directions), after the registry's rows, with an item per test prompt as
    Original has; a contrastive entry of Table 2 only is a row there and not in Table 1; a sweep
    file may name both and then runs the baselines. Nothing but the two entries is added."""
    import shutil

    from helpers.data import write_contextual_data

    from juice.experiments.sweep import load_sweep
    from juice.experiments.table1 import reproduce
    from juice.experiments.table2 import reproduce_contextual
    from juice.pipeline.run import ReproduceConfig
    from juice.recipe import Method

    zero = MethodSpec("zero-l1h2", "Zero L1H2", lambda x: methods.Built(Method(Prune(x.geometry, [juice.Head(1, 2)]))),
                      tables=("table1", "table2"))
    half = MethodSpec("cad-half", "CAD/2", lambda x: methods.Built(Method(contrast=CadPolicy(0.5))), tables=("table2",))
    for entry in (zero, half):
        monkeypatch.setitem(REGISTRY, entry.name, entry)
    with pytest.raises(ValueError, match="no table 'table3'"):
        MethodSpec("x", "X", zero.build, tables=("table3",))
    shutil.copytree(shared_data / "paraconflict" / "world_capital", tmp_path / "data" / "world_capital")
    write_contextual_data(tmp_path / "contextual")
    common = dict(limit=2, alphas_positive=(1.0,), alphas_negative=(-1.0,), k=2, ph3_dev_size=2,
                  bootstrap_resamples=1000, contexts=())
    one = reproduce(ReproduceConfig(out_dir=tmp_path / "t1", data=tmp_path / "data", validation_size=2, filter=False,
                                    **common), lm=tiny_llama)
    two = reproduce_contextual(ReproduceConfig(out_dir=tmp_path / "t2", data_root=tmp_path / "contextual",
                                               validation_per_dataset=1, scoring="exact", **common), lm=tiny_llama)
    assert list(one.methods) == ["original", "prompt", "ph3-l", "ph3-s", "june", "juice", "zero-l1h2"]   # row keys
    assert list(two.methods) == ["original", "prompt", "cad", "adacad", "ph3-l", "ph3-s", "june", "juice",
                                 "zero-l1h2", "cad-half"]
    assert list(json.loads((tmp_path / "t2" / "results_contextual.json").read_text())["table"]["cells"]) == [
        "Original", "Prompt", "CAD", "AdaCAD", "PH3-l", "PH3-s", "JuNE", "JuICE", "Zero L1H2", "CAD/2"]   # titled
    for out, name in ((tmp_path / "t1", "results.json"), (tmp_path / "t2", "results_contextual.json")):
        items = json.loads((out / name).read_text())["items"]
        keys = {m: sorted((r["domain"], r["subject"], r["conflict_type"]) for r in items if r["method"] == m)
                for m in ("Original", "Zero L1H2", "CAD/2")}
        assert keys["Zero L1H2"] == keys["Original"] and keys["Original"]
        assert keys["CAD/2"] == (keys["Original"] if out.name == "t2" else [])
    sweep = tmp_path / "sweep.toml"
    sweep.write_text('[grid]\nmodels = ["m"]\ndirections = ["contextual"]\ndomains = ["nqswap"]\n'
                     'methods = ["Original", "CAD/2", "Zero L1H2"]\n')
    assert "baselines" not in dict(load_sweep(sweep).jobs()[0].settings)   # a baseline named: they run


def test_a_new_method_is_served_by_both_servers_from_its_entry(tmp_path, monkeypatch):
    """Issue 76: a head steering added as one entry with `protocol=True` is asked for by name in
    a request: `juice serve` decodes it as its build says (equal to the Steerer's tokens) and vLLM's
    plugin options (:func:`juice.vllm.options.parse_request`) apply the same coefficients; a
    contrastive entry with `protocol=True` is refused by both in one line, never served as
    Original. Adding either touches the entry only (this test's two)."""
    import os

    pytest.importorskip("openai")
    from conftest import build_tiny
    from helpers.server import serving_client

    from juice.apps.server import create_app
    from juice.recipe import Method
    from juice.steerer import Steerer
    from juice.steering_request import SteeringRequestError
    from juice.vllm.options import parse_request, plugin_heads

    def third_juice(x: MethodInputs) -> methods.Built:   # JuICE at a third of the betas it is given
        built = build("juice", x, warn=False)
        bp, bm = built.settings["beta_plus"] / 3, built.settings["beta_minus"] / 3
        return methods.Built(build("juice", dataclasses.replace(x, beta_plus=bp, beta_minus=bm)).method,
                             {"beta_plus": bp, "beta_minus": bm})

    monkeypatch.setitem(REGISTRY, "juice-third", MethodSpec(
        "juice-third", "JuICE/3", third_juice, protocol=True, heads=True, tuned="betas", steerer=True,
        steering="add"))
    monkeypatch.setitem(REGISTRY, "cad-half", MethodSpec(
        "cad-half", "CAD/2", lambda x: methods.Built(Method(contrast=CadPolicy(0.5))), protocol=True))
    lm = build_tiny("llama")
    heads = HeadsArtifact(lm.fingerprint(), "contextual", 1, [1.0], [-1.0], SEL)
    prompt, ask = "the capital of france is", {"method": "juice-third", "beta_plus": 6, "beta_minus": -3}
    with serving_client(create_app(lm, [heads], model_name="tiny")) as client:
        out = client.completions.create(model="tiny", prompt=prompt, max_tokens=6, temperature=0,
                                        extra_body={"juice": ask})
        assert out.choices[0].text == Steerer(lm, SEL, beta_plus=2.0, beta_minus=-1.0).generate(prompt, 6)[0]
        with pytest.raises(openai.BadRequestError, match="juice.method cad-half decodes with a contrast"):
            client.completions.create(model="tiny", prompt=prompt, max_tokens=2, temperature=0,
                                      extra_body={"juice": {"method": "cad-half"}})
    path = tmp_path / "contextual.json"
    from juice.stage1 import save_heads

    save_heads(heads, path)
    plugin = plugin_heads({"JUICE_VLLM_HEADS": os.fspath(path)})
    steering = parse_request(ask, plugin, lm.geometry)
    assert steering.method == "juice-third"
    assert torch.equal(steering.add, JuICE(lm, SEL, 2.0, -1.0).coefficients)
    with pytest.raises(SteeringRequestError, match="juice.method cad-half decodes with a contrast"):
        parse_request({"method": "cad-half"}, plugin, lm.geometry)
