"""The KV cache salt juice's scheduler sets in vLLM's engine core (:mod:`juice.vllm.scheduler`;
issue 46, part 2): derived from the request's own steering, whatever salt it arrived with, so a
request built by hand, or with a salt copied from another request, is cached under its own
steering's salt; and the steering admission resolves once for the engine core and the worker
(:func:`juice.vllm.options.admit`; issue 91). Runs without vLLM (a request is anything with vLLM's
`Request` attributes); tests/integration/test_vllm.py runs the scheduler inside vLLM."""

from __future__ import annotations

import os
import subprocess
from types import SimpleNamespace

import pytest

from juice.interventions import Head, HeadSelection
from juice.stage1.heads_file import HeadsArtifact, save_heads
from juice.vllm.launch import find_vllm_python
from juice.vllm.options import (SALT_PREFIX, WIRE_KEY, admit, plugin_heads, request_ask, request_cache_salt,
                                steering_salt)
from juice.vllm.scheduler import SaltsSteeredRequests, effective_salt, salt_request

VLLM_PYTHON = find_vllm_python(required=False)
MODEL = {"name": "m", "model_type": "llama", "n_layers": 4, "n_heads": 4, "head_dim": 32}
JUNE = {"method": "june", "direction": "context", "beta_plus": 1.0, "beta_minus": 0.0}
JUICE = {"method": "juice", "direction": "parametric", "beta_plus": 2.0, "beta_minus": 0.0}


@pytest.fixture
def server(tmp_path):
    files = []
    for direction, selection in [("parametric", HeadSelection((Head(1, 0),), (Head(1, 2),))),
                                 ("contextual", HeadSelection((Head(2, 1),), (Head(1, 3),)))]:
        save_heads(HeadsArtifact(MODEL, direction, 1, [1.0], [-1.0], selection), tmp_path / f"{direction}.json")
        files.append(str(tmp_path / f"{direction}.json"))
    return plugin_heads({"JUICE_VLLM_HEADS": os.pathsep.join(files)})


class FakeRequest:
    """vLLM's `Request` as the scheduler uses it, admitted on `server` as vLLM's admission does
    (`extra_args` with the resolved steering; `server=None`: as it arrived, no admission): the
    block hashes are recomputed from the salt."""

    def __init__(self, extra_args, cache_salt=None, request_id="r", server=None):
        self.request_id, self.cache_salt = request_id, cache_salt
        self.sampling_params = SimpleNamespace(extra_args=extra_args if server is None else admit(extra_args, server))
        self.block_hashes = []
        self.update_block_hashes()

    def update_block_hashes(self):
        self.block_hashes.extend([("block", 0, self.cache_salt), ("block", 1, self.cache_salt)])


def salt_of(fields, server):
    return steering_salt(request_ask(fields, server), server)


def test_a_steered_request_is_cached_under_its_steerings_salt_however_it_arrived(server):
    june, juice = salt_of(JUNE, server), salt_of(JUICE, server)
    for arrived in (None, ""):   # built by hand (a plain prompt with a steered request's extra_args)
        request = FakeRequest({"juice": JUNE}, arrived, server=server)
        salt_request(request, server)
        assert request.cache_salt == june
        assert request.block_hashes == [("block", 0, june), ("block", 1, june)]   # rehashed, not appended
    copied = FakeRequest({"juice": JUNE}, juice, server=server)   # another steering's salt: a client salt like any
    salt_request(copied, server)
    assert copied.cache_salt == request_cache_salt(june, juice) not in (june, juice)
    flat = FakeRequest({f"juice_{k}": v for k, v in JUNE.items()}, server=server)   # vLLM's own vllm_xargs form
    salt_request(flat, server)
    assert flat.cache_salt == june
    tenant = FakeRequest({"juice": JUNE}, "tenant-a", server=server)   # the client's salt is kept, combined
    salt_request(tenant, server)
    assert tenant.cache_salt == request_cache_salt(june, "tenant-a") != june


