"""Real-code tasks for `flywheel bench agent --real`: bugs put into real functions of the installed
packages, and real function bodies removed, each in a small workspace with its own unittest file.

Vocabulary used throughout:

    function   a top-level function of an installed pure-Python module, of the standard library
               or of site-packages (real_probes.txt lists which)
    package    its top-level name (`email` for email.utils): the unit of the held-out split, so
               no held-out task shares code with a train one
    extract    the function with every top-level statement it needs (imports, constants, helpers,
               classes) in source order, as one module of at most MAX_MODULE_LINES lines that
               imports only the standard library (the workspace runs on any Python)
    probe      a call of the function on chosen inputs; its outcome (a value or an exception) is
               recorded by running the original code
    task       the broken extract and `test_<module>.py`, an instruction phrased as a user would,
               the verify command and the reference solution (the extract); families
               `bugfix/operator_swap|comparison|off_by_one|swapped_arguments` (training/tasks.py's
               `mutations`, inside the function) and `rewrite/body` (the body replaced by `raise
               NotImplementedError`; the instruction names the function and quotes its docstring)

Why generated tests rather than the projects' own: the standard library's tests are whole modules
that need `test.support`, and most packages ship none; neither fits an 8k-token context beside the
code. One small unittest file per function, a test method per probe asserting the outcome of the
original code, needs only the standard library and tests exactly the function of the task. A probe
is kept when the extract gives the same outcome as the installed module's own source (a faithful
extraction) under two hash seeds (no dependence on set order), and the outcome is a literal, a
repr compared as text, or an exception the test can name; floats are compared to 9 places.

Every task is verified when built: its tests pass on the original and fail on the broken
workspace (a mutant they miss, or one that hangs, is dropped and counted). The build is
deterministic from a seed (which mutants, which phrasing); the split is not: it hashes the package
name, so held-out packages stay held out for every seed. The train split is for training
(`real_tasks(split="train")`; each cached row carries its reference solution). The set is cached
under $FLYWHEEL_CACHE/real-tasks/, keyed by this code, training/tasks.py, the Python version, the
seed and the source of every module probed.

What it does not do: methods or classes as targets, tasks spanning files, the projects' own tests.

    python -m training.real_tasks                 # build (or rebuild) the cached set; a table
    python -m training.real_tasks --out runs/real # ... into a folder (--real runs/real reads it)
    flywheel bench agent --real                   # the held-out split through the harness
"""

from __future__ import annotations

import argparse
import ast
import builtins
import hashlib
import importlib
import importlib.util
import inspect
import json
import os
import random
import re
import shutil
import subprocess
import symtable
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

MAX_MODULE_LINES = 150  # an extract longer than this is dropped: the model has an 8k context
MIN_PROBES, MAX_PROBES = 3, 8  # usable probes a function needs (2 of them values, not
# exceptions, so a body that only raises fails), and how many its tests keep
MUTANTS_PER_FUNCTION = 3  # bug tasks per function (of different families when possible)
HELDOUT_FRACTION = 0.3  # of packages, by a hash of the package name
TIMEOUT_S = 5.0  # per test or probe run while building; a mutant past it is dropped
VERIFY = "python -m unittest"

# One line per function, `module.function: probe; probe; ...`: Python expressions calling it.
PROBES_FILE = Path(__file__).with_name("real_probes.txt")


