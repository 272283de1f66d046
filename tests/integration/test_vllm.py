"""juice inside vLLM (:mod:`juice.vllm`): greedy tokens through vLLM with the plugin equal juice's
own `generate`, for Original, JuNE, JuICE and pruning, in a mixed batch and each request alone;
bad steering is refused at admission and the engine keeps serving.

vLLM runs in its own environment (`scripts/install-vllm.sh`; docs/vllm.md,
"Install"): these tests start it as a subprocess (`tests/vllm_env/run_offline.py`) with the Python named by
`$JUICE_VLLM_PYTHON` or the repository's `.venv-vllm/bin/python`, and skip with the reason when
there is none. The request-side checks of :mod:`juice.vllm.options` need no vLLM and are here; the runs
through vLLM are tests/slow/test_vllm_runs.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from juice.architectures import HeadGeometry
from juice.interventions import Head, HeadSelection
from juice.steering import JuICE, JuNE, Prune
from juice.steering_request import request_fields
from juice.steering_request import SteeringRequestError
from juice.vllm.options import parse_request, read_heads_file, plugin_heads
from juice.vllm.middleware import juice_field_to_xargs

from helpers.vllm import CONTEXTUAL, PARAMETRIC, write_heads


GEOMETRY = HeadGeometry(4, 4, 32)


@pytest.fixture
def two_files(tmp_path):
    model = {"name": "m", "model_type": "llama", "n_layers": 4, "n_heads": 4, "head_dim": 32}
    files = [write_heads(tmp_path / "p.json", model, "parametric", PARAMETRIC,
                         {"june": {"beta_plus": 3.0, "beta_minus": -0.5}}),
             write_heads(tmp_path / "c.json", model, "contextual", CONTEXTUAL)]
    return plugin_heads({"JUICE_VLLM_HEADS": os.pathsep.join(files)})


# --- the request side (no vLLM needed) ------------------------------------------------------------

def test_request_fields_read_the_nested_object_and_the_flat_vllm_xargs_keys():
    assert request_fields(None) is None and request_fields({"other": 1}) is None
    assert request_fields({"juice": {"method": "june"}}) == {"method": "june"}
    assert request_fields({"juice_method": "juice", "juice_beta_plus": 2}) == {"method": "juice", "beta_plus": 2}
    with pytest.raises(SteeringRequestError, match="unknown juice field 'beta'"):
        request_fields({"juice": {"beta": 1}})
    with pytest.raises(SteeringRequestError, match="must be an object"):
        request_fields({"juice": "juice"})
    with pytest.raises(SteeringRequestError, match="must be an object"):
        request_fields(juice_field_to_xargs({"juice": "juice"})["vllm_xargs"])


def test_the_middleware_moves_the_juice_field_into_vllm_xargs():
    body = {"model": "m", "juice": {"method": "ph3", "heads": ["L1H1"]}, "vllm_xargs": {"other": 1}}
    assert juice_field_to_xargs(body) == {"model": "m", "vllm_xargs": {"other": 1, "juice_method": "ph3",
                                                                       "juice_heads": ["L1H1"]}}
    assert juice_field_to_xargs({"model": "m"}) == {"model": "m"}
    assert request_fields(juice_field_to_xargs(body)["vllm_xargs"]) == {"method": "ph3", "heads": ["L1H1"]}


def test_a_request_becomes_the_tables_juice_generate_applies(two_files):
    june = parse_request({"method": "june", "direction": "memory"}, two_files, GEOMETRY)   # tuned 3, -0.5
    assert june.scale[1, 0] == 3.0 and june.scale[1, 2] == -0.5 and june.scale[2, 3] == 3.0 and not june.add.any()
    juice = parse_request({"method": "juice", "direction": "context", "beta_plus": 1, "beta_minus": -2},
                          two_files, GEOMETRY)
    assert juice.add[2, 1] == 1 and juice.add[1, 3] == -2 and juice.add[2, 3] == -2 and not juice.scale.any()
    assert torch.equal(juice.add, JuICE(GEOMETRY, CONTEXTUAL, 1, -2).coefficients)
    assert torch.equal(june.scale, JuNE(GEOMETRY, PARAMETRIC, 3.0, -0.5).coefficients)
    prune = parse_request({"method": "ph3", "heads": ["L3H1", "L0H0"]}, two_files, GEOMETRY)
    assert torch.equal(prune.scale, Prune(GEOMETRY, [Head(3, 1), Head(0, 0)]).coefficients)
    assert parse_request({"method": "original"}, two_files, GEOMETRY) is None
    assert parse_request(None, two_files, GEOMETRY) is None


@pytest.mark.parametrize("fields, message", [
    ({"method": "jucie"}, "juice.method must be one of"),
    ({"method": "june", "direction": "context", "beta_plus": float("nan")}, "finite"),
    ({"method": "june", "direction": "context", "beta_plus": 101}, "|beta| <= 100"),
    ({"method": "june", "direction": "context", "beta_minus": "x"}, "must be a number"),
    ({"method": "june", "direction": "context", "beta_minus": True}, "must be a number"),
    ({"method": "june"}, "say juice.direction"),
    ({"method": "june", "direction": "sideways"}, "juice.direction"),
    ({"method": "ph3"}, "needs juice.heads"),
    ({"method": "ph3", "heads": ["L9H0"]}, "juice.heads"),
    ({"method": "ph3", "heads": ["head six"]}, "juice.heads"),
    ({"method": "june", "direction": "context", "heads": ["L1H1"]}, "send no direction or betas"),
    ({"method": "juice", "heads": {"L0H0": 1.0}}, "JuICE adds only to heads whose run-1 outputs this server keeps"),
])
def test_bad_steering_is_refused_in_one_line(two_files, fields, message):
    with pytest.raises(SteeringRequestError, match=message.replace("|", r"\|")) as err:
        parse_request(fields, two_files, GEOMETRY)
    assert "\n" not in str(err.value)


def test_admission_refuses_a_pruned_head_outside_the_model_before_any_model_is_built(two_files):
    """At admission the API server has no model: the heads files' fingerprints, or
    JUICE_VLLM_GEOMETRY, tell it the served model's layers and heads."""
    assert (two_files.geometry.n_layers, two_files.geometry.n_heads) == (4, 4)
    with pytest.raises(SteeringRequestError, match="head L9H0 is out of range for a model of 4 layers x 4 heads"):
        parse_request({"method": "ph3", "heads": ["L9H0"]}, two_files)
    told = plugin_heads({"JUICE_VLLM": "1", "JUICE_VLLM_GEOMETRY": "18x4"})
    assert told.geometry_from == "JUICE_VLLM_GEOMETRY" and told.geometry.n_layers == 18
    assert parse_request({"method": "ph3", "heads": ["L17H3"]}, told) is not None
    with pytest.raises(SteeringRequestError, match="L18H0 is out of range"):
        parse_request({"method": "ph3", "heads": ["L18H0"]}, told)
    assert plugin_heads({"JUICE_VLLM": "1"}).geometry is None   # the model refuses to start then
    for bad in ("18", "18x", "x4", "18x0", "eighteen x four"):
        with pytest.raises(ValueError, match="is not <n_layers>x<n_heads>"):
            plugin_heads({"JUICE_VLLM": "1", "JUICE_VLLM_GEOMETRY": bad})