def test_original_keeps_the_clients_salt_unless_it_could_name_a_steered_block(server):
    for extra, arrived in [(None, None), (None, "tenant-a"), ({"juice": {"method": "original"}}, "tenant-a")]:
        request = FakeRequest(extra, arrived, server=server)
        salt_request(request, server)
        assert request.cache_salt == arrived and len(request.block_hashes) == 2
    copied = salt_of(JUICE, server)
    assert copied.startswith(SALT_PREFIX)
    request = FakeRequest(None, copied, server=server)   # an Original request trying a JuICE request's salt
    salt_request(request, server)
    assert request.cache_salt != copied and request.block_hashes[0] == ("block", 0, request.cache_salt)
    assert effective_salt(admit(None, server), copied, server) == request.cache_salt   # Originals still share


def test_the_servers_default_steering_salts_a_request_without_fields(server, tmp_path):
    default = plugin_heads({"JUICE_VLLM_HEADS": os.pathsep.join(server.files.values()),
                            "JUICE_VLLM_DEFAULT": "method:june,direction:context,beta_plus:1,beta_minus:0"})
    assert effective_salt(admit(None, default), None, default) == salt_of(JUNE, server) is not None
    assert effective_salt(admit({"juice": {"method": "original"}}, default), None, default) is None


def test_the_engine_core_salts_from_admissions_steering_and_resolves_only_what_was_not_admitted(server):
    """Issue 91: an admitted request's salt comes from the steering admission resolved, not from
    its fields, which the engine core does not read (fields it could not parse change nothing). A
    request handed to the engine without admission is resolved from its fields, as before; fields
    that do not resolve leave its salt as it is (never raises in the engine core)."""
    admitted = admit({"juice": JUNE}, server)
    request = FakeRequest({**admitted, "juice": {"method": "jucie"}})
    salt_request(request, server)
    assert request.cache_salt == salt_of(JUNE, server)
    request = FakeRequest({"juice": JUNE})   # no admission
    salt_request(request, server)
    assert request.cache_salt == salt_of(JUNE, server)
    request = FakeRequest({"juice": {"method": "jucie"}}, "kept")
    salt_request(request, server)
    assert request.cache_salt == "kept" and len(request.block_hashes) == 2


def test_admission_resolves_a_request_once_and_overwrites_a_steering_the_caller_sent(server, monkeypatch):
    """Issue 91: :func:`juice.vllm.options.admit` writes the canonical steering (kind, per-head
    coefficients, salt) over any a caller put in `extra_args`; the same fields on the same server
    are parsed once per process (the middleware's check, then vLLM's admission); wrong fields are
    refused in one line."""
    from juice import steering_request
    from juice.steering_request import SteeringRequestError
    from juice.vllm import options

    forged = {"juice": JUNE, WIRE_KEY: {"method": "original", "kind": "none", "heads": [], "salt": None}}
    wire = admit(forged, server)[WIRE_KEY]
    assert wire["kind"] == "scale" and wire["salt"] == salt_of(JUNE, server)
    assert wire["heads"] == ((2, 1, 1.0),)   # JuNE's +1 at the contextual file's L2H1 (beta- = 0 at L1H3)
    assert admit(admit(forged, server), server) == admit(forged, server)   # a second admission writes it alike
    parses = []
    monkeypatch.setattr(options, "read_steering", lambda *a: parses.append(a) or steering_request.read_steering(*a))
    fields = {"method": "juice", "direction": "parametric", "beta_plus": 1.5, "beta_minus": -0.5}
    first, second = admit({"juice": fields}, server), admit({"juice": dict(fields)}, server)
    assert first == second and len(parses) == 1
    admit({"juice": {**fields, "beta_plus": 1}}, server)   # another request's fields: parsed
    assert len(parses) == 2
    with pytest.raises(SteeringRequestError, match="juice.method must be one of"):
        admit({"juice": {"method": "jucie"}}, server)