class ExtractError(Exception):
    """A function that cannot become a small self-contained module; `reason` is a drop count key."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass
class Extract:
    source: str  # the workspace module: the function and the top-level statements it needs
    start: int  # the function's `def` line in `source` (1-based)
    end: int  # its last line


def _bound_names(stmt: ast.stmt) -> set[str]:
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
        for name in _bound_names(stmt):
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


# --- probes ----------------------------------------------------------------------------------


def probe_table(only: list[tuple[str, str]] | None = None) -> dict[tuple[str, str], list[str]]:
    """(module, function) -> probe expressions, from PROBES_FILE (`only`: just these functions)."""
    table: dict[tuple[str, str], list[str]] = {}
    for line in PROBES_FILE.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        match = re.match(r"([\w.]+)\.(\w+): (.*)$", line)
        if not match:
            raise ValueError(f"{PROBES_FILE.name}: not `module.function: probe; probe`: {line!r}")
        if only is None or (match[1], match[2]) in only:
            probes = [ast.get_source_segment(match[3], e) for e in ast.parse(match[3]).body]
            table.setdefault((match[1], match[2]), []).extend(probes)
    return table


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


def _usable(outcome: list) -> bool:
    if outcome[0] == "raises":
        return outcome[3] != "other" and outcome[1] not in ("NotImplementedError", "RecursionError")
    return len(outcome[1]) <= 300 and " at 0x" not in outcome[1]


def _same(a: list, b: list) -> bool:
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


# --- tasks -----------------------------------------------------------------------------------

_BUG_EXAMPLE = [
    "`{call}` {actual}, but it should {expected}. Fix {file}.",
    "In {file}, `{call}` {actual}; it should {expected}. Can you fix the code?",
]
_BUG_GENERAL = [
    "{test} fails. Fix the code in {file}, not the tests.",
    "The tests in {test_file} fail. Find the bug in `{function}()` and fix it.",
    "`{function}()` in {file} gives wrong results for some inputs. Run the tests and fix it.",
    "fix the failing tests",
]
_REWRITE = [
    "`{function}()` in {file} has lost its body: it only raises NotImplementedError. "
    "Write it again.{doc}",
    "Implement `{function}()` in {file}; it raises NotImplementedError now.{doc}",
]


def _says(outcome: list, verb: str) -> str:
    """An outcome in words: "returns `3`" / "raises ValueError" (verb "return": "return `3`")."""
    if outcome[0] == "raises":
        return f"{verb.replace('return', 'raise')} {outcome[1]}"
    return f"{verb} `{outcome[1]}`"


def stem_of(module: str) -> str:
    """The workspace module's name: the last part, suffixed when it would shadow the stdlib."""
    stem = module.rsplit(".", 1)[-1].strip("_")
    return f"{stem}_mod" if stem in sys.stdlib_module_names else stem


def package_of(module: str) -> str:
    return module.split(".")[0]