def test_server_side_refusals(tmp_path, two_files):
    off = plugin_heads({})
    with pytest.raises(SteeringRequestError, match="without juice steering"):
        parse_request({"method": "june"}, off)
    only = plugin_heads({"JUICE_VLLM_HEADS": two_files.files["parametric"]})
    with pytest.raises(SteeringRequestError, match="no heads for direction 'contextual'"):
        parse_request({"method": "june", "direction": "context"}, only)
    assert parse_request({"method": "june"}, only).method == "june"   # the only file's direction
    single = plugin_heads({"JUICE_VLLM_HEADS": two_files.files["parametric"], "JUICE_VLLM_DUAL_RUN": "0"})
    with pytest.raises(SteeringRequestError, match="needs the dual run"):
        parse_request({"method": "juice"}, single)
    assert single.dual_run_layers() is None and two_files.dual_run_layers() == (1, 2)
    with pytest.raises(ValueError, match="two heads files for the parametric direction"):
        plugin_heads({"JUICE_VLLM_HEADS": os.pathsep.join([two_files.files["parametric"]] * 2)})
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="not a juice heads file"):
        read_heads_file(str(tmp_path / "bad.json"))


def test_a_request_without_juice_fields_gets_the_same_default_as_on_juice_serve(two_files):
    only = {"JUICE_VLLM_HEADS": two_files.files["parametric"]}   # JuNE tuned at 3, -0.5
    tuned = parse_request(None, plugin_heads(only), GEOMETRY)
    assert tuned.method == "june" and tuned.warning is None
    assert torch.equal(tuned.scale, JuNE(GEOMETRY, PARAMETRIC, 3.0, -0.5).coefficients)
    assert parse_request(None, two_files, GEOMETRY) is None   # two files: Original
    operator = plugin_heads({**only, "JUICE_VLLM_DEFAULT": "method:juice,beta_plus:1"})
    steered = parse_request(None, operator, GEOMETRY)
    assert steered.method == "juice" and "untuned" in steered.warning   # beta_minus untuned
    assert torch.equal(steered.add, JuICE(GEOMETRY, PARAMETRIC, 1.0, 0.0).coefficients)
    with pytest.raises(ValueError, match="JUICE_VLLM_DEFAULT: juice.method must be one of"):
        plugin_heads({**only, "JUICE_VLLM_DEFAULT": "method:jucie"})
    assert parse_request(None, plugin_heads({}), GEOMETRY) is None   # plugin off: nothing to apply


