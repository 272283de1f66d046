"""The platform :mod:`juice_ray_on_cpu` names (imported by vLLM once it has chosen it)."""

from vllm.platforms.cpu import CpuPlatform


class RayOnCpuPlatform(CpuPlatform):
    """vLLM's CPU platform, placing its workers on Ray's "GPU" resource (a CPU-only Ray head
    declares as many as the test has ranks); everything else is the CPU platform's."""

    ray_device_key = "GPU"
