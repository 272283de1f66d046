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


def record_compilation() -> dict:
    """What vLLM compiles and runs of the steered model (JUICE_TEST_RECORD=1; issue 65): each
    `split_graph` call's pieces (whether a splitting piece, and the ops it calls), the forwards,
    those whose batch had a JuICE row, the calls of run 1's body, the CUDA graph replays, and the
    seconds spent building run 1's sub-batch (its host read of `query_start_loc`, on a GPU a
    synchronisation) over the calls that built one. The engine core and worker run in this
    process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so the records reach it. Returns the record,
    filled as vLLM runs."""
    import os
    import time

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import torch
    import vllm.compilation.backends as backends

    import juice.vllm.models as models

    record = {"splits": [], "forwards": 0, "forwards_with_juice": 0, "run1": 0, "graph_replays": 0,
              "sub_batches": 0, "sub_batch_s": 0.0}
    split = backends.split_graph

    def recording_split(graph, *args, **kwargs):
        result = split(graph, *args, **kwargs)
        record["splits"].append([[bool(item.is_splitting_graph),
                                  [str(n.target) for n in item.graph.graph.nodes if n.op == "call_function"]]
                                 for item in result[1]])
        return result

    backends.split_graph = recording_split
    plan, clean_run, sub_batch = (models.SteerableMixin._juice_plan, models.SteerableMixin._clean_run,
                                  models.SteerableMixin._juice_sub_batch)

    def counting_plan(self, n_tokens):
        state = plan(self, n_tokens)
        record["forwards"] += 1
        if state is not None and state.added:
            record["forwards_with_juice"] += 1
        return state

    def counting_clean_run(self, *args, **kwargs):
        record["run1"] += 1
        return clean_run(self, *args, **kwargs)

    def timed_sub_batch(self, state):
        started = time.perf_counter()
        built = sub_batch(self, state)
        if built is not None:
            record["sub_batches"] += 1
            record["sub_batch_s"] += time.perf_counter() - started
        return built

    models.SteerableMixin._juice_plan, models.SteerableMixin._clean_run = counting_plan, counting_clean_run
    models.SteerableMixin._juice_sub_batch = timed_sub_batch
    if hasattr(torch.cuda, "CUDAGraph"):
        replay = torch.cuda.CUDAGraph.replay

        def counting_replay(graph, *args, **kwargs):
            record["graph_replays"] += 1
            return replay(graph, *args, **kwargs)

        torch.cuda.CUDAGraph.replay = counting_replay
    return record


def piecewise_on_cpu() -> None:
    """vLLM's piecewise compilation on its CPU build (JUICE_TEST_PIECEWISE_ON_CPU=1; issue 65): the
    CPU platform's compilation mode DYNAMO_TRACE_ONCE (one Inductor graph, no splitting ops) put
    back to VLLM_COMPILE after the platform's own check, so that vLLM splits the traced forward at
    its splitting ops (attention, and juice's run-1 op, which the model adds) into the pieces a
    GPU would capture as CUDA graphs. The pieces run through vLLM's eager backend (vLLM's
    Inductor passes call its CUDA ops, absent from the CPU build)."""
    from vllm.config import CompilationMode
    from vllm.platforms.cpu import CpuPlatform

    check = CpuPlatform.check_and_update_config.__func__

    def vllm_compile(cls, vllm_config):
        check(cls, vllm_config)
        if not vllm_config.model_config.enforce_eager:
            vllm_config.compilation_config.mode = CompilationMode.VLLM_COMPILE
            vllm_config.compilation_config.backend = "eager"   # vLLM's Inductor passes need its CUDA ops
            if vllm_config.compilation_config.compile_sizes is None:   # as a GPU's config has them
                vllm_config.compilation_config.compile_sizes = []

    CpuPlatform.check_and_update_config = classmethod(vllm_compile)


def separate_run1() -> None:
    """JuICE's run 1 always run separately (spec "separate_run1"), as where vLLM captures CUDA
    graphs; elsewhere the model runs it as shadow rows (juice.vllm.models)."""
    import juice.vllm.models as models

    init = models.SteerableMixin.__init__

    def separate(self, *, vllm_config, prefix: str = ""):   # vLLM reads the signature
        init(self, vllm_config=vllm_config, prefix=prefix)
        self.juice_shadows = False

    models.SteerableMixin.__init__ = separate


