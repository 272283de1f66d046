"""Tiny randomly initialised models of every supported architecture, built from configs.

No download: each model is built with `AutoModelForCausalLM.from_config` and a word-level
tokenizer made here. float32, as the real models run; equality tests allow float32 rounding (1e-5).

`JUICE_TEST_DEVICE` (default `cpu`) names the device the tiny models run on: `cpu`, `cuda`,
`cuda:N`, `mps` or `auto` (checked by :func:`juice.models.resolve_device`). `build_tiny` and the
fixtures `tiny_models`, `tiny`, `tiny_llama` and `tiny_gemma3` put their models there, and the
tests build their own inputs on `lm.device` and compare results on the CPU. A device this machine
does not have (`cuda` without a GPU) skips every test that needs a tiny model, with the reason;
the tests that need none still run. The embedded real model (`real_model`) is not affected.

`JUICE_TEST_ATTENTION` (`sdpa` or `eager`; default: transformers' default, sdpa) names the
attention implementation of the tiny models (Gemma 2 always runs eager: its sdpa path drops the
attention-logit soft-capping). `benchmarks/gpu_check.sh` runs the engine's tests under both.

`JUICE_TEST_ARCHITECTURES` (comma-separated; default every one of :data:`TINY_CONFIGS`) narrows the
architectures the `tiny` fixture runs over: the GPU check's dry run runs its tests on one.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

from juice.models import LoadedModel, resolve_device, wrap_model

pytest.register_assert_rewrite("helpers")   # the shared helpers' asserts explain themselves as a test's do

VOCAB = 160
SHARED = Path(__file__).resolve().parents[1].parent / "shared"

WORDS = (
    "the of is a capital city name france paris germany berlin japan tokyo spain madrid italy rome "
    "plays sport tennis golf basketball author book was written by official language french german "
    "question answer what who where . , ? : ! known for its vibrant culture heart country visitors "
    "and in on to as it are located headquarters company founded The France Paris"
).split()
"""The last three make the load-time self-check's sentence tokenize without unknown words."""


def make_tokenizer(eos_token: str = "<eos>") -> PreTrainedTokenizerFast:
    """The tiny models' word-level tokenizer; `eos_token` names the word it stops at."""
    specials = ["<pad>", "<bos>", "<eos>", "<unk>"]
    vocab = {w: i for i, w in enumerate(specials + WORDS + [f"w{i}" for i in range(VOCAB)])}
    vocab = {w: i for w, i in vocab.items() if i < VOCAB}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    tok.decoder = decoders.WordPiece(prefix="##")
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token=eos_token, pad_token="<pad>", unk_token="<unk>"
    )


COMMON = dict(vocab_size=VOCAB, max_position_embeddings=256, initializer_range=0.2, bos_token_id=1,
              eos_token_id=2, pad_token_id=0)
LLAMA_LIKE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, **COMMON)

TINY_CONFIGS: dict[str, dict] = {
    "llama": dict(LLAMA_LIKE),
    "mistral": dict(LLAMA_LIKE, sliding_window=6),
    "qwen2": dict(LLAMA_LIKE),
    "gemma": dict(LLAMA_LIKE, head_dim=16),
    "gemma2": dict(LLAMA_LIKE, head_dim=16, sliding_window=6, attn_logit_softcapping=5.0,
                   final_logit_softcapping=30.0),
    "gemma3_text": dict(LLAMA_LIKE, head_dim=16, sliding_window=6,
                        layer_types=["sliding_attention", "sliding_attention", "full_attention"]),
    "phi": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4, **COMMON),
    "phi3": dict(LLAMA_LIKE),
    "stablelm": dict(LLAMA_LIKE),
    "olmo": dict(LLAMA_LIKE),
    "olmo2": dict(LLAMA_LIKE),
    "gpt2": dict(n_embd=32, n_layer=3, n_head=4, n_positions=256, vocab_size=VOCAB, initializer_range=0.2,
                 bos_token_id=1, eos_token_id=2, pad_token_id=0),
    "gpt_neox": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4, **COMMON),
}


def _resolve_test_device() -> tuple[torch.device | None, str]:
    """(the device `JUICE_TEST_DEVICE` names, "") or (None, why it cannot be used here)."""
    name = os.environ.get("JUICE_TEST_DEVICE", "").strip() or "cpu"
    try:
        return resolve_device(name), ""
    except ValueError as err:
        return None, f"JUICE_TEST_DEVICE={name!r} is not available here: {err}"


TEST_DEVICE, TEST_DEVICE_UNAVAILABLE = _resolve_test_device()
TEST_ARCHITECTURES = tuple(a.strip() for a in os.environ.get("JUICE_TEST_ARCHITECTURES", "").split(",")
                           if a.strip()) or tuple(sorted(TINY_CONFIGS))
