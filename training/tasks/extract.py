"""A real function as a small module of its own, calls on it recorded, and tests that assert them.

Vocabulary (training/tasks/real.py builds tasks from these):

    function   a top-level function of an installed pure-Python module, of the standard library
               or of site-packages
    extract    the function with every top-level statement it needs (imports, constants, helpers,
               classes) in source order, as one module of at most MAX_MODULE_LINES lines that
               imports only the standard library (the workspace runs on any Python)
    probe      a call of the function on chosen inputs; its outcome (a value or an exception) is
               recorded by running the code in a subprocess
    tests      `test_<module>.py`: one unittest method per probe asserting the recorded outcome;
               floats are compared to 9 places

Everything that runs code (`record`, `run_tests`) runs it in a fresh interpreter, in a given
folder, with a timeout; nothing here decides which functions or probes to use.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import json
import os
import subprocess
import symtable
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

MAX_MODULE_LINES = 150  # an extract longer than this is dropped: the model has an 8k context
TIMEOUT_S = 5.0  # per test or probe run; a run past it counts as hanging (exit code 124)
VERIFY = "python -m unittest"  # how a workspace's tests run


class ExtractError(Exception):
    """Why a function gives no tasks (it cannot become a small self-contained module, or its
    probes and tests do not hold up); `reason` is a drop count key."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass
class Extract:
    source: str  # the workspace module: the function and the top-level statements it needs
    start: int  # the function's `def` line in `source` (1-based)
    end: int  # its last line


def bound_names(stmt: ast.stmt) -> set[str]:
    """Names a top-level statement binds or changes (`X[k] = v`, `X.update(...)`), over-
    approximated for compound statements."""
    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {stmt.name}
    if isinstance(stmt, ast.Import | ast.ImportFrom):
        return {(a.asname or a.name).split(".")[0] for a in stmt.names if a.name != "*"}
    names = set()
    for node in ast.walk(stmt):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Subscript | ast.Attribute) and isinstance(node.ctx, ast.Store):
            names |= {node.value.id} if isinstance(node.value, ast.Name) else set()
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):  # X.append(...)
            func = node.value.func
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                names.add(func.value.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name != "*"}
    return names


def _used_names(source: str) -> set[str]:
    """Global names a top-level statement reads (Python's own scope analysis, `symtable`)."""
    used: set[str] = set()

    def walk(table: symtable.SymbolTable, top: bool) -> None:
        for sym in table.get_symbols():
            if sym.is_referenced() and (top or sym.is_global()):
                used.add(sym.get_name())
        for child in table.get_children():
            walk(child, False)

    walk(symtable.symtable(source, "<extract>", "exec"), True)
    return used


def _foreign_import(stmt: ast.stmt) -> str | None:
    """An import in `stmt` from outside the standard library (or relative), if any; optional
    ones, inside `try: ... except ImportError`, do not count."""
    optional: set[int] = set()
    for node in ast.walk(stmt):
        if isinstance(node, ast.Try) and any(
            getattr(h.type, "id", "") in ("ImportError", "ModuleNotFoundError")
            for h in node.handlers
        ):
            optional |= {id(n) for inner in node.body for n in ast.walk(inner)}
        elif isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in optional:
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            if getattr(node, "level", 0) or any(
                (n or "").split(".")[0] not in sys.stdlib_module_names for n in names
            ):
                return ast.unparse(node)
    return None


def _exports(module: str, name: str) -> bool:
    """Whether `from module import *` binds `name`."""
    try:
        found = importlib.import_module(module)
    except ImportError:
        return False
    public = getattr(found, "__all__", None) or [n for n in dir(found) if n[:1] != "_"]
    return name in public


def _first_line(stmt: ast.stmt) -> int:
    decorators = getattr(stmt, "decorator_list", [])
    return min([stmt.lineno] + [d.lineno for d in decorators])


