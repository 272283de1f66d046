"""Run inside vLLM's environment (tests/unit/test_vllm_constraints.py starts it): vLLM's own
`EngineArgs(...).create_engine_config()` for each setting in a JSON file, as vLLM builds it on an
H100 (its CUDA platform class, told compute capability 9.0 and the device's name and memory; the
CPU build's wheel lacks the CUDA extensions, which config building does not use), and juice's
verdict on each: `juice.vllm.constraints.check_engine_config`'s one-line refusal, or None.

Usage: python gpu_engine_configs.py MODEL_DIR SETTINGS.json OUT.json, where SETTINGS.json is
`{name: {"env": {...}, "args": {...EngineArgs keywords...}}}` and OUT.json gets, per name, the
compilation mode, CUDA graph mode, number of capture sizes, splitting ops, Inductor graph
partition, the breakable-graph switch (vLLM's `envs`, and juice's reading of the environment),
and the verdict. Each setting starts from this process's environment without the variables any
setting names (vLLM's config writes VLLM_USE_BREAKABLE_CUDAGRAPH into it)."""

import json
import os
import sys
import types


def _hopper_platform():
    """vLLM's CUDA platform as an H100 reports it, without a GPU."""
    sys.modules.setdefault("vllm._C_stable_libtorch", types.ModuleType("vllm._C_stable_libtorch"))
    from vllm.platforms.cuda import CudaPlatform
    from vllm.platforms.interface import DeviceCapability

    class Hopper(CudaPlatform):
        @classmethod
        def get_device_capability(cls, device_id=0):
            return DeviceCapability(9, 0)

        @classmethod
        def get_device_name(cls, device_id=0):
            return "NVIDIA H100 80GB HBM3"

        @classmethod
        def get_device_total_memory(cls, device_id=0):
            return 80 << 30

    return Hopper()


def main() -> None:
    model, settings_path, out_path = sys.argv[1:4]
    settings = json.load(open(settings_path))
    import vllm.envs as envs
    import vllm.platforms
    from vllm.engine.arg_utils import EngineArgs

    from juice.vllm.constraints import PluginConfigError, breakable_cuda_graphs, check_engine_config

    # The model's architecture is inspected once under the CPU platform (inspecting it under the
    # CUDA platform imports the CUDA attention kernels); the result is cached for the configs below.
    EngineArgs(model=model).create_model_config()
    vllm.platforms._current_platform = _hopper_platform()
    named = {key for setting in settings.values() for key in setting.get("env", {})} | {"VLLM_USE_BREAKABLE_CUDAGRAPH"}
    base = {k: v for k, v in os.environ.items() if k not in named}
    results = {}
    for name, setting in settings.items():
        os.environ.clear()
        os.environ.update({**base, **setting.get("env", {})})
        config = EngineArgs(model=model, **setting.get("args", {})).create_engine_config()
        compilation = config.compilation_config
        try:
            check_engine_config(config)
            verdict = None
        except PluginConfigError as err:
            verdict = str(err)
        results[name] = {"mode": compilation.mode.name, "cudagraph_mode": compilation.cudagraph_mode.name,
                         "capture_sizes": len(compilation.cudagraph_capture_sizes or []),
                         "splitting_ops": list(compilation.splitting_ops or []),
                         "inductor_partition": bool(compilation.use_inductor_graph_partition),
                         "breakable_vllm": bool(envs.VLLM_USE_BREAKABLE_CUDAGRAPH),
                         "breakable_juice": breakable_cuda_graphs(), "refusal": verdict}
    json.dump(results, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main()
