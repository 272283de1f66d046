"""The engines a run can name, each name resolved once, where it enters (`--engine`,
`--stage1-engine`, `ReproduceConfig.engine`, a sweep file's settings), to the engine's class.

Past that edge only the class and the engine it opens travel: a stage, a command or the sweep
reads what an engine can do from its capabilities (:class:`juice.engine.backend.Engine`:
`in_process`, `every_stream`, `model_device`, `open`), never its name.

| name | class | in this process | decodes every stream | juice's copy of the model |
|---|---|---|---|---|
| `juice` | :class:`juice.engine.backend.JuiceEngine` | yes | yes | loaded at start, on `--device` |
| `vllm` | :class:`juice.vllm.engine.VllmEngine` (server or offline) | no | no (CAD's two distributions, auto's choices and GRD's gate go to juice's engine) | deferred, on the CPU unless Stage 1 runs on juice's engine |
"""

from __future__ import annotations

from juice.engine.backend import Engine, JuiceEngine
from juice.vllm.engine import VllmEngine

ENGINES: dict[str, type[Engine]] = {"juice": JuiceEngine, "vllm": VllmEngine}
"""name -> the engine's class, juice's own first (the default)."""


def engine_class(name: str) -> type[Engine]:
    """The class of the engine named `name` (:data:`ENGINES`).

    Raises:
        ValueError: no engine has that name (one line naming them).
    """
    try:
        return ENGINES[name]
    except (KeyError, TypeError):
        raise ValueError(f"engine must be {' or '.join(ENGINES)}, not {name!r}") from None


__all__ = ["ENGINES", "engine_class"]
