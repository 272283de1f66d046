"""The examples in juice's docstrings run and say what they show (issue 33: one said
`first_words_final(" Paris, the capital of France")` is True; it is False)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
from pathlib import Path

import juice

RUN_INSIDE_VLLM = ("juice.vllm.models", "juice.vllm.processor")
"""Modules that import vLLM itself (tested in tests/integration/test_vllm.py, in vLLM's environment)."""


def _modules() -> list:
    return [importlib.import_module(info.name) for info in pkgutil.walk_packages(juice.__path__, "juice.")
            if info.name not in RUN_INSIDE_VLLM]


def test_every_docstring_example_runs_as_written():
    finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    attempted, failed = 0, []
    for module in _modules():
        for test in finder.find(module):
            result = runner.run(test, out=lambda text: failed.append(text))
            attempted += result.attempted
    assert not failed, "".join(failed)
    # every example written in the package's sources was found and run (none hidden by an import)
    src = Path(juice.__file__).parent
    written = sum(p.read_text(encoding="utf-8").count(">>> ") for p in src.rglob("*.py")
                  if ".".join(("juice", *p.relative_to(src).with_suffix("").parts)) not in RUN_INSIDE_VLLM)
    assert attempted == written > 0