def test_the_middleware_refuses_what_juice_serve_refuses_before_vllm_coerces_it(two_files, monkeypatch):
    from juice.vllm.middleware import check_body

    monkeypatch.setenv("JUICE_VLLM_HEADS", os.pathsep.join(two_files.files.values()))
    with pytest.raises(SteeringRequestError, match="juice.beta_plus must be a number, not True"):
        check_body({"vllm_xargs": {"juice_method": "june", "juice_direction": "context", "juice_beta_plus": True}})
    with pytest.raises(SteeringRequestError, match="juice must be an object"):
        check_body({"juice": "juice"})
    assert "untuned" in check_body({"juice": {"method": "juice", "direction": "context"}})
    assert check_body({"prompt": "x"}) is None


def test_a_steered_request_gets_its_steerings_cache_salt_and_original_none(two_files):
    """Prefix caching (issue 36): the salt names the resolved steering, so equal steerings share
    cached blocks and different ones never do; Original keeps no salt (it shares with stock vLLM)."""
    from juice.vllm.options import offline_request, request_ask, request_cache_salt, steering_salt

    def salt(fields):
        return steering_salt(request_ask(fields, two_files), two_files)

    june = {"method": "june", "direction": "context", "beta_plus": 1.0, "beta_minus": 0.0}
    assert salt({"method": "original"}) is None and salt(None) is None
    assert salt(june) == salt({**june, "direction": "contextual", "beta_plus": 1})   # the same steering
    others = [salt({**june, "beta_plus": 2.0}), salt({**june, "method": "juice"}), salt({**june, "direction": "memory"}),
              salt({"method": "ph3", "heads": ["L1H1"]}), salt({"method": "ph3", "heads": ["L1H2"]})]
    assert len({salt(june), *others}) == 6 and all(s.startswith("juice-") and len(s) <= 128 for s in others)
    assert request_cache_salt(salt(june), None) == salt(june)
    assert request_cache_salt(salt(june), "tenant") not in (salt(june), request_cache_salt(salt(june), "other"))
    assert offline_request([1, 5, 6], june, server=two_files) == ({"prompt_token_ids": [1, 5, 6]}, {"juice": june})
    assert offline_request("text", None, cache_salt="mine", server=two_files) == ({"prompt": "text",
                                                                                  "cache_salt": "mine"}, {})
    with pytest.raises(SteeringRequestError, match="juice.method must be one of"):
        offline_request("text", {"method": "jucie"}, server=two_files)
    with pytest.raises(SteeringRequestError, match="unknown juice field 'cache_salt'"):
        request_fields({"juice_method": "june", "juice_cache_salt": "s"})   # the old mark is no field


# --- through vLLM --------------------------------------------------------------------------------

