"""Speed on a GPU: juice's batched KV-cached decoding against Hugging Face `generate`, JuICE's step
against the plain step, exact Stage 1 head scores per second and batched evaluation rows per
second (issue 14's and issue 48's targets).

Per-step time = (time for 1 + N new tokens - time for 1 new token) / N, so prefill cancels. For
each batch size and each decoding path (the dynamic KV cache, the static one, the static one with
the step compiled: CUDA graphs on CUDA): plain (steering off) juice decoding / HF `generate`
(target <= 1x), and JuICE / plain (target <= 1.1x); and the batch-1 step against the 15.7 ms
measured on one H100 before (target 3x faster). The reference of every ratio is measured in the
same run, on the same model and prompts.

Models:
- default: the embedded Gemma 3 270M (its GGUF must be installed);
- `--random`: Gemma 3 270M's config from the GGUF, random weights (the GGUF's tokenizer);
- `--config gemma-3-270m | gemma-2b | llama-2-7b`: a built-in config (:data:`CONFIGS`; Gemma 3
  270M's is the GGUF's, checked by tests/integration/test_benchmarks.py; Gemma 2B and Llama 2 7B are
  the paper's model classes, their published configs), random weights and a word-level tokenizer
  over the benchmark's prompts:
  no file needs to travel to the GPU machine. Timing only: the outputs are meaningless.

Without CUDA it prints "skipped" and exits 0, unless `--device cpu` asks for a CPU run (a check
of the script itself; the targets are for a GPU). `--json PATH` writes every figure.

Run: python benchmarks/bench_gpu.py [--device cuda|cpu] [--dtype bf16|fp32]
     [--random | --config gemma-3-270m|gemma-2b|llama-2-7b] [--batches 1,16,64] [--new 32] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from juice.data.paraconflict import build_domain
from juice.engine import Stream, generate
from juice.interventions import Head, HeadSelection
from juice.models import LoadedModel, load_model, wrap_model
from juice.steering import Steering, steering_coefficients
from juice.tokens import encode

BEFORE_MS = 15.7   # batch-1 fp32 step on one H100 before this work (issue 14)

_GEMMA3_LAYERS = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(18)]
CONFIGS: dict[str, dict] = {
    # the embedded GGUF's config (transformers 5.24), the fields that shape the computation
    "gemma-3-270m": dict(model_type="gemma3_text", hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
                         num_attention_heads=4, num_key_value_heads=1, head_dim=256, vocab_size=262144,
                         sliding_window=512, layer_types=_GEMMA3_LAYERS, query_pre_attn_scalar=256,
                         max_position_embeddings=32768, hidden_activation="gelu_pytorch_tanh",
                         rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                          "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}},
                         tie_word_embeddings=True),
    # Gemma 1 2B (google/gemma-2b's config.json): the paper's Gemma-2b class, 2.5 B parameters
    "gemma-2b": dict(model_type="gemma", hidden_size=2048, intermediate_size=16384, num_hidden_layers=18,
                     num_attention_heads=8, num_key_value_heads=1, head_dim=256, vocab_size=256000,
                     max_position_embeddings=8192, hidden_activation="gelu_pytorch_tanh", rope_theta=10000.0,
                     tie_word_embeddings=True),
    # Llama 2 7B (meta-llama/Llama-2-7b-hf's config.json): the paper's Llama-2-7b, 6.7 B parameters
    "llama-2-7b": dict(model_type="llama", hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096,
                       rms_norm_eps=1e-5, rope_theta=10000.0, hidden_act="silu", tie_word_embeddings=False),
}
"""Built-in configs for random-weight timing runs (module docstring)."""

SELECTION = HeadSelection((Head(6, 3), Head(9, 3), Head(8, 3), Head(10, 0), Head(3, 2)), (Head(8, 1), Head(3, 3)))
"""Stage 1's heads on World Capital for the embedded model (NOTES.md); valid in both configs."""


def random_gemma(device: str, dtype: torch.dtype) -> LoadedModel:
    """Gemma 3 270M's architecture with random weights (config and tokenizer from the GGUF)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from juice.models import EMBEDDED_MODELS

    gguf = EMBEDDED_MODELS["gemma-3-270m"][1]()
    config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype).to(device).eval()
    tokenizer.padding_side = "left"
    return wrap_model(model, tokenizer, name="gemma-3-270m (random weights)")


def word_tokenizer(texts: list[str], vocab_size: int):
    """A word-level tokenizer over the words of `texts` (ids below `vocab_size`; <bos> added)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    split = pre_tokenizers.Whitespace()
    words = sorted({w for t in texts for w, _ in split.pre_tokenize_str(t)})
    vocab = {w: i for i, w in enumerate(["<pad>", "<bos>", "<eos>", "<unk>", *words][:vocab_size])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = split
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    tok.decoder = decoders.WordPiece(prefix="##")
    out = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                                  unk_token="<unk>")
    out.padding_side = "left"
    return out


def benchmark_texts() -> list[str]:
    """World Capital's prompts and answers: what the benchmarks' word-level tokenizer covers."""
    examples = build_domain("world_capital")
    return [p for ex in examples for p in ex.prompts.values()] + [a for ex in examples for a in
                                                                  (*ex.answers, ex.context_answer)]


def config_model(name: str, device: str, dtype: torch.dtype, fields: dict | None = None) -> LoadedModel:
    """A built-in config (:data:`CONFIGS`, or `fields` in its place) with random weights (seed 0),
    built on `device`, and a word-level tokenizer over :func:`benchmark_texts`.

    Raises:
        KeyError: an unknown config name.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(CONFIGS[name] if fields is None else fields)
    config = AutoConfig.for_model(fields.pop("model_type"), bos_token_id=1, eos_token_id=2, pad_token_id=0, **fields)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    return wrap_model(model, word_tokenizer(benchmark_texts(), config.vocab_size), name=f"{name} (random weights)")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device, repeats: int = 3) -> float:
    """Best of `repeats` wall times of `fn()` (after one warm-up call), in seconds."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        best = min(best, time.perf_counter() - start)
    return best


