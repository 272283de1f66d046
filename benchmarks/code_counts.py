"""Counts of how scattered a concept is in the library (issue 45's before/after table).

Prints: library files spelling the literal "june"; call sites building a Steering (the JuICE /
JuNE presets, `Steering(...)` with a method, `steering_coefficients(...)`) per file; library files
reading a heads file's `tuned` by key; functions over 100 lines; the CLI module's lines; test
folders.

Run: python benchmarks/code_counts.py
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "juice"


def _code_strings(text: str) -> set[str]:
    """The string constants of a module's code, docstrings excluded."""
    tree = ast.parse(text)
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.add(id(first.value))
    return {n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs}


def main() -> None:
    files = sorted(SRC.rglob("*.py"))
    june = [f for f in files if '"june"' in f.read_text()]
    june_code = [f for f in files if _code_strings(f.read_text()) & {"june"}]
    builds: dict[str, int] = {}
    tuned: list[Path] = []
    long: list[str] = []
    for f in files:
        text = f.read_text()
        tree = ast.parse(text)
        n = 0
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", getattr(node.func, "attr", ""))
                if name in ("JuICE", "JuNE", "steering_coefficients") or (
                        name == "Steering" and node.args):
                    n += 1
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > 100:
                    long.append(f"{f.relative_to(SRC)}:{node.name} ({length})")
        if n and f.name not in ("steering.py",):
            builds[str(f.relative_to(SRC))] = n
        if re.search(r"\.tuned(\.get)?[\[(]\s*[\"']", text) or re.search(r"tuned\[[\"']", text):
            tuned.append(f)
    cli = sorted(SRC.glob("apps/**/*.py"))
    folders = sorted({p.parent.relative_to(ROOT) for p in (ROOT / "tests").rglob("test_*.py")})
    print(f'library files spelling "june": {len(june)} (as a string in code, docstrings and comments aside: '
          f'{len(june_code)}: ' + ", ".join(str(f.relative_to(SRC)) for f in june_code) + ")")
    print(f"files building a Steering (outside steering.py): {len(builds)}  "
          + ", ".join(f"{k} ({v})" for k, v in sorted(builds.items())))
    print(f"library files reading `tuned` by key: {len(tuned)}  "
          + ", ".join(str(f.relative_to(SRC)) for f in tuned))
    print(f"functions over 100 lines: {len(long)}  " + ", ".join(long))
    print("CLI modules: " + ", ".join(f"{f.relative_to(SRC)} ({len(f.read_text().splitlines())})" for f in cli))
    print(f"test folders: {len(folders)}  " + ", ".join(map(str, folders)))


if __name__ == "__main__":
    main()