def test_the_launch_line_carries_the_plugins_requirements(tmp_path):
    from juice.vllm.launch import describe, folder_geometry, server_command, server_environment

    command = server_command("/venv/bin/python", "/models/g", "gemma-3-270m", host="127.0.0.1", port=8000,
                             max_model_len=1024, extra=["--tensor-parallel-size=2"])
    for flag in ("--dtype", "juice.vllm.middleware.JuiceFieldMiddleware", "--tensor-parallel-size=2"):
        assert flag in command
    assert command[command.index("--logits-processors") + 1] == "juice.vllm.processor:JuiceSteeringProcessor"
    assert command[command.index("--scheduler-cls") + 1] == "juice.vllm.scheduler.salting_scheduler"
    own = server_command("p", "f", "n", host="h", port=1, extra=["--scheduler-cls=mine.Scheduler"])
    assert own.count("--scheduler-cls") == 0 and "--scheduler-cls=mine.Scheduler" in own   # refused at start, not hidden
    assert "--enforce-eager" not in command and "--no-enable-prefix-caching" not in command   # vLLM's defaults
    assert "--dtype" not in server_command("p", "f", "n", host="h", port=1, extra=["--dtype=bfloat16"])
    assert "--compilation-config" not in command   # the CPU build captures no CUDA graph
    gpu = server_command("p", "f", "n", host="h", port=1, gpu=True)
    assert gpu[gpu.index("--compilation-config") + 1] == '{"cudagraph_mode": "PIECEWISE"}'
    assert command[command.index("--dtype") + 1] == "float32" and "--dtype" not in gpu   # a GPU: the model's dtype
    for own in (["--enforce-eager"], ["-O", "3"], ["--compilation-config={}"]):
        assert "--compilation-config" not in server_command("p", "f", "n", host="h", port=1, gpu=True, extra=own)
    env = server_environment([tmp_path / "a.json"], dual_run=False, base={})
    assert env["JUICE_VLLM_HEADS"] == str((tmp_path / "a.json").resolve()) and env["JUICE_VLLM_DUAL_RUN"] == "0"
    assert describe(command, env).startswith("JUICE_VLLM_HEADS=")
    from transformers import AutoConfig

    AutoConfig.for_model("gemma3", text_config={"num_hidden_layers": 18, "num_attention_heads": 4}).save_pretrained(
        tmp_path / "m")   # a multimodal config: its text part counts
    assert folder_geometry(str(tmp_path / "m")) == "18x4" and folder_geometry("google/gemma-3-270m") is None
    env = server_environment([], base={}, geometry="18x4")
    assert env["JUICE_VLLM_GEOMETRY"] == "18x4" and "JUICE_VLLM_GEOMETRY=18x4" in describe(command, env)


def test_the_heads_travel_in_vllms_config_and_ray_copies_the_on_switch(tmp_path, two_files):
    """Issue 46: every worker, on any node, steers with the launcher's heads: their content goes in
    vLLM's `additional_config` (read back equal to the files, with no file left), and Ray's
    workers get the `JUICE_` variables."""
    from types import SimpleNamespace

    from juice.vllm.launch import RAY_PREFIXES, server_command, server_environment
    from juice.vllm.options import config_entry, plugin_enabled, served_heads

    env = {"JUICE_VLLM_HEADS": os.pathsep.join(two_files.files.values()),
           "JUICE_VLLM_DEFAULT": "method:june,direction:memory",
           "JUICE_VLLM_DUAL_RUN": "0"}
    entry = json.loads(json.dumps(config_entry(env)))   # as vLLM's config carries it
    expected = plugin_heads(env)   # what admission reads (cached, as before the files go away)
    for path in two_files.files.values():
        Path(path).rename(path + ".gone")
    here = served_heads(SimpleNamespace(additional_config={"juice": entry}), environ={})
    assert (here.selections, here.tuned, here.default, here.dual_run, here.fingerprints, here.geometry) == (
        expected.selections, expected.tuned, expected.default, expected.dual_run, expected.fingerprints,
        expected.geometry)
    assert here.enabled and plugin_enabled(env)   # the on-switch reads no file
    assert served_heads(SimpleNamespace(additional_config={}), environ=env) is expected   # no entry: the variables
    for path in two_files.files.values():
        Path(path + ".gone").rename(path)
    other = {**env, "JUICE_VLLM_DEFAULT": "method:june,direction:context"}
    with pytest.raises(ValueError, match="name different heads, betas, default or dual run"):
        served_heads(SimpleNamespace(additional_config={"juice": entry}), environ=other)
    with pytest.raises(ValueError, match="is not juice's set-up"):
        served_heads(SimpleNamespace(additional_config={"juice": [1]}), environ={})

    command = server_command("p", "f", "n", host="h", port=1, config=entry,
                             extra=["--additional-config={\"mine\": 1}", "--tensor-parallel-size=2"])
    assert json.loads(command[command.index("--additional-config") + 1]) == {"mine": 1, "juice": entry}
    assert "--tensor-parallel-size=2" in command and command.count("--additional-config") == 1
    with pytest.raises(ValueError, match="is not a JSON object"):
        server_command("p", "f", "n", host="h", port=1, config=entry, extra=["--additional-config", "[1]"])
    assert server_environment([], base={})[RAY_PREFIXES] == "JUICE_"
    assert server_environment([], base={RAY_PREFIXES: "LMCACHE_"})[RAY_PREFIXES] == "LMCACHE_,JUICE_"


