"""juice: steer a language model toward its parametric memory or its context (JuICE, ICML 2025).

The public names, in four lines:

```python
import juice
lm = juice.load_model("gemma-3-270m")
steerer = juice.Steerer(lm, "heads.json", method="juice")
print(steerer.generate(["... prompt ..."], max_new_tokens=10))
```

Your own data: `juice.identify(lm, "rows.jsonl", direction="context")` (Stage 1),
`juice.tune(lm, heads, "validation.jsonl")` (the betas, into the heads file),
`juice.evaluate_file(lm, heads, "test.jsonl", ["original", "juice", "june"])` (a table with intervals).

Names are imported from their modules on first use (PEP 562), so `import juice` and the
command line stay fast.
"""

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("juice")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+unknown"

_EXPORTS = {
    # models
    "load_model": "juice.models", "LoadedModel": "juice.models", "EMBEDDED_MODELS": "juice.models",
    "ModelLoadError": "juice.selfcheck",
    # heads and interventions
    "Head": "juice.interventions", "HeadSelection": "juice.interventions",
    "score_heads": "juice.stage1", "select_heads": "juice.stage1",
    "load_heads": "juice.stage1", "save_heads": "juice.stage1", "make_artifact": "juice.stage1",
    # steering and decoding
    "Steering": "juice.steering", "JuICE": "juice.steering", "JuNE": "juice.steering", "Prune": "juice.steering",
    "Stream": "juice.engine", "Sampling": "juice.engine.sampling", "generate": "juice.engine", "greedy_generate": "juice.engine",
    "steering_coefficients": "juice.steering", "BatchingMismatchError": "juice.engine.guard",
    "Steerer": "juice.steerer",
    # your own data
    "identify": "juice.workflow", "tune": "juice.workflow", "evaluate_file": "juice.workflow",
    "ConflictRow": "juice.userdata", "load_rows": "juice.userdata",
    # the paper's pipelines
    "ReproduceConfig": "juice.pipeline.run", "reproduce": "juice.experiments.table1",
    "reproduce_contextual": "juice.experiments.table2",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(import_module(_EXPORTS[name]), name)
        globals()[name] = value   # later lookups skip this function
        return value
    raise AttributeError(f"module 'juice' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
