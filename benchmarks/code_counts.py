"""Counts of how scattered a concept is in the library (issue 45's before/after table).

Prints: library files spelling the literal "june"; call sites building a Steering (the JuICE /
JuNE presets, `Steering(...)` with a method, `steering_coefficients(...)`) per file; library files
reading a heads file's `tuned` by key; functions over 100 lines; the CLI module's lines; test
folders; and for issue 64: comparisons of a steering's method to a method name (`x.method ==
"juice"`, `x.method in (...)`) per file; modules parsing a heads file's fields (the constant
"positive_heads" in code); modules importing from `juice` at import time that copy the
registry's names into a module constant; the when-to-steer modules and their lines; and for issue
91: an engine's name compared in code, a method's title compared or used as a key, and a juice
module named in a string and imported at run time.

Run: python benchmarks/code_counts.py [ROOT]   (ROOT: another checkout, e.g. a worktree of an older commit)
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import sys

ROOT = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "juice"
METHOD_NAMES = {"original", "june", "juice", "prune", "ph3", "auto", "prompt", "cad", "adacad", "ckplug"}
METRIC_NAMES = {"first_words", "memotrap", "nqswap"}
WHEN_TO_STEER = ["data/context_types.py", "eval/contexts.py", "when_to_steer.py", "context_study.py", "auto.py",
                 "when_to_steer/__init__.py", "when_to_steer/signals.py", "when_to_steer/auto.py",
                 "when_to_steer/evaluation.py", "when_to_steer/report.py", "when_to_steer/contexts.py", "when_to_steer/auto_tuning.py",
                 "when_to_steer/study.py"]
"""The when-to-steer modules, before (five files in four places) and after (the items in data/, auto's
policy beside the registry, the rest in when_to_steer/): whichever stand are counted."""


def _method_comparisons(tree: ast.AST) -> int:
    """`<expr>.method == "juice"` / `!=` / `in ("original", "juice")`: a method's name compared in code."""
    n = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Attribute) and node.left.attr == "method":
            for right in node.comparators:
                values = ([right.value] if isinstance(right, ast.Constant) else
                          [e.value for e in getattr(right, "elts", []) if isinstance(e, ast.Constant)])
                n += any(v in METHOD_NAMES for v in values)
    return n


NOT_A_METHOD = ("engine", "device", "max_rows", "extra_args", "body", "data", "value", "p")
"""Operands that hold no method's name: "juice" is also an engine's and the request field's name,
"auto" a device's, a batch size's and the guard's setting."""


def _literals(o: ast.AST) -> list:
    """The values of a literal operand: a constant, or a tuple, list or set of constants."""
    if isinstance(o, ast.Constant):
        return [o.value]
    if isinstance(o, (ast.Tuple, ast.List, ast.Set)):
        return [e.value for e in o.elts if isinstance(e, ast.Constant)]
    return []


def _literal_comparisons(tree: ast.AST, text: str, names: set[str], counts) -> int:
    """Comparisons (`==`, `!=`, `in`, `not in`) with a literal operand holding one of `names`,
    counted where `counts` (the other operands' source texts -> bool) says so; once per comparison."""
    n = 0
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for i, o in enumerate(operands):
            if not any(isinstance(v, str) and v in names for v in _literals(o)):
                continue
            if counts([ast.get_source_segment(text, x) or "" for j, x in enumerate(operands) if j != i]):
                n += 1
                break
    return n


def _any_method_comparisons(tree: ast.AST, text: str) -> int:
    """Any comparison (`==`, `!=`, `in`, `not in`) of a method's name as a literal with another
    operand, on either side (`"ph3" in methods`, `name != "auto"`, `m == "ph3"`), except where that
    operand is an engine, a device or a request body (:data:`NOT_A_METHOD`)."""
    return _literal_comparisons(tree, text, METHOD_NAMES, lambda others: not any(
        word in NOT_A_METHOD or set(word.split("_")) & set(NOT_A_METHOD)
        for t in others for word in re.findall(r"\w+", t)))


def _metric_comparisons(tree: ast.AST) -> int:
    """`<x>.metric == "nqswap"` / `metric in ("first_words", "nqswap")` / `for metric in ("memotrap",
    "nqswap")`: a metric's name compared or listed in code outside the metric table."""
    n = 0
    for node in ast.walk(tree):
        left, rights = None, []
        if isinstance(node, ast.Compare):
            left, rights = node.left, node.comparators
        elif isinstance(node, ast.For):
            left, rights = node.target, [node.iter]
        name = getattr(left, "attr", getattr(left, "id", ""))
        if name != "metric":
            continue
        for right in rights:
            values = ([right.value] if isinstance(right, ast.Constant) else
                      [e.value for e in getattr(right, "elts", []) if isinstance(e, ast.Constant)])
            n += any(v in METRIC_NAMES for v in values)
    return n


