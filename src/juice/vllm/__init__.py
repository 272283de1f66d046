"""juice inside vLLM: per-request JuNE, JuICE (dual run) and PH3 pruning as a vLLM plugin.

Installed with juice into vLLM's environment, its `vllm.general_plugins` entry point runs
:func:`register` in every vLLM process (workers and other nodes included), which puts the steered
model classes (:mod:`juice.vllm.models`) in vLLM's registry under the architectures' names when
the plugin is on (`JUICE_VLLM_HEADS` or `JUICE_VLLM=1`, :mod:`juice.vllm.options`). The logits
processor :class:`juice.vllm.processor.JuiceSteeringProcessor`, which carries each request's
`juice` fields to the model and refuses bad ones at admission (HTTP 400), is loaded only where it
is named (:data:`LOGITS_PROCESSOR`: `--logits-processors`, which `juice serve --engine vllm`
passes, or :func:`llm_options` offline), so a vLLM without juice's heads runs no juice code; the
steered model refuses to start without it. With prefix caching, juice's scheduler
(:data:`SCHEDULER`, :mod:`juice.vllm.scheduler`) gives each steered request its steering's KV
cache salt in the engine core; the steered model refuses to start with prefix caching on
without it. vLLM itself is not a dependency of juice's core: this package imports it only when
vLLM loads it.
README, "Serving at scale with vLLM".
"""

from __future__ import annotations

ARCHITECTURES = {"Gemma3ForCausalLM": "JuiceGemma3ForCausalLM", "Gemma2ForCausalLM": "JuiceGemma2ForCausalLM",
                 "LlamaForCausalLM": "JuiceLlamaForCausalLM", "Qwen2ForCausalLM": "JuiceQwen2ForCausalLM",
                 "Qwen3ForCausalLM": "JuiceQwen3ForCausalLM", "MistralForCausalLM": "JuiceMistralForCausalLM",
                 "Phi3ForCausalLM": "JuicePhi3ForCausalLM"}
"""vLLM architecture name -> its steered class in :mod:`juice.vllm.models`. OLMo 2 is not among them:
vLLM 0.32 serves it through its Transformers backend, whose layers the plugin does not drive
(the plugin refuses to start on it, :class:`juice.vllm.processor.JuiceSteeringProcessor`)."""


LOGITS_PROCESSOR = "juice.vllm.processor:JuiceSteeringProcessor"
"""The logits processor's fully qualified name, as vLLM's `--logits-processors` /
`logits_processors=[...]` take it."""

SCHEDULER = "juice.vllm.scheduler.salting_scheduler"
"""juice's scheduler (:func:`juice.vllm.scheduler.salting_scheduler`) as vLLM's `--scheduler-cls` /
`scheduler_cls=` take it: vLLM's own, which also sets each steered request's KV cache salt."""


def llm_options(environ=None) -> dict:
    """The options juice's plugin needs in vLLM's offline `LLM(model, **llm_options(), ...)`: the
    logits processor (:data:`LOGITS_PROCESSOR`), the scheduler that salts steered requests'
    KV cache (:data:`SCHEDULER`) and the set-up the environment names in `additional_config`
    (:func:`juice.vllm.options.config_entry`), read by every worker.

    Raises:
        ValueError: what :func:`juice.vllm.options.plugin_heads` refuses.
    """
    from juice.vllm.options import CONFIG_KEY, config_entry

    return {"logits_processors": [LOGITS_PROCESSOR], "scheduler_cls": SCHEDULER,
            "additional_config": {CONFIG_KEY: config_entry(environ)}}


def offline_request(prompt, juice=None, *, cache_salt=None, server=None):
    """:func:`juice.vllm.options.offline_request`: a prompt and `extra_args` for vLLM's offline
    `LLM.generate`, the juice fields checked."""
    from juice.vllm.options import offline_request as make

    return make(prompt, juice, cache_salt=cache_salt, server=server)


def register() -> None:
    """vLLM's general plugin hook: register the steered classes when the plugin is on.

    Runs in every vLLM process and may run more than once (registering again is harmless). Reads
    only the on-switch (:func:`juice.vllm.options.plugin_enabled`), no heads file: a worker on
    another node reads the heads from vLLM's config (`juice serve --engine vllm` has Ray copy the
    `JUICE_` variables to its workers, :func:`juice.vllm.launch.server_environment`).
    """
    from juice.vllm.options import plugin_enabled

    if not plugin_enabled():
        return
    from vllm import ModelRegistry

    for architecture, name in ARCHITECTURES.items():
        ModelRegistry.register_model(architecture, f"juice.vllm.models:{name}")


__all__ = ["ARCHITECTURES", "LOGITS_PROCESSOR", "SCHEDULER", "llm_options", "offline_request", "register"]