def is_heldout(package: str, fraction: float = HELDOUT_FRACTION) -> bool:
    digest = hashlib.sha256(f"real-tasks:{package}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def _function_tasks(job: tuple[str, str, list[str], int]) -> tuple[list[dict], Counter]:
    """One function's verified tasks (cache rows) and why candidates were dropped."""
    from training.benchmark import BenchTask, changed_lines
    from training.tasks.bugfix import mutations

    module, function, probes, seed = job
    stem, drops = stem_of(module), Counter()
    mod_file, test_file = f"{stem}.py", f"test_{stem}.py"
    try:
        ex = extract(module, function, f"# {function}() of {module}, with what it needs.")
    except ExtractError as exc:
        return [], Counter({exc.reason: 1})
    with tempfile.TemporaryDirectory(prefix="flywheel-real-") as tmp:
        ws, empty = Path(tmp, "ws"), Path(tmp, "empty")
        ws.mkdir(), empty.mkdir()
        (ws / mod_file).write_text(ex.source)
        runs = [
            record(ws, stem, probes, 0),
            record(ws, stem, probes, 1),
            record(empty, module, probes, pure=True),
        ]
    if any(r is None for r in runs):
        return [], Counter({"import_fails": 1})
    keep = [
        i
        for i, o in enumerate(runs[0])
        if _same(o, runs[1][i]) and _same(o, runs[2][i]) and _usable(o)
    ][:MAX_PROBES]
    if len(keep) < MIN_PROBES or sum(runs[0][i][0] == "value" for i in keep) < 2:
        return [], Counter({"few_probes": 1})
    kept = [(f"list({probes[i]})" if runs[0][i][2] else probes[i], runs[0][i]) for i in keep]
    tree = ast.parse(ex.source)
    names = set().union(*(_bound_names(s) for s in tree.body))
    tests = write_tests(stem, function, kept, names)
    original = {mod_file: ex.source, test_file: tests}
    if run_tests(original) != 0:
        return [], Counter({"original_fails": 1})
    rng = random.Random(f"real-tasks:{seed}:{module}.{function}")
    rows: list[dict] = []

    def add(family: str, broken: str, instruction: str) -> None:
        files = {mod_file: broken, test_file: tests}
        digest = hashlib.sha256(json.dumps([instruction, files], sort_keys=True).encode())
        task = BenchTask(
            id=f"real/{module}.{function}/{family.split('/')[1]}-{digest.hexdigest()[:8]}",
            source="real",
            family=family,
            instruction=instruction,
            files=files,
            verify=VERIFY,
            verify_files={test_file: tests},  # restored before verifying
            test_command=None,  # the harness detects it, as on a user's project
            reference_changed_lines=changed_lines(files, original),
        )
        split = "heldout" if is_heldout(package_of(module)) else "train"
        rows.append(
            {
                "split": split,
                "package": package_of(module),
                "module": module,
                "function": function,
                "solution": {mod_file: ex.source},
                "task": asdict(task),
            }
        )

    fmt = {"file": mod_file, "test_file": test_file, "function": function}
    candidates = [m for m in mutations(ex.source) if ex.start <= m.line <= ex.end]
    rng.shuffle(candidates)
    tried: Counter = Counter()
    made = 0
    lines = ex.source.splitlines(keepends=True)
    while candidates and made < MUTANTS_PER_FUNCTION:
        m = min(candidates, key=lambda c: tried[c.family])  # families in turn, shuffled within
        candidates.remove(m)
        tried[m.family] += 1
        broken = "".join(lines[: m.line - 1] + [m.after + "\n"] + lines[m.line :])
        try:
            ast.parse(broken)
        except SyntaxError:
            drops["mutant_unparsable"] += 1
            continue
        code = run_tests({mod_file: broken, test_file: tests})
        if code in (0, 124):
            drops["mutant_undetected" if code == 0 else "mutant_hangs"] += 1
            continue
        made += 1
        with tempfile.TemporaryDirectory(prefix="flywheel-real-") as tmp:
            Path(tmp, mod_file).write_text(broken)
            outcomes = record(Path(tmp), stem, [e for e, _ in kept]) or []
        wrong = [i for i, o in enumerate(outcomes) if o[:2] != kept[i][1][:2]]  # the first one
        (expr, want), got = (kept[wrong[0]], outcomes[wrong[0]]) if wrong else ((None, None), None)
        if wrong and rng.random() < 0.5 and max(len(expr), len(want[1]), len(got[1])) <= 70:
            instruction = rng.choice(_BUG_EXAMPLE).format(
                call=expr, actual=_says(got, "returns"), expected=_says(want, "return"), **fmt
            )
        else:
            test = f"test_{function}_{wrong[0] + 1}" if wrong else None
            instruction = rng.choice(_BUG_GENERAL[0 if test else 1 :]).format(test=test, **fmt)
        add(m.family, broken, instruction)
    if not made:
        drops["no_mutant"] += 1
    [target] = [s for s in tree.body if isinstance(s, ast.FunctionDef) and s.lineno == ex.start]
    doc = ast.get_docstring(target)
    body = target.body[1:] if doc is not None else target.body
    if not body:
        drops["no_body"] += 1
        return rows, drops
    indent = " " * body[0].col_offset
    broken = "".join(
        lines[: body[0].lineno - 1]
        + [f"{indent}raise NotImplementedError\n"]
        + lines[target.end_lineno :]
    )
    if run_tests({mod_file: broken, test_file: tests}) == 0:
        drops["rewrite_undetected"] += 1
        return rows, drops
    if doc:
        doc = doc if len(doc) <= 600 else doc.split("\n\n")[0][:600]
        doc = f" Its docstring says:\n\n{doc}"
    else:
        doc = f" The tests in {test_file} show what it should do."
    add("rewrite/body", broken, rng.choice(_REWRITE).format(doc=doc, **fmt))
    return rows, drops


# --- building, caching and loading -----------------------------------------------------------


def build(
    seed: int = 0,
    only: list[tuple[str, str]] | None = None,
    workers: int = 1,
    log: Callable[[str], None] | None = None,
) -> tuple[list[dict], dict]:
    """Every function's verified tasks (rows: split, package, module, function, solution, task)
    and a manifest with the counts per package and the drop reasons."""
    from training.tasks.generation import in_order

    jobs = [(m, f, probes, seed) for (m, f), probes in probe_table(only).items()]
    rows: list[dict] = []
    drops: Counter = Counter()
    packages: dict[str, dict] = {}
    for (module, function, _, _), (found, dropped) in zip(
        jobs, in_order(_function_tasks, jobs, workers), strict=True
    ):
        rows += found
        drops.update(dropped)
        p = package_of(module)
        entry = packages.setdefault(
            p, {"split": "heldout" if is_heldout(p) else "train", "functions": 0, "tasks": 0}
        )
        entry["functions"] += bool(found)
        entry["tasks"] += len(found)
        if log:
            why = ", ".join(f"{k} {v}" for k, v in sorted(dropped.items()))
            log(f"{module}.{function}: {len(found)} tasks" + (f" (dropped: {why})" if why else ""))
    manifest = {
        "seed": seed,
        "python": sys.version.split()[0],
        "tasks": dict(Counter(r["split"] for r in rows)),
        "packages": dict(sorted(packages.items())),
        "dropped": dict(sorted(drops.items())),
    }
    return rows, manifest


def cache_folder(seed: int = 0) -> Path:
    """Where the set for `seed` is cached, keyed by what it depends on: this code, the probes,
    training/tasks/bugfix.py (the mutations), the Python version and the source of every module probed."""
    from telemetry.folders import cache_home

    h = hashlib.sha256(f"{seed}:{sys.version}".encode())
    for path in [__file__, PROBES_FILE, Path(__file__).with_name("tasks") / "bugfix.py"]:
        h.update(Path(path).read_bytes())
    for module in sorted({m for m, _ in probe_table()}):
        spec = importlib.util.find_spec(module)
        if spec and spec.origin and Path(spec.origin).is_file():
            h.update(Path(spec.origin).read_bytes())
    return cache_home() / "real-tasks" / f"seed{seed}-{h.hexdigest()[:16]}"


def write_set(folder: str | Path, rows: list[dict], manifest: dict) -> Path:
    """tasks.jsonl and manifest.json in `folder`, written whole (a temporary folder renamed)."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    (tmp / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder


def read_rows(folder: str | Path) -> list[dict]:
    file = Path(folder) / "tasks.jsonl"
    if not file.is_file():
        raise FileNotFoundError(
            f"no real tasks at {str(folder)!r}; build them with "
            f"`python -m training.real_tasks --out {folder}`"
        )
    return [json.loads(line) for line in file.read_text().splitlines() if line.strip()]


def real_tasks(
    folder: str | Path | None = None,
    split: str = "heldout",
    seed: int = 0,
    workers: int | None = None,
    log: Callable[[str], None] | None = None,
) -> list:
    """BenchTasks of one split ("heldout", "train" or "all"): from `folder` (written by this
    module's `--out`), else from the cache, built first (in `workers` processes) when absent."""
    from training.benchmark import BenchTask
    from training.tasks.generation import default_workers

    if split not in ("heldout", "train", "all"):
        raise ValueError(f"split must be heldout, train or all, not {split!r}")
    if folder is None:
        folder = cache_folder(seed)
        if not (folder / "tasks.jsonl").is_file():
            if log:
                log(f"building the real-code tasks into {folder} (once)")
            write_set(folder, *build(seed, workers=workers or default_workers(), log=log))
    rows = read_rows(folder)
    return [BenchTask(**r["task"]) for r in rows if split == "all" or r["split"] == split]


def main(argv: list[str] | None = None) -> int:
    from training.tasks.generation import default_workers

    p = argparse.ArgumentParser(
        prog="python -m training.real_tasks", description=__doc__.split("\n")[0]
    )
    p.add_argument("--out", default=None, help="folder to write (default: the cache --real reads)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=default_workers(), help="processes")
    p.add_argument("--only", nargs="*", default=None, help="module:function ... (a subset)")
    p.add_argument("--verbose", action="store_true", help="one line per function")
    args = p.parse_args(argv)
    only = [tuple(x.rsplit(":", 1)) for x in args.only] if args.only is not None else None
    folder = Path(args.out) if args.out else cache_folder(args.seed)
    log = (lambda s: print(s, file=sys.stderr)) if args.verbose else None
    write_set(folder, *build(args.seed, only, args.workers, log))
    manifest = json.loads((folder / "manifest.json").read_text())
    print(f"{'package':<20} {'split':<8} {'functions':>9} {'tasks':>6}")
    for name, entry in manifest["packages"].items():
        print(f"{name:<20} {entry['split']:<8} {entry['functions']:>9} {entry['tasks']:>6}")
    for split in ("heldout", "train"):
        chosen = [e for e in manifest["packages"].values() if e["split"] == split and e["tasks"]]
        print(f"{split}: {manifest['tasks'].get(split, 0)} tasks from {len(chosen)} packages")
    print("dropped: " + ", ".join(f"{k} {v}" for k, v in manifest["dropped"].items()))
    print(f"written: {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