DATASET_NAMES = ("nqswap", "hate_speech_ending", "history_of_science_qa", "proverb_ending", "proverb_translation")
"""The paper's contextual datasets (written out here, so that the count runs on any commit)."""


def _dataset_mentions(text: str) -> int:
    """String constants in code (docstrings aside) equal to a contextual dataset's name, and
    dataset-named folders joined to a path (`root / "memotrap"`): a dataset's facts spelled outside
    the dataset table."""
    tree = ast.parse(text)
    n = sum(1 for node in ast.walk(tree) if isinstance(node, ast.Constant) and node.value in DATASET_NAMES)
    n += sum(1 for node in ast.walk(tree) if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)
             and isinstance(node.right, ast.Constant) and node.right.value in ("memotrap", "nqswap"))
    return n


def _name_copies(tree: ast.AST) -> int:
    """Module-level constants assigned from the registry's name functions at import
    (`METHODS = names(steerer=True)`, `= protocol_names()`)."""
    return sum(1 for node in getattr(tree, "body", []) if isinstance(node, (ast.Assign, ast.AnnAssign))
               and isinstance(node.value, ast.Call)
               and getattr(node.value.func, "id", "") in ("names", "protocol_names"))


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


ENGINE_NAMES = {"juice", "vllm"}
TITLES = {"Original", "Prompt", "CAD", "AdaCAD", "CK-PLUG", "CoCoA", "COIECD", "GRD", "PH3", "PH3-l", "PH3-s", "JuNE",
          "JuICE", "JuNE-mem", "JuNE-ctx", "JuICE-mem", "JuICE-ctx"}
"""The table titles of the registry's methods (written out here, so that the count runs on any commit)."""


def _engine_comparisons(tree: ast.AST, text: str) -> int:
    """Comparisons (`==`, `!=`, `in`, `not in`) of an engine's name as a literal ("juice", "vllm")
    with an operand that names an engine (`engine != "juice"`, `cfg.engine == "vllm"`,
    `engine.name != "juice"`, `stage1_engine == "juice"`) (issue 91)."""
    return _literal_comparisons(tree, text, ENGINE_NAMES, lambda others: any("engine" in t for t in others))


def _title_uses(tree: ast.AST) -> int:
    """A method's table title compared or used as a key in code (`r.method == "Original"`,
    `steer["JuNE"]`, `("JuNE", "JuICE")` in a comparison) (issue 91: rows keyed by title)."""
    n = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            n += any(isinstance(v, str) and v in TITLES for o in (node.left, *node.comparators) for v in _literals(o))
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value in TITLES:
            n += 1
    return n


def _names_resolved_at_run_time(tree: ast.AST) -> int:
    """String literals in code (bare string statements, i.e. docstrings, aside) that name a juice
    object as `"juice.module:name"`, the form `pkgutil.resolve_name` and entry points import at run
    time (`"juice.when_to_steer.auto:build"` in the registry): an upward call no import graph shows."""
    bare = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    return sum(1 for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
               and id(n) not in bare and re.fullmatch(r"juice(\.\w+)+:\w+", n.value))


