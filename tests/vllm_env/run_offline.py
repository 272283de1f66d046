"""Run inside vLLM's environment (tests/slow/test_vllm_runs.py starts it): the tokens of the requests in a
JSON file through vLLM's offline `LLM` with juice's plugin, all in one batch ("mixed"), each alone,
and, where the file asks, in turn ("sequence", one after another on one engine, for the prefix
cache) and arriving while others decode ("arrivals": request i joins at engine step
`arrive[i]`). Each request is built with `juice.vllm.offline_request`, or by hand where it says
`"plain"` (a plain prompt and `extra_args={"juice": ...}`: juice's scheduler salts both the same
way). Usage: python run_offline.py IN.json OUT.json (the plugin's set-up comes from the
environment: JUICE_VLLM_HEADS, JUICE_VLLM_DUAL_RUN; with "heads_in_config", the workers get it
from vLLM's additional_config and find no heads file)."""

import json
import sys
import time


def main() -> None:
    spec = json.load(open(sys.argv[1]))
    from vllm import LLM, SamplingParams

    from juice.vllm import LOGITS_PROCESSOR, SCHEDULER, offline_request

    options = {"dtype": "float32", "enforce_eager": True, "enable_prefix_caching": False, "seed": 0,
               "logits_processors": [LOGITS_PROCESSOR], "scheduler_cls": SCHEDULER,
               "max_model_len": spec.get("max_model_len", 256), "max_num_seqs": spec.get("max_num_seqs", 32),
               "gpu_memory_utilization": 0.5, **spec.get("llm", {})}
    hidden = []
    if spec.get("heads_in_config"):   # as on another node: the workers have no heads file, only vLLM's config
        import os

        from juice.vllm import llm_options
        from juice.vllm.options import plugin_heads

        options.update(llm_options())
        plugin_heads()   # admission (this process) read the files before they went away
        for path in os.environ["JUICE_VLLM_HEADS"].split(os.pathsep):
            os.rename(path, path + ".hidden")
            hidden.append(path)
    started = time.perf_counter()
    try:
        llm = LLM(model=spec["model"], **options)
    finally:
        for path in hidden:
            os.rename(path + ".hidden", path)
    load_s = time.perf_counter() - started

    def request(r):
        if r.get("plain"):
            prompt, extra = {"prompt_token_ids": r["prompt_token_ids"]}, {"juice": r["juice"]} if r.get("juice") else {}
        else:
            prompt, extra = offline_request({"prompt_token_ids": r["prompt_token_ids"]}, r.get("juice"))
        sampling = {"temperature": 0.0, "ignore_eos": True, **r.get("sampling", {})}
        return prompt, SamplingParams(max_tokens=r["max_tokens"], extra_args=extra or None, **sampling)

    def tokens(results):
        return [list(r.outputs[0].token_ids) for r in results]

    built = [request(r) for r in spec["requests"]]
    prompts, params = [b[0] for b in built], [b[1] for b in built]
    out = {"load_s": load_s}
    modes = spec.get("modes", ["mixed", "alone"])
    for mode in modes:   # in the order asked (the prefix cache remembers what ran before)
        if mode == "mixed":
            out["mixed"] = tokens(llm.generate(prompts, params, use_tqdm=False))
        elif mode == "alone":
            out["alone"] = [tokens(llm.generate([p], [q], use_tqdm=False))[0] for p, q in zip(prompts, params)]
        elif mode == "sequence":   # one after another; the prefix cache's counters after each
            out["sequence"], out["cache"] = [], []
            for p, q in zip(prompts, params):
                out["sequence"].append(tokens(llm.generate([p], [q], use_tqdm=False))[0])
                out["cache"].append(prefix_cache(llm))
        elif mode == "arrivals":
            out["arrivals"] = arrivals(llm, prompts, params, spec["arrive"])
    errors = []
    for bad in spec.get("bad", []):   # sent as they are: vLLM's admission answers
        try:
            extra = {"juice": bad} if bad is not None else None
            llm.generate(prompts[:1], [SamplingParams(max_tokens=2, extra_args=extra)], use_tqdm=False)
            errors.append(None)
        except Exception as err:   # vLLM raises the processor's ValueError at admission
            errors.append(f"{type(err).__name__}: {err}")
    out["bad"] = errors
    if spec.get("bad"):   # the engine still serves after refusing them
        out["after_bad"] = tokens(llm.generate(prompts[:1], params[:1], use_tqdm=False))[0]
    json.dump(out, open(sys.argv[2], "w"))


def arrivals(llm, prompts, params, arrive) -> list[list[int]]:
    """Each request's tokens when request i joins the engine at step `arrive[i]` (while the
    others decode)."""
    engine, finished, step = llm.llm_engine, {}, 0
    waiting = sorted(range(len(prompts)), key=lambda i: arrive[i])
    while waiting or engine.has_unfinished_requests():
        while waiting and arrive[waiting[0]] <= step:
            i = waiting.pop(0)
            engine.add_request(f"arrival-{i}", prompts[i], params[i])
        for result in engine.step():
            if result.finished:
                finished[int(result.request_id.split("-")[1])] = list(result.outputs[0].token_ids)
        step += 1
    return [finished[i] for i in range(len(prompts))]


def prefix_cache(llm) -> dict:
    """vLLM's prefix cache counters so far: {"queries": tokens looked up, "hits": tokens found}."""
    counts = {"queries": 0, "hits": 0}
    for metric in llm.get_metrics():
        for key in counts:
            if metric.name == f"vllm:prefix_cache_{key}":
                counts[key] += int(metric.value)
    return counts


if __name__ == "__main__":
    main()