@pytest.mark.parametrize("cpus, set_by_user, reserved", [
    (2, {}, "0"), (7, {}, "0"), (8, {}, None), (64, {}, None),
    (2, {"VLLM_CPU_OMP_THREADS_BIND": "0"}, None), (2, {"VLLM_CPU_NUM_OF_RESERVED_CPU": "1"}, "1")])
def test_few_cores_are_all_kept_for_the_model_unless_the_user_binds_them(tmp_path, monkeypatch, cpus, set_by_user,
                                                                          reserved):
    from juice.vllm import launch

    monkeypatch.setattr(launch, "usable_cpus", lambda: set(range(cpus)))
    env = launch.server_environment([tmp_path / "a.json"], base=dict(set_by_user))
    assert env.get("VLLM_CPU_NUM_OF_RESERVED_CPU") == reserved
    assert env.get("VLLM_CPU_OMP_THREADS_BIND") == set_by_user.get("VLLM_CPU_OMP_THREADS_BIND")


def test_find_vllm_python_refuses_a_named_python_that_is_not_there(tmp_path, monkeypatch):
    from juice.vllm.launch import VllmNotFoundError, find_vllm_python

    monkeypatch.setenv("JUICE_VLLM_PYTHON", str(tmp_path / "nothing"))
    with pytest.raises(VllmNotFoundError, match="is not a file"):
        find_vllm_python()
    assert find_vllm_python(required=False) is None


def test_juice_serve_engine_vllm_refuses_an_alias_in_one_line():
    from juice.apps.cli import main

    assert main(["serve", "--engine", "vllm", "--alias", "a=method:june"]) == 2
    assert main(["serve", "--engine", "tgi"]) == 2


GENERATING_ROUTES_NOT_STEERED = ("/v1/responses", "/v1/messages", "/v1/chat/completions/batch", "/generative_scoring",
                                 "/v1/systemone", "/inference/v1/generate", "/cohere/v2/chat")
"""vLLM 0.32's generating routes beside the steered ones (juice.vllm.middleware.STEERED_PATHS)."""


def test_every_route_steers_the_juice_field_or_refuses_it_in_its_own_error_shape(two_files, monkeypatch):
    """Issue 74: the middleware as an ASGI app in front of a stand-in for vLLM that records what
    reaches it. On the steered routes the `juice` field becomes `vllm_xargs`; on every other
    generating route of vLLM 0.32, and with beam search, a body carrying juice fields (either
    form) is a 400 naming the field, in the route's shape, and never reaches vLLM; bodies without
    juice fields pass through untouched."""
    from starlette.testclient import TestClient

    from juice.vllm.middleware import STEERED_PATHS, JuiceFieldMiddleware

    monkeypatch.setenv("JUICE_VLLM_HEADS", os.pathsep.join(two_files.files.values()))
    reached = []

    async def vllm(scope, receive, send):
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        reached.append((scope["path"], json.loads(body)))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b"{}"})

    client = TestClient(JuiceFieldMiddleware(vllm))
    june = {"method": "june", "direction": "context", "beta_plus": 1.0, "beta_minus": 0.0}
    for path in STEERED_PATHS:
        assert client.post(path, json={"prompt": "x", "juice": june}).status_code == 200
        assert reached.pop() == (path, {"prompt": "x", "vllm_xargs": {f"juice_{k}": v for k, v in june.items()}})
    for path in GENERATING_ROUTES_NOT_STEERED:
        for body, field in (({"juice": june}, "juice"), ({"vllm_xargs": {"juice_method": "june"}}, "vllm_xargs.juice_method")):
            answer = client.post(path, json={"input": "x", **body})
            assert answer.status_code == 400
            error = answer.json()
            if path == "/v1/messages":
                assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
            message = error["error"]["message"]
            assert message.startswith(f"{field}: juice checks and steers /v1/completions") and f"not {path} " in message
        assert client.post(path, json={"input": "x", "juice": None}).status_code == 200   # null: no fields
        assert reached.pop() == (path, {"input": "x", "juice": None})
    for path in STEERED_PATHS:
        for body in ({"juice": june}, {"vllm_xargs": {"juice_method": "june", "juice_direction": "context"}}):
            answer = client.post(path, json={"prompt": "x", "use_beam_search": True, "n": 2, **body})
            assert answer.status_code == 400 and "juice does not steer beam search" in answer.json()["error"]["message"]
        assert client.post(path, json={"prompt": "x", "use_beam_search": True}).status_code == 200
        assert reached.pop() == (path, {"prompt": "x", "use_beam_search": True})
    assert reached == []