if set(TEST_ARCHITECTURES) - set(TINY_CONFIGS):
    raise pytest.UsageError(f"JUICE_TEST_ARCHITECTURES names unknown architectures "
                            f"{sorted(set(TEST_ARCHITECTURES) - set(TINY_CONFIGS))}; known: {sorted(TINY_CONFIGS)}")
TEST_ATTENTION = os.environ.get("JUICE_TEST_ATTENTION", "").strip() or None
if TEST_ATTENTION not in (None, "sdpa", "eager"):
    raise pytest.UsageError(f"JUICE_TEST_ATTENTION must be sdpa or eager, not {TEST_ATTENTION!r}")


def tiny_device() -> torch.device:
    """The device the tiny models run on; skips the calling test (or module, when called at import
    time) if `JUICE_TEST_DEVICE` names a device this machine does not have."""
    if TEST_DEVICE is None:
        pytest.skip(TEST_DEVICE_UNAVAILABLE, allow_module_level=True)
    return TEST_DEVICE


TIERS = ("unit", "integration", "slow")
"""The test folders, each its tier's marker: `unit` (no model: `pytest -m unit`, seconds),
`integration` (tiny random models: `pytest -m "not slow"`, minutes), `slow` (the embedded models,
vLLM); a test marked `slow` (or `integration`) in a faster folder keeps its own marker. A test
marked `long` (minutes each: exhaustive matrices, exact Stage 1 on a real model) is also `slow`
and is left out of `pytest` unless asked for (`pytest -m long`; pyproject's addopts)."""


def pytest_collection_modifyitems(config, items) -> None:
    """Tiers, as TransformerLens has them, by folder (:data:`TIERS`); `pytest` runs them all but
    the `long` tests (the README's test command, CI)."""
    for item in items:
        if item.get_closest_marker("vllm") is not None or item.get_closest_marker("long") is not None:
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("slow") is not None or item.get_closest_marker("integration") is not None:
            continue
        folder = Path(str(item.fspath)).parent.name
        item.add_marker(getattr(pytest.mark, folder if folder in TIERS else "integration"))


def pytest_report_header(config) -> str:
    return f"juice tiny models on: {TEST_DEVICE or TEST_DEVICE_UNAVAILABLE}, attention {TEST_ATTENTION or 'default'}"


def build_tiny(model_type: str, seed: int = 0, *, device: str | torch.device | None = None,
               dtype: torch.dtype = torch.float32, attention: str | None = None) -> LoadedModel:
    """A tiny random model of `model_type` on the test device (`JUICE_TEST_DEVICE`; skips if that
    device is not available) or on `device`, in `dtype`, with `attention` (default
    `JUICE_TEST_ATTENTION`; Gemma 2 always eager). Weights are drawn in fp32 on the CPU, so every
    device and dtype gets the same model."""
    device = tiny_device() if device is None else device
    config = AutoConfig.for_model(model_type, **TINY_CONFIGS[model_type])
    torch.manual_seed(seed)
    attn = "eager" if model_type == "gemma2" else attention or TEST_ATTENTION
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=torch.float32)
    return wrap_model(model.to(device=device, dtype=dtype), make_tokenizer(), name=f"tiny-{model_type}")


@pytest.fixture(scope="session")
def tiny_models() -> dict[str, LoadedModel]:
    """The session's cache of tiny models by architecture (each on the test device)."""
    tiny_device()
    return {}


@pytest.fixture(params=TEST_ARCHITECTURES)
def tiny(request, tiny_models) -> LoadedModel:
    """One tiny model per architecture (parametrized over all of them, or `JUICE_TEST_ARCHITECTURES`)."""
    if request.param not in tiny_models:
        tiny_models[request.param] = build_tiny(request.param)
    return tiny_models[request.param]


@pytest.fixture(scope="session")
def tiny_llama() -> LoadedModel:
    return build_tiny("llama")


@pytest.fixture(scope="session")
def tiny_gemma3() -> LoadedModel:
    return build_tiny("gemma3_text")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    path = SHARED / "data"
    if not path.is_dir():
        pytest.skip(f"reference data not found at {path} (../shared/data beside the checkout)")
    return path


@pytest.fixture(scope="session")
def real_model() -> LoadedModel:
    """The embedded Gemma 3 270M (slow: dequantizes once, then loads the cached copy)."""
    if os.environ.get("JUICE_SKIP_REAL_MODEL"):
        pytest.skip("JUICE_SKIP_REAL_MODEL is set")
    from juice.models import load_model

    return load_model("gemma-3-270m")
