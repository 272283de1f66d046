"""Run inside vLLM's environment (tests/test_vllm.py starts it): greedy tokens of the requests in
a JSON file through vLLM's offline `LLM` with juice's plugin, all in one batch ("mixed") and each
alone. Usage: python run_offline.py IN.json OUT.json (the plugin's set-up comes from the
environment: JUICE_VLLM_HEADS, JUICE_VLLM_DUAL_RUN)."""

import json
import sys
import time


def main() -> None:
    spec = json.load(open(sys.argv[1]))
    from vllm import LLM, SamplingParams

    started = time.perf_counter()
    llm = LLM(model=spec["model"], dtype="float32", enforce_eager=True, enable_prefix_caching=False, seed=0,
              max_model_len=spec.get("max_model_len", 256), max_num_seqs=spec.get("max_num_seqs", 32),
              gpu_memory_utilization=0.5, **spec.get("llm", {}))
    load_s = time.perf_counter() - started

    def params(request):
        extra = {"juice": request["juice"]} if request.get("juice") is not None else None
        return SamplingParams(max_tokens=request["max_tokens"], temperature=0.0, ignore_eos=True, extra_args=extra)

    prompts = [{"prompt_token_ids": r["prompt_token_ids"]} for r in spec["requests"]]
    out = {"load_s": load_s}
    if "mixed" in spec.get("modes", ["mixed", "alone"]):
        results = llm.generate(prompts, [params(r) for r in spec["requests"]], use_tqdm=False)
        out["mixed"] = [list(r.outputs[0].token_ids) for r in results]
    if "alone" in spec.get("modes", ["mixed", "alone"]):
        out["alone"] = [list(llm.generate([p], [params(r)], use_tqdm=False)[0].outputs[0].token_ids)
                        for p, r in zip(prompts, spec["requests"])]
    errors = []
    for bad in spec.get("bad", []):
        try:
            llm.generate(prompts[:1], [params({"max_tokens": 2, "juice": bad})], use_tqdm=False)
            errors.append(None)
        except Exception as err:   # vLLM raises the processor's ValueError at admission
            errors.append(f"{type(err).__name__}: {err}")
    out["bad"] = errors
    if spec.get("bad"):   # the engine still serves after refusing them
        out["after_bad"] = list(llm.generate(prompts[:1], [params(spec["requests"][0])],
                                             use_tqdm=False)[0].outputs[0].token_ids)
    json.dump(out, open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