def test_behind_a_root_path_the_steered_routes_steer_and_vllm_xargs_juice_with_beam_search_is_refused(two_files,
                                                                                                     monkeypatch):
    """Issue 88, item 7: with vLLM's `--root-path /x` the ASGI `path` carries the prefix; the
    middleware matches the route vLLM's router matches (the path less the root path), so a juice
    request is steered there, not answered 400. `vllm_xargs: {"juice": "<a string>"}` is a juice
    field (the plugin reads `extra_args["juice"]`): with beam search it is refused, not run as an
    unsteered beam search."""
    from starlette.testclient import TestClient

    from juice.vllm.middleware import JuiceFieldMiddleware

    monkeypatch.setenv("JUICE_VLLM_HEADS", os.pathsep.join(two_files.files.values()))
    reached = []

    async def vllm(scope, receive, send):
        message = await receive()
        reached.append((scope["path"], json.loads(message.get("body", b"{}"))))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b"{}"})

    june = {"method": "june", "direction": "context", "beta_plus": 1.0, "beta_minus": 0.0}
    client = TestClient(JuiceFieldMiddleware(vllm), root_path="/x")   # as uvicorn: the path holds the root path
    answer = client.post("/x/v1/completions", json={"prompt": "x", "juice": june})
    assert answer.status_code == 200, answer.text
    assert reached.pop() == ("/x/v1/completions", {"prompt": "x",
                                                   "vllm_xargs": {f"juice_{k}": v for k, v in june.items()}})
    assert client.post("/x/v1/responses", json={"input": "x", "juice": june}).status_code == 400
    plain = TestClient(JuiceFieldMiddleware(vllm))
    for value in ("method:june", json.dumps(june)):
        answer = plain.post("/v1/completions", json={"prompt": "x", "use_beam_search": True, "n": 2,
                                                     "vllm_xargs": {"juice": value}})
        assert answer.status_code == 400
        assert answer.json()["error"]["message"].startswith("vllm_xargs.juice: juice does not steer beam search")
    assert reached == []


def test_a_heads_file_made_at_float32_fits_the_model_in_bfloat16_and_not_another_model():
    """Issue 74: vLLM serves a GPU model in its own dtype (bf16), juice identifies heads at float32.
    The fingerprint's checksum at bfloat16 precision is the same for both; a model with other
    weights differs in both checksums; a file made before that checksum existed (exact checksum
    only) fits only at its own precision."""
    from conftest import build_tiny

    from juice.models import BF16_DIGEST_KEY, fingerprint_mismatch

    fp32 = build_tiny("llama", device="cpu")
    bf16 = build_tiny("llama", device="cpu", dtype=torch.bfloat16)
    made, served = fp32.fingerprint(), bf16.fingerprint()
    assert made["weights_sha256_16"] != served["weights_sha256_16"]
    assert made[BF16_DIGEST_KEY] == served[BF16_DIGEST_KEY]
    assert fingerprint_mismatch(made, served) is None
    other = build_tiny("llama", seed=1, device="cpu", dtype=torch.bfloat16).fingerprint()
    assert "weights_sha256_16" in fingerprint_mismatch(made, other) and BF16_DIGEST_KEY in fingerprint_mismatch(
        made, other)
    older = {k: v for k, v in made.items() if k != BF16_DIGEST_KEY}
    assert fingerprint_mismatch(older, fp32.fingerprint()) is None
    assert "weights_sha256_16" in fingerprint_mismatch(older, served)


