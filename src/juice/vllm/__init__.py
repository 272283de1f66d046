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
vLLM loads it. For users: docs/vllm.md.
"""

from __future__ import annotations

def steered_architectures() -> dict[str, str]:
    """vLLM architecture name -> its steered class in :mod:`juice.vllm.models` (`Juice<name>`),
    from the one architecture table (:func:`juice.architectures.vllm_architectures`)."""
    from juice.architectures import vllm_architectures

    return {name: f"Juice{name}" for name in vllm_architectures()}


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


def generate(llm, prompts, sampling_params=None, **kwargs):
    """vLLM's offline `llm.generate` with a juice steering per prompt that cannot be lost: each
    prompt (text, token ids, or a prompt dict whose `juice` key holds its juice fields) is
    checked and built by :func:`offline_request`, and its fields go into a copy of its
    `SamplingParams`' `extra_args`, where the plugin reads them. vLLM's own `LLM.generate` drops
    a prompt dict's `juice` key without a word (its prompts are TypedDicts); this never does.

    Args:
        llm: vLLM's `LLM`, built with :func:`llm_options`.
        prompts: one prompt or a list (text, token ids, or prompt dicts with an optional `juice`).
        sampling_params: one `SamplingParams` for all, one per prompt, or None (vLLM's defaults).
        **kwargs: passed to `llm.generate` (e.g. `use_tqdm=False`).

    Returns:
        `llm.generate`'s `RequestOutput`s, one per prompt, in order.

    Raises:
        juice.steering_request.SteeringRequestError: a prompt's juice fields are wrong, or a
            prompt gives them both in its `juice` key and in its `SamplingParams.extra_args`.
    """
    from vllm import SamplingParams

    from juice.steering_request import SteeringRequestError
    from juice.vllm.options import request_fields_of

    single = isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts
                                                   and isinstance(prompts[0], int))
    prompts = [prompts] if single else list(prompts)
    if sampling_params is None or not isinstance(sampling_params, (list, tuple)):
        sampling_params = [sampling_params] * len(prompts)
    if len(sampling_params) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts and {len(sampling_params)} sampling parameters")
    built, params = [], []
    for prompt, base in zip(prompts, sampling_params):
        base = SamplingParams() if base is None else base
        carries = isinstance(prompt, dict) and prompt.get("juice") is not None
        if carries and request_fields_of(base.extra_args) is not None:
            raise SteeringRequestError("a prompt gives juice fields in its 'juice' key and in its SamplingParams' "
                                       "extra_args; give one")
        request, extra = offline_request(prompt)
        copy = base.clone()
        if extra:
            copy.extra_args = {**(base.extra_args or {}), **extra}
        built.append(request)
        params.append(copy)
    return llm.generate(built, params, **kwargs)


def register() -> None:
    """vLLM's general plugin hook: register the steered classes when the plugin is on.

    Runs in every vLLM process and may run more than once (registering again is harmless). Reads
    only the on-switch (:func:`juice.vllm.options.plugin_enabled`), no heads file: a worker on
    another node reads the heads from vLLM's config (`juice serve --engine vllm` has Ray copy the
    `JUICE_` variables to its workers, :func:`juice.vllm.launch.server_environment`).

    Raises:
        PluginConfigError: with the plugin on, a vLLM release it was not verified on, or a
            process that would skip its request checks (`vllm run-batch`, `vllm serve --grpc`,
            the Rust frontend): :func:`juice.vllm.processes.check_process`.
    """
    import logging
    import sys

    import vllm

    from juice.vllm.processes import check_process
    from juice.vllm.options import plugin_enabled

    if not plugin_enabled():
        return
    warning = check_process(sys.argv, vllm.__version__)   # an unverified vLLM, or a frontend without the checks
    if warning is not None:
        logging.getLogger("juice").warning(warning)
    from vllm import ModelRegistry

    for architecture, name in steered_architectures().items():
        ModelRegistry.register_model(architecture, f"juice.vllm.models:{name}")


__all__ = ["LOGITS_PROCESSOR", "SCHEDULER", "generate", "llm_options", "offline_request", "register",
           "steered_architectures"]
