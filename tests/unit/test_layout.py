"""The house: the import graph of src/juice (lazy imports inside functions included) has no
cycle, the applications sit on top, the naive references serve tests and benchmarks only, the
library never imports the command-line packages, and no module of the tests imports a test module
(shared helpers live in tests/helpers and conftest)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "juice"
TESTS = Path(__file__).resolve().parents[1]


def module_of(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the juice modules it imports anywhere in its file (lazy imports included)."""
    modules = {module_of(p): p for p in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base = ".".join(pkg[: len(pkg) - node.level + 1] + ([base] if base else []))
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            for name in names:
                while name and name not in modules:
                    name = name.rpartition(".")[0]
                if name and name != mod and name != "juice":
                    graph[mod].add(name)
    return graph


def external_imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module.split(".")[0])
    return out


def test_the_import_graph_has_no_cycle():
    graph = import_graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(n):] + [n]))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_applications_are_on_top_and_references_serve_tests_only():
    graph = import_graph()
    for mod, deps in graph.items():
        if not mod.startswith("juice.apps"):
            assert not {d for d in deps if d.startswith("juice.apps")}, f"{mod} imports the applications"
            assert not {d for d in deps if d.startswith("juice.experiments")} or mod.startswith("juice.experiments"), (
                f"{mod} imports the paper's tables; use juice.pipeline")
        assert "juice.reference" not in deps, f"{mod} imports the naive references (tests and benchmarks only)"


def test_the_library_does_not_import_the_command_line_packages():
    for path in SRC.rglob("*.py"):
        if "apps" in path.relative_to(SRC).parts:
            continue
        assert not external_imports(path) & {"typer", "rich"}, f"{path.relative_to(SRC)} imports typer or rich"


def imports_of_test_modules(source: str) -> list[tuple[int, str]]:
    """(line, module) of each import in `source` (lazy ones included) of a module named test_*."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        out += [(node.lineno, name) for name in names if name.split(".")[0].startswith("test_")]
    return out


def test_no_test_module_imports_another():
    """A test module takes shared helpers from tests/helpers or conftest, never from another test
    module (importing one runs that module's code again and can bring its tests and fixtures along)."""
    t = "test_"   # spelled apart, so that a grep for such imports finds none in this file either
    bad = f"from {t}vllm import needs_vllm\nimport {t}x.y\ndef f():\n    import {t}z\n"
    assert imports_of_test_modules(bad) == [(1, f"{t}vllm"), (2, f"{t}x.y"), (4, f"{t}z")]
    assert not imports_of_test_modules(f"from helpers.vllm import needs_vllm\nimport conftest\nfrom . import {t}a\n")
    found = [f"{path.relative_to(TESTS)}:{line} imports {name}" for path in sorted(TESTS.rglob("*.py"))
             for line, name in imports_of_test_modules(path.read_text(encoding="utf-8"))]
    assert not found, "import shared helpers from tests/helpers instead:\n" + "\n".join(found)


def _resolves(name: str) -> bool:
    """Whether a dotted `juice.` name is a module, or an attribute (a dataclass field included)
    of one, importing what it must; a module that needs a missing optional dependency counts."""
    import dataclasses
    import importlib

    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError as err:
            if err.name and not err.name.startswith("juice"):
                return True   # an optional extra (vllm, ray, ...) is not installed here
            continue
        for attr in parts[i:]:
            fields = {f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else set()
            if attr in fields:
                return True
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_every_dotted_juice_name_in_the_code_resolves():
    """Issue 91: a docstring or comment naming `juice.x.y` names something that exists (stale
    references such as a renamed module are caught). The request protocol's field names
    (`juice.method`, `juice.direction`, ...) are JSON fields, not Python names."""
    import re

    from juice.steering_request import FIELDS

    pattern = re.compile(r"(?<![\w./])juice(?:\.[A-Za-z_]\w*)+")
    fields = {f"juice.{f}" for f in FIELDS}
    bad, seen = [], set()
    for path in sorted(SRC.rglob("*.py")):
        for name in set(pattern.findall(path.read_text(encoding="utf-8"))):
            if name in fields or name in seen:
                continue
            seen.add(name)
            if not _resolves(name):
                bad.append(f"{path.relative_to(SRC.parent)}: {name}")
    assert len(seen) > 300, len(seen)   # the code does name juice's parts: the check is not empty
    assert not bad, bad