def extract(module_name: str, function: str, header: str = "") -> Extract:
    """`function` of `module_name` with every top-level statement it needs, in source order.

    Needed means: it binds or changes a name that an included statement reads, transitively;
    a name from a `from x import *` becomes `from x import name`. Imports must be of the
    standard library (a relative import or a third-party one drops the function), except
    optional ones inside `try: ... except ImportError`, so the workspace runs on any Python.
    """
    try:
        module = importlib.import_module(module_name)
        text = inspect.getsource(module)
    except (ImportError, OSError, TypeError) as exc:
        raise ExtractError("unreadable", f"{module_name}: {exc}") from exc
    tree = ast.parse(text)
    lines = text.splitlines()
    defs = [s for s in tree.body if isinstance(s, ast.FunctionDef) and s.name == function]
    target = defs[-1] if defs else None  # the last: the one after any @overload stubs
    if target is None:
        raise ExtractError("not_found", f"{module_name}.{function}")
    binders: dict[str, list[ast.stmt]] = {}
    for stmt in tree.body:
        for name in bound_names(stmt):
            binders.setdefault(name, []).append(stmt)
    stars = [s for s in tree.body if isinstance(s, ast.ImportFrom) and s.names[0].name == "*"]
    star_names: dict[int, set[str]] = {}  # a star import -> the names taken from it

    def source_of(stmt: ast.stmt) -> str:
        return "\n".join(lines[_first_line(stmt) - 1 : stmt.end_lineno])

    included = {id(target): target}
    todo = list(_used_names(source_of(target)))
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for stmt in [] if name in binders or name in dir(builtins) else stars:
            if not stmt.level and stmt.module and _exports(stmt.module, name):
                star_names.setdefault(id(stmt), set()).add(name)
                included[id(stmt)] = stmt
                break
        for stmt in binders.get(name, []):
            if id(stmt) not in included:
                included[id(stmt)] = stmt
                todo += _used_names(source_of(stmt))
    stmts = sorted(included.values(), key=lambda s: s.lineno)
    future = [s for s in tree.body if isinstance(s, ast.ImportFrom) and s.module == "__future__"]
    stmts = [s for s in future if id(s) not in included] + stmts
    for found in filter(None, map(_foreign_import, stmts)):
        raise ExtractError("non_stdlib_import", found)
    out: list[str] = [header] if header else []
    simple = ast.Assign | ast.AnnAssign | ast.Import | ast.ImportFrom
    for i, stmt in enumerate(stmts):  # PEP 8 spacing: two blank lines around defs and classes
        if out:
            together = i and isinstance(stmt, simple) and type(stmt) is type(stmts[i - 1])
            out += [] if together else ["", ""] if i or not isinstance(stmt, simple) else [""]
        if stmt is target:
            start = len(out) + target.lineno - _first_line(target) + 1
        if id(stmt) in star_names:
            out.append(f"from {stmt.module} import {', '.join(sorted(star_names[id(stmt)]))}")
        else:
            out += lines[_first_line(stmt) - 1 : stmt.end_lineno]
        if stmt is target:
            end = len(out)
    if len(out) > MAX_MODULE_LINES:
        raise ExtractError("too_large", f"{module_name}.{function}: {len(out)} lines")
    return Extract("\n".join(out) + "\n", start, end)


# Runs in a subprocess: evaluates each probe (a JSON list in argv[1]) in the namespace of the
# module argv[2] and writes its outcome beside it: ["value", repr, lazy, literal, has_float] or
# ["raises", exception name, lazy, "builtin" | "module" | "other"]; lazy: an iterator, listed.
# With argv[3] "pure", the module is the installed source run afresh with its C accelerator
# (`_heapq` for heapq) blocked, as the extract runs it.
_RECORDER = r"""
import ast, builtins, collections.abc, importlib, importlib.util, json, sys
def floats(v):
    return isinstance(v, float) or isinstance(v, (tuple, list)) and any(map(floats, v))
def literal(v):
    try:
        return ast.literal_eval(repr(v)) == v
    except Exception:
        return False
def outcome(module, expr):
    lazy = False
    try:
        value = eval(expr, dict(vars(module)))
        if isinstance(value, collections.abc.Iterator):
            lazy = True
            value = list(value)
    except Exception as exc:
        kind = type(exc)
        where = ("builtin" if getattr(builtins, kind.__name__, None) is kind
                 else "module" if getattr(module, kind.__name__, None) is kind else "other")
        return ["raises", kind.__name__, lazy, where]
    return ["value", repr(value), lazy, literal(value), floats(value)]
name, module = sys.argv[2], None
if sys.argv[3:] == ["pure"]:
    blocked = {"_" + name.split(".")[0], "_" + name.rsplit(".", 1)[-1]} - {name}
    sys.modules.update(dict.fromkeys(blocked))
    spec = importlib.util.find_spec(name)
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError:
        module = sys.modules.pop(name) and None
    for b in blocked:
        del sys.modules[b]
module = module or importlib.import_module(name)
probes = json.load(open(sys.argv[1]))
json.dump([outcome(module, p) for p in probes], open(sys.argv[1] + ".out", "w"))
"""


