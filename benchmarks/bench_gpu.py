"""Decoding speed on a GPU: juice's batched KV-cached decoding against Hugging Face `generate`, and
JuICE's step against the plain step, on Gemma 3 270M (issue 14's targets).

Per-step time = (time for 1 + N new tokens - time for 1 new token) / N, so prefill cancels. For
each batch size and each decoding path (the dynamic KV cache, the static one, the static one with
the step compiled: CUDA graphs on CUDA): plain (steering off) juice decoding / HF `generate`
(target <= 1x), and JuICE / plain (target <= 1.1x); and the batch-1 step against the 15.7 ms
measured on one H100 before (target 3x faster). The reference of every ratio is measured in the
same run.

Without CUDA it prints "skipped" and exits 0, unless `--device cpu` asks for a CPU run (a check
of the script itself; the targets are for a GPU). `--random` builds the model from Gemma 3 270M's
config with random weights (no weights need to travel to the GPU machine; timing only).

Run: python benchmarks/bench_gpu.py [--device cuda|cpu] [--dtype bf16|fp32] [--random]
     [--batches 1,16,64] [--new 32]
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from juice.data.paraconflict import build_domain
from juice.engine import Stream, generate
from juice.interventions import HeadSelection
from juice.interventions import Head
from juice.models import LoadedModel, load_model, wrap_model
from juice.steering import Steering, steering_coefficients
from juice.tokens import encode

BEFORE_MS = 15.7   # batch-1 fp32 step on one H100 before this work (issue 14)


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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    parser.add_argument("--random", action="store_true")
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--new", type=int, default=32)
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("skipped: no CUDA device (pass --device cpu to check the script on the CPU)")
        return
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    lm = random_gemma(args.device, dtype) if args.random else load_model("gemma-3-270m", device=args.device, dtype=dtype)
    device = lm.device
    examples = build_domain("world_capital")
    sel = HeadSelection((Head(6, 3), Head(9, 3), Head(8, 3), Head(10, 0), Head(3, 2)), (Head(8, 1), Head(3, 3)))
    juice = Steering("juice", steering_coefficients(lm.heads.geometry, sel, 2.0, -1.0))
    print(f"{lm.name} on {device} ({args.dtype}), {args.new} new tokens; per-step times, prefill removed")
    for b in (int(x) for x in args.batches.split(",")):
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

        reference = per_step(hf, args.new, device)
        print(f"batch {b:>3}: HF generate {1e3 * reference:.2f} ms/step")
        for label, kv_cache, compiled in (("dynamic cache", "dynamic", False), ("static cache", "static", False),
                                          ("static + compiled step", "static", True)):
            plain = per_step(lambda n: ours(n, kv_cache=kv_cache, compiled=compiled), args.new, device)
            steered = per_step(lambda n: ours(n, juice, kv_cache, compiled), args.new, device)
            print(f"  {label:<24} plain {1e3 * plain:.2f} ms/step = {plain / reference:.2f}x HF [target <= 1x]; "
                  f"JuICE {1e3 * steered:.2f} ms/step = {steered / plain:.2f}x plain [target <= 1.1x]")
            if b == 1:
                print(f"  {'':<24} batch-1 step {BEFORE_MS / (1e3 * plain):.2f}x faster than the {BEFORE_MS} ms "
                      f"before [target >= 3x; a GPU figure]")


if __name__ == "__main__":
    sys.exit(main())
