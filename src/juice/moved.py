"""Public names whose home moved, in one table: the old path still imports, with a
:class:`DeprecationWarning` that names the new one.

- :data:`MOVED_MODULES`: old module path -> new (`import juice.eval.contexts` gives
  :mod:`juice.when_to_steer.evaluation`);
- :data:`MOVED_NAMES`: (old module, name) -> the module that now defines it
  (`from juice.auto import tune_auto` gives :func:`juice.when_to_steer.auto_tuning.tune_auto`).

`import juice` installs the finder (:func:`install`); a module that lost names reads them through
:func:`moved_attribute` in its `__getattr__`. Both import the new home by name when the old
path is used, not before.
"""

from __future__ import annotations

import sys
import warnings
from importlib import import_module
from importlib.abc import Loader, MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

MOVED_MODULES: dict[str, str] = {
    "juice.eval.contexts": "juice.when_to_steer.evaluation",
    "juice.context_study": "juice.when_to_steer.study",
}
"""Old module path -> its new home."""

MOVED_NAMES: dict[tuple[str, str], str] = {
    ("juice.auto", name): "juice.when_to_steer.auto_tuning"
    for name in ("AutoFit", "GATE_GRID", "GateValues", "candidate_methods", "cross_validate", "fit_from_results",
                 "fit_policy", "policy_picks", "request_features", "tune_auto", "verdict_table")
}
"""(old module, name) -> the module that now defines the name."""


def _warn(old: str, new: str) -> None:
    # the warning points at the import that used the old path; `warnings` skips importlib's own frames
    level, frame = 2, sys._getframe(1)
    while frame is not None and (frame.f_code.co_filename.startswith("<frozen importlib")
                                 or frame.f_code.co_filename == __file__ or frame.f_code.co_name == "__getattr__"):
        level += not frame.f_code.co_filename.startswith("<frozen importlib")
        frame = frame.f_back
    warnings.warn(f"{old} moved to {new}; import it from there", DeprecationWarning, stacklevel=level)


class _MovedModules(MetaPathFinder, Loader):
    """Finds an old module path of :data:`MOVED_MODULES` and hands back the new module itself."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        return ModuleSpec(fullname, self) if fullname in MOVED_MODULES else None

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        _warn(spec.name, MOVED_MODULES[spec.name])
        return import_module(MOVED_MODULES[spec.name])

    def exec_module(self, module: ModuleType) -> None:
        pass


def install() -> None:
    """Let the old module paths import (once per process; after the real finders)."""
    if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
        sys.meta_path.append(_MovedModules())


def moved_attribute(module: str, name: str) -> Any:
    """`module.name` from its new home (:data:`MOVED_NAMES`), with the warning; for a module's
    `__getattr__`.

    Raises:
        AttributeError: `name` never was `module`'s.
    """
    new = MOVED_NAMES.get((module, name))
    if new is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    _warn(f"{module}.{name}", f"{new}.{name}")
    return getattr(import_module(new), name)


__all__ = ["MOVED_MODULES", "MOVED_NAMES", "install", "moved_attribute"]