def _python(args: list[str], cwd: Path, hash_seed: int = 0) -> int:
    """Run this interpreter in `cwd`; its exit code, 124 past TIMEOUT_S."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": str(hash_seed)}
    env.pop("PYTHONPATH", None)
    try:
        return subprocess.run(
            [sys.executable, *args], cwd=cwd, env=env, capture_output=True, timeout=TIMEOUT_S
        ).returncode
    except subprocess.TimeoutExpired:
        return 124


def record(
    cwd: Path, module: str, probes: list[str], hash_seed: int = 0, pure: bool = False
) -> list[list] | None:
    """Each probe's outcome on `module` as imported from `cwd` (`pure`: see _RECORDER); None if
    the run failed."""
    with tempfile.TemporaryDirectory(prefix="flywheel-probe-") as tmp:
        path = Path(tmp, "probes.json")
        path.write_text(json.dumps(probes))
        args = ["-c", _RECORDER, str(path), module] + (["pure"] if pure else [])
        if _python(args, cwd, hash_seed) != 0:
            return None
        return json.loads(Path(f"{path}.out").read_text())


def usable(outcome: list) -> bool:
    """An outcome a test can assert: an exception it can name (not a stub's or a recursion's),
    or a short value whose repr holds no memory address."""
    if outcome[0] == "raises":
        return outcome[3] != "other" and outcome[1] not in ("NotImplementedError", "RecursionError")
    return len(outcome[1]) <= 300 and " at 0x" not in outcome[1]


def same(a: list, b: list) -> bool:
    """Equal outcomes; literals compared as values (a set's repr depends on the hash seed)."""
    if a[0] == b[0] == "value" and a[3] and b[3]:
        return a[2:] == b[2:] and ast.literal_eval(a[1]) == ast.literal_eval(b[1])
    return a == b


def run_tests(files: dict[str, str]) -> int:
    """VERIFY in a fresh folder holding `files`: its exit code, 124 past TIMEOUT_S."""
    with tempfile.TemporaryDirectory(prefix="flywheel-real-") as tmp:
        for name, text in files.items():
            Path(tmp, name).write_text(text)
        return _python(VERIFY.split()[1:], Path(tmp))


_ROUNDED = """

def rounded(value):
    \"\"\"Floats to 9 places, in tuples and lists too.\"\"\"
    if isinstance(value, (tuple, list)):
        return type(value)(map(rounded, value))
    return round(value, 9) if isinstance(value, float) else value
"""


def write_tests(stem: str, function: str, probes: list[tuple[str, list]], names: set[str]) -> str:
    """A unittest file: one method per (expression, outcome), asserting the recorded outcome.

    `names`: the module's top-level names; those the probes use are imported from it.
    """
    used = {n.id for e, _ in probes for n in ast.walk(ast.parse(e)) if isinstance(n, ast.Name)}
    used |= {o[1] for _, o in probes if o[0] == "raises" and o[3] == "module"}
    floats = any(o[0] == "value" and o[3] and o[4] for _, o in probes)
    lines = ["import unittest", "", f"from {stem} import {', '.join(sorted(used & names))}", ""]
    lines += _ROUNDED.splitlines() if floats else []
    title = "".join(part.capitalize() for part in function.split("_"))
    lines += ["", f"class Test{title}(unittest.TestCase):"]
    for i, (expr, outcome) in enumerate(probes, 1):
        lines.append(f"    def test_{function}_{i}(self):")
        if outcome[0] == "raises":
            lines += [f"        with self.assertRaises({outcome[1]}):", f"            {expr}"]
        elif not outcome[3]:  # no literal: compare the repr
            lines.append(f"        self.assertEqual(repr({expr}), {outcome[1]!r})")
        elif outcome[4]:
            lines.append(f"        self.assertEqual(rounded({expr}), rounded({outcome[1]}))")
        else:
            lines.append(f"        self.assertEqual({expr}, {outcome[1]})")
        lines.append("")
    lines += ["", 'if __name__ == "__main__":', "    unittest.main()"]
    return "\n".join(lines) + "\n"