def main() -> None:
    files = sorted(SRC.rglob("*.py"))
    june = [f for f in files if '"june"' in f.read_text()]
    june_code = [f for f in files if _code_strings(f.read_text()) & {"june"}]
    builds: dict[str, int] = {}
    tuned: list[Path] = []
    long: list[str] = []
    over_80: list[str] = []
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
                if length > 80:   # issue 91's bound; the code's own lines are those after the docstring
                    first = node.body[0]
                    doc = isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None), ast.Constant) \
                        and isinstance(first.value.value, str)
                    code = node.end_lineno - (first.end_lineno if doc else first.lineno - 1)
                    over_80.append(f"{f.relative_to(SRC)}:{node.name} ({length}; code {code})")
        if n and f.name not in ("steering.py",):
            builds[str(f.relative_to(SRC))] = n
        if re.search(r"\.tuned(\.get)?[\[(]\s*[\"']", text) or re.search(r"tuned\[[\"']", text):
            tuned.append(f)
    compares = {str(f.relative_to(SRC)): c for f in files if (c := _method_comparisons(ast.parse(f.read_text())))}
    any_compares = {str(f.relative_to(SRC)): c for f in files if f.name not in ("methods.py", "reference.py")
                    if (c := _any_method_comparisons(ast.parse(f.read_text()), f.read_text()))}
    metric_compares = {str(f.relative_to(SRC)): c for f in files if f.name != "metrics.py" or f.parent.name != "data"
                       if (c := _metric_comparisons(ast.parse(f.read_text())))}
    datasets = {str(f.relative_to(SRC)): c for f in files if f.parent.name != "data"
                if (c := _dataset_mentions(f.read_text()))}
    parsers = [str(f.relative_to(SRC)) for f in files if "positive_heads" in _code_strings(f.read_text())
               and "data[\"positive_heads\"]" in f.read_text()]
    copies = [str(f.relative_to(SRC)) for f in files if _name_copies(ast.parse(f.read_text()))]
    room = [(m, len((SRC / m).read_text().splitlines())) for m in WHEN_TO_STEER if (SRC / m).is_file()]
    cli = sorted(SRC.glob("apps/**/*.py"))
    folders = sorted({p.parent.relative_to(ROOT) for p in (ROOT / "tests").rglob("test_*.py")})
    print(f'library files spelling "june": {len(june)} (as a string in code, docstrings and comments aside: '
          f'{len(june_code)}: ' + ", ".join(str(f.relative_to(SRC)) for f in june_code) + ")")
    print(f"files building a Steering (outside steering.py): {len(builds)}  "
          + ", ".join(f"{k} ({v})" for k, v in sorted(builds.items())))
    print(f"library files reading `tuned` by key: {len(tuned)}  "
          + ", ".join(str(f.relative_to(SRC)) for f in tuned))
    print(f"functions over 100 lines: {len(long)}  " + ", ".join(long))
    print(f"functions over 80 lines (issue 91): {len(over_80)}, of which code alone (docstring aside) over 80: "
          f"{sum(int(x.rsplit('code ', 1)[1][:-1]) > 80 for x in over_80)}  " + ", ".join(over_80))
    print("CLI modules: " + ", ".join(f"{f.relative_to(SRC)} ({len(f.read_text().splitlines())})" for f in cli))
    print(f"test folders: {len(folders)}  " + ", ".join(map(str, folders)))
    print(f"a steering's method compared to a method name: {sum(compares.values())} in {len(compares)} files  "
          + ", ".join(f"{k} ({v})" for k, v in sorted(compares.items())))
    print(f"any method name compared in code (outside methods.py, reference.py): {sum(any_compares.values())} in "
          f"{len(any_compares)} files  " + ", ".join(f"{k} ({v})" for k, v in sorted(any_compares.items())))
    print(f"a metric's name compared or listed in code (outside data/metrics.py): {sum(metric_compares.values())} in "
          f"{len(metric_compares)} files  " + ", ".join(f"{k} ({v})" for k, v in sorted(metric_compares.items())))
    print(f"a contextual dataset's name or folder spelled in code outside data/: {sum(datasets.values())} in "
          f"{len(datasets)} files  " + ", ".join(f"{k} ({v})" for k, v in sorted(datasets.items())))
    print(f"modules parsing a heads file's fields: {len(parsers)}  " + ", ".join(parsers))
    print(f"modules copying the registry's names at import: {len(copies)}  " + ", ".join(copies))
    print(f"when-to-steer modules: {len(room)}, {sum(n for _, n in room)} lines  "
          + ", ".join(f"{m} ({n})" for m, n in room))
    engines = {str(f.relative_to(SRC)): c for f in files if (c := _engine_comparisons(ast.parse(f.read_text()), f.read_text()))}
    titles = {str(f.relative_to(SRC)): c for f in files if f.name != "methods.py"
              if (c := _title_uses(ast.parse(f.read_text())))}
    resolved = {str(f.relative_to(SRC)): c for f in files if (c := _names_resolved_at_run_time(ast.parse(f.read_text())))}
    print(f"an engine's name compared in code (issue 91): {sum(engines.values())} in {len(engines)} files  "
          + ", ".join(f"{k} ({v})" for k, v in sorted(engines.items())))
    print(f"a method's title compared or used as a key in code (outside methods.py): {sum(titles.values())} in "
          f"{len(titles)} files  " + ", ".join(f"{k} ({v})" for k, v in sorted(titles.items())))
    print(f"a juice module named in a string and imported at run time: {sum(resolved.values())} in {len(resolved)} "
          "files  " + ", ".join(f"{k} ({v})" for k, v in sorted(resolved.items())))


if __name__ == "__main__":
    main()