def poisoned_buffers(pad: int) -> dict:
    """The poisoned-buffer mode (spec "poison": pad rows; issue 74): what a GPU leaves in memory,
    made certain on the CPU. Before every forward, every per-step buffer the plugin owns
    (`juice_factor`, `juice_add`, `juice_clean`) is filled with NaN, so a step that reads a row it
    did not set this step decodes NaN; and each forward gets `pad` rows past its real tokens (fewer
    where the tables hold fewer), as a GPU's CUDA-graph capture size pads a batch (ids and
    positions 0, KV-cache slots -1, the
    attention's output in those rows NaN in eager mode, as vLLM's uninitialised buffer may hold).
    The engine core and worker run in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0). Returns
    counters filled as vLLM runs, with the forwards whose JuICE run 1 ran as shadow rows
    (`shadowed`) and separately (`separate`)."""
    import os

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import torch
    from vllm.forward_context import get_forward_context

    import juice.vllm.models as models

    seen = {"forwards": 0, "padded": 0, "shadowed": 0, "separate": 0}
    real_rows = [0, 0]   # the forward's real rows; with its padding rows (shadow rows come after)
    plan, forward, init = (models.SteerableMixin._juice_plan, models.SteerableMixin.forward,
                           models.SteerableMixin.__init__)
    shadow_rows, clean_run = models.SteerableMixin._juice_shadow_rows, models.SteerableMixin._clean_run

    def counted_shadow_rows(self, state, n_tokens):
        made = shadow_rows(self, state, n_tokens)
        seen["shadowed"] += made is not None
        return made

    def counted_clean_run(self, *args):
        seen["separate"] += 1
        return clean_run(self, *args)

    def poisoned_plan(self, n_tokens):
        for name in ("juice_factor", "juice_add", "juice_clean"):
            getattr(self.model, name).fill_(float("nan"))
        return plan(self, n_tokens)

    def padded_forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **kwargs):
        n = input_ids.shape[0]
        extra = min(pad, self.juice_max_tokens - n)   # a GPU pads up to a capture size the tables hold
        context = get_forward_context()
        saved = context.slot_mapping
        if isinstance(saved, dict):
            context.slot_mapping = {k: None if v is None else torch.cat([v, v.new_full((extra,), -1)])
                                    for k, v in saved.items()}
        real_rows[:] = [n, n + extra]
        seen["forwards"] += 1
        seen["padded"] += extra > 0
        try:
            out = forward(self, torch.cat([input_ids, input_ids.new_zeros(extra)]),
                          torch.cat([positions, positions.new_zeros(extra)]), intermediate_tensors, inputs_embeds,
                          **kwargs)
        finally:
            context.slot_mapping = saved
        return out[:n]

    def init_with_garbage(self, *, vllm_config, prefix: str = ""):   # vLLM reads the signature
        init(self, vllm_config=vllm_config, prefix=prefix)
        if self.juice_compiled:   # the compiled graph would guard on the row count: tables only
            return

        def garbage(module, args):   # the attention output's padding rows, never written by vLLM
            x = args[0].clone()
            x[real_rows[0]:real_rows[1]] = float("nan")
            return (x, *args[1:])

        for layer in self.juice_layers:
            layer.self_attn.o_proj.register_forward_pre_hook(garbage, prepend=True)

    models.SteerableMixin._juice_plan = poisoned_plan
    models.SteerableMixin._juice_shadow_rows = counted_shadow_rows
    models.SteerableMixin._clean_run = counted_clean_run
    models.SteerableMixin.forward = padded_forward
    models.SteerableMixin.__init__ = init_with_garbage
    return seen


def main() -> None:
    spec = json.load(open(sys.argv[1]))
    import os

    if spec.get("separate_run1"):
        separate_run1()
    poison = poisoned_buffers(spec["poison"]) if spec.get("poison") else None
    on_cpu = os.environ.get("JUICE_TEST_PIECEWISE_ON_CPU") == "1"
    record = record_compilation() if on_cpu or os.environ.get("JUICE_TEST_RECORD") == "1" else None
    if on_cpu:
        piecewise_on_cpu()
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
        elif mode == "helper":   # juice.vllm.generate: each prompt dict carries its own `juice` key
            from juice.vllm import generate

            dicts = [{"prompt_token_ids": r["prompt_token_ids"], "juice": r.get("juice")} for r in spec["requests"]]
            bases = [SamplingParams(max_tokens=r["max_tokens"], temperature=0.0, ignore_eos=True)
                     for r in spec["requests"]]
            out["helper"] = tokens(generate(llm, dicts, bases, use_tqdm=False))
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
    if record is not None:
        out["compilation"] = record
    if poison is not None:
        out["poison"] = poison
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