def test_the_scheduler_salts_new_requests_before_vllms_add_request_and_not_a_sessions_next_chunk(server):
    """The mixin salts from admission's steering before vLLM hashes a lookup, and reads the served
    heads from vLLM's config (`additional_config`, as every engine core of a data-parallel or
    multi-node vLLM gets them) for a request handed over without admission."""
    from juice.vllm.options import CONFIG_KEY, config_entry

    seen = []

    class VllmScheduler:   # vLLM's scheduler as the mixin meets it
        def __init__(self, vllm_config, **kwargs):
            self.requests = {}

        def add_request(self, request):
            seen.append((request.request_id, request.cache_salt, request.block_hashes[0]))
            self.requests.setdefault(request.request_id, request)

    class Scheduler(SaltsSteeredRequests, VllmScheduler):
        pass

    entry = config_entry({"JUICE_VLLM_HEADS": os.pathsep.join(server.files.values())})
    scheduler = Scheduler(vllm_config=SimpleNamespace(additional_config={CONFIG_KEY: entry}), log_stats=False)
    june = salt_of(JUNE, server)
    scheduler.add_request(FakeRequest({"juice": JUNE}, None, "a", server))
    scheduler.add_request(FakeRequest({"juice": JUNE}, "unchanged", "a", server))   # a streaming session's next chunk
    scheduler.add_request(FakeRequest({"juice": JUNE}, None, "b"))   # handed over without admission: the config's heads
    assert seen == [("a", june, ("block", 0, june)), ("a", "unchanged", ("block", 0, "unchanged")),
                    ("b", june, ("block", 0, june))]


def test_a_streaming_sessions_chunk_changes_its_steering_only_when_the_resolved_steering_differs(server):
    """Issue 65: what the scheduler refuses in a streaming session's later chunk (the refusal itself
    runs in vLLM: tests/slow/test_vllm_streaming_input.py). Equal fields, or none where the first
    chunk had none, are no change; another method, beta or direction is; a client salt is not
    steering; fields vLLM's admission would refuse count as a change."""
    from juice.vllm.scheduler import steering_changed

    juice = FakeRequest({"juice": JUICE}, server=server)
    assert not steering_changed(juice, FakeRequest({"juice": dict(JUICE)}, "another client salt", server=server),
                                server)
    assert not steering_changed(FakeRequest(None, server=server), FakeRequest(None, server=server), server)
    for other in (None, {"juice": {**JUICE, "beta_plus": 3.0}}, {"juice": {**JUICE, "method": "june"}},
                  {"juice": {**JUICE, "direction": "contextual"}}):
        assert steering_changed(juice, FakeRequest(other, server=server), server), other
    assert steering_changed(FakeRequest(None, server=server), juice, server)
    assert not steering_changed(juice, FakeRequest({"juice": JUICE}), server)   # a chunk no admission resolved
    assert steering_changed(juice, FakeRequest({"juice": {"method": "jucie"}}), server)   # ... and cannot be


@pytest.mark.skipif(VLLM_PYTHON is None, reason="no vLLM environment (run scripts/install-vllm.sh)")
def test_vllms_own_request_is_rehashed_as_if_it_had_arrived_with_the_salt(server):
    """vLLM's `Request` with its prefix-cache block hasher: after :func:`salt_request`, a request
    that arrived unsalted has the block hashes of the same request sent with its steering's salt
    (what vLLM's prefix cache looks up), and a different one from an Original request's. And the
    scheduler is vLLM's `AsyncScheduler` or `Scheduler` as the engine's `async_scheduling` says."""
    code = f"""
import json, os
from vllm import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request
from juice.vllm.options import admit, plugin_heads
from juice.vllm.scheduler import _scheduler_class, effective_salt, salt_request
hash_fn = get_hash_fn_by_name("sha256")
init_none_hash(hash_fn)
hasher = get_request_block_hasher(4, hash_fn)
server = plugin_heads({{"JUICE_VLLM_HEADS": {os.pathsep.join(server.files.values())!r}}})
extra = {{"juice": {JUNE!r}}}
def request(salt, extra_args):
    return Request("r", list(range(10)), SamplingParams(max_tokens=1, extra_args=extra_args), None,
                   cache_salt=salt, block_hasher=hasher)
plain = request(None, admit(extra, server))
before = list(plain.block_hashes)
salt_request(plain, server)
salted = request(effective_salt(admit(extra, server), None, server), extra)
original = request(None, None)
print("HASHES", len(before), plain.block_hashes == salted.block_hashes, before == original.block_hashes,
      plain.block_hashes != before)
print("CLASSES", issubclass(_scheduler_class(True), AsyncScheduler), issubclass(_scheduler_class(False), Scheduler),
      issubclass(_scheduler_class(False), AsyncScheduler))
"""
    done = subprocess.run([VLLM_PYTHON, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "HASHES 2 True True True" in done.stdout, done.stdout   # 10 tokens: two full blocks of 4
    assert "CLASSES True True False" in done.stdout, done.stdout