@pytest.mark.parametrize("bad, match", [("L2H9", "head L2H9 is out"), ("L9H0", "head L9H0 is out")])
def test_the_plugin_refuses_a_heads_file_with_a_head_or_layer_outside_the_model_in_one_line(tmp_path, bad, match):
    """Issue 88, item 1: a heads file whose fingerprint fits the model but names a head (or layer)
    the model does not have. Before, `head_slots` dropped such a head silently and a
    direction-only request was admitted and then decoded as Original in the worker (a layer past
    the model crashed start with a raw IndexError); now the set-up is refused in one line, by the
    plugin's reader, by `JUICE_VLLM_GEOMETRY` where the file has no geometry, and so by
    `juice serve --engine vllm` before vLLM starts."""
    from juice.vllm.options import config_entry

    model = {"name": "m", "model_type": "llama", "n_layers": 4, "n_heads": 4, "head_dim": 32}
    path = write_heads(tmp_path / "bad.json", model, "parametric", HeadSelection((Head(1, 0), Head.parse(bad)), ()))
    for read in (lambda: plugin_heads({"JUICE_VLLM_HEADS": path}), lambda: config_entry({"JUICE_VLLM_HEADS": path})):
        with pytest.raises(ValueError, match=match) as refused:
            read()
        assert "\n" not in str(refused.value) and path in str(refused.value)
    bare = {k: v for k, v in model.items() if k not in ("n_layers", "n_heads")}
    path = write_heads(tmp_path / "bare.json", bare, "parametric", HeadSelection((Head.parse(bad),), ()))
    plugin_heads({"JUICE_VLLM_HEADS": path, "JUICE_VLLM_GEOMETRY": "10x10"})   # fits a model that has it
    with pytest.raises(ValueError, match=f"{match}side the served model, which has 4 layers x 4 heads"):
        plugin_heads({"JUICE_VLLM_HEADS": path, "JUICE_VLLM_GEOMETRY": "4x4"})


def test_admission_builds_each_request_s_steering_as_the_worker_will(two_files):
    """Issue 88, item 1: the logits processor's admission builds the steering with the served
    geometry (`parse_request(fields, server, server.geometry)`), the same call the worker makes,
    so a request it admits cannot fail there; the worker raises instead of decoding it as
    Original (juice.vllm.processor.SteeringBuildError, checked in vLLM's environment)."""
    ask = {"method": "juice", "direction": "context", "beta_plus": 2.0, "beta_minus": 0.0}
    admitted = parse_request(ask, two_files, two_files.geometry)
    assert admitted is not None and admitted.add.shape == (4, 4) and admitted.add.abs().sum() > 0
    assert torch.equal(admitted.add, parse_request(ask, two_files, GEOMETRY).add)


def test_an_offline_prompt_dict_s_juice_key_is_taken_never_dropped(two_files):
    """Issue 88, item 4: vLLM's `LLM.generate` drops a prompt dict's `juice` key (its prompts are
    TypedDicts). juice's offline builder takes it as the request's juice fields (checked; into
    `extra_args`), refuses it beside `juice=`, and keeps no `juice` key in the prompt it returns."""
    from juice.vllm.options import offline_request

    ask = {"method": "june", "direction": "context", "beta_plus": 1.0, "beta_minus": 0.0}
    prompt, extra = offline_request({"prompt_token_ids": [1, 2], "juice": ask}, server=two_files)
    assert prompt == {"prompt_token_ids": [1, 2]} and extra == {"juice": ask}
    assert offline_request({"prompt": "x", "juice": None}, server=two_files) == ({"prompt": "x"}, {})
    with pytest.raises(SteeringRequestError, match="both give juice fields"):
        offline_request({"prompt": "x", "juice": ask}, ask, server=two_files)
    with pytest.raises(SteeringRequestError, match="direction"):
        offline_request({"prompt": "x", "juice": {"method": "june", "direction": "sideways"}}, server=two_files)