def per_step(run, n_new: int, device: torch.device) -> float:
    """Seconds per decoding step of `run(n_tokens)`, prefill removed."""
    return (timed(lambda: run(1 + n_new), device) - timed(lambda: run(1), device)) / n_new


def decoding(lm: LoadedModel, batches: list[int], n_new: int, paths=("dynamic", "static", "compiled"),
             emit=print) -> list[dict]:
    """Per batch size and decoding path: HF `generate`'s, plain juice's and JuICE's ms per step
    and the two ratios (module docstring)."""
    device = lm.device
    examples = build_domain("world_capital")
    juice = Steering("add", steering_coefficients(lm.heads.geometry, SELECTION, 2.0, -1.0))
    rows = []
    for b in batches:
        prompts = [examples[i % len(examples)].prompts["substitution"] for i in range(b)]
        batch = encode(lm.tokenizer, prompts).to(device)

        def ours(n, steering=Steering(), kv_cache="dynamic", compiled=False):
            return generate(lm, prompts, [Stream(i, steering) for i in range(b)], n, max_rows=2 * b,
                            kv_cache=kv_cache, compile_step=compiled)

        def hf(n):
            with torch.inference_mode():
                return lm.model.generate(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                                         max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                         pad_token_id=lm.tokenizer.pad_token_id)

        reference = per_step(hf, n_new, device)
        emit(f"batch {b:>3}: HF generate {1e3 * reference:.2f} ms/step")
        for path in paths:
            kv_cache, compiled = {"dynamic": ("dynamic", False), "static": ("static", False),
                                  "compiled": ("static", True)}[path]
            plain = per_step(lambda n: ours(n, kv_cache=kv_cache, compiled=compiled), n_new, device)
            steered = per_step(lambda n: ours(n, juice, kv_cache, compiled), n_new, device)
            row = {"batch": b, "path": path, "hf_ms": 1e3 * reference, "plain_ms": 1e3 * plain,
                   "juice_ms": 1e3 * steered, "plain_over_hf": plain / reference, "juice_over_plain": steered / plain,
                   "targets": {"plain_over_hf": 1.0, "juice_over_plain": 1.1}}
            rows.append(row)
            emit(f"  {path:<9} plain {row['plain_ms']:.2f} ms/step = {row['plain_over_hf']:.2f}x HF [target <= 1x]; "
                 f"JuICE {row['juice_ms']:.2f} ms/step = {row['juice_over_plain']:.2f}x plain [target <= 1.1x]")
            if b == 1:
                emit(f"  {'':<9} batch-1 step {BEFORE_MS / row['plain_ms']:.2f}x faster than the {BEFORE_MS} ms "
                     f"before [target >= 3x; a GPU figure]")
    return rows


def stage1_rate(lm: LoadedModel, n_prompts: int, max_rows: int = 256) -> dict:
    """Exact Stage 1 (:func:`juice.stage1.score_heads`, every head, the paper's alphas) on the
    first prompts of World Capital's D: head-alpha scores per second."""
    from juice.stage1 import ALPHAS_NEGATIVE, ALPHAS_POSITIVE, score_heads, scoring_prompts

    prompts = scoring_prompts(lm, build_domain("world_capital")[:n_prompts], conflict_types=("substitution",))
    g = lm.heads.geometry
    seconds = timed(lambda: score_heads(lm, prompts, max_rows=max_rows), lm.device, repeats=1)
    scores = len(prompts) * g.n_layers * g.n_heads * (len(ALPHAS_POSITIVE) + len(ALPHAS_NEGATIVE))
    return {"prompts": len(prompts), "scores": scores, "seconds": seconds, "scores_per_s": scores / seconds}


def evaluation_rate(lm: LoadedModel, n_examples: int, batches: list[int]) -> list[dict]:
    """Batched evaluation (:func:`juice.eval.runner.evaluate`, Original and JuICE, three conflict
    types) at `max_rows` = each batch size: rows (item x type x method) per second."""
    from juice.eval.runner import evaluate
    from juice.recipe import Method

    examples = build_domain("world_capital")[:n_examples]
    methods = {"Original": Method(), "JuICE": Method(Steering("add", steering_coefficients(
        lm.heads.geometry, SELECTION, 2.0, -1.0)))}
    out = []
    for b in batches:
        seconds = timed(lambda: evaluate(lm, examples, methods, max_rows=b), lm.device, repeats=1)
        rows = len(examples) * 3 * len(methods)
        out.append({"max_rows": b, "rows": rows, "seconds": seconds, "rows_per_s": rows / seconds})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    parser.add_argument("--random", action="store_true")
    parser.add_argument("--config", choices=sorted(CONFIGS))
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("skipped: no CUDA device (pass --device cpu to check the script on the CPU)")
        return 0
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    lm = (config_model(args.config, args.device, dtype) if args.config else
          random_gemma(args.device, dtype) if args.random else load_model("gemma-3-270m", device=args.device, dtype=dtype))
    batches = [int(x) for x in args.batches.split(",")]
    print(f"{lm.name} on {lm.device} ({args.dtype}), {args.new} new tokens; per-step times, prefill removed")
    record = {"model": lm.name, "device": str(lm.device), "dtype": args.dtype, "new_tokens": args.new,
              "decoding": decoding(lm, batches, args.new)}
    if args.json:
        args.json.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
