"""Bug-fix families: one-token mutations of a working module that its original tests catch.

`bugfix/operator_swap`, `bugfix/off_by_one`, `bugfix/comparison`, `bugfix/swapped_arguments`.
The fix restores the original module; a mutation the tests do not notice is dropped.
"""

from __future__ import annotations

import ast
import random
import re
from dataclasses import dataclass

from training.tasks.projects import Project, project_files, verify_command
from training.tasks.task import Task, make_task, run_tests

_OPERATOR_SWAPS = {"+": "-", "-": "+", "*": "/", "/": "*", "//": "/", "%": "//", "**": "*"}
_COMPARISON_SWAPS = {"<": "<=", "<=": "<", ">": ">=", ">=": ">", "==": "!=", "!=": "=="}


@dataclass
class Mutation:
    family: str  # bugfix/...
    line: int  # 1-based line in the module
    before: str  # the original line
    after: str  # the mutated line


def mutations(source: str) -> list[Mutation]:
    """Every single-token mutation we know how to make, in source order.

    Each replaces one span on one line: a binary operator, a comparison, an integer literal
    (+-1), or the first two arguments of a call.
    """
    tree = ast.parse(source)
    lines = source.splitlines()
    found: list[Mutation] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and node.left.end_lineno == node.right.lineno:
            found += _swap_operator(
                "bugfix/operator_swap",
                node.lineno,
                node.left,
                node.right,
                _OPERATOR_SWAPS,
                lines,
                brackets=True,
            )
        elif isinstance(node, ast.Compare) and len(node.ops) == 1:
            right = node.comparators[0]
            if node.left.end_lineno == right.lineno:
                found += _swap_operator(
                    "bugfix/comparison", node.lineno, node.left, right, _COMPARISON_SWAPS, lines
                )
        elif (
            isinstance(node, ast.Constant)
            and type(node.value) is int
            and node.lineno == node.end_lineno
            and node.col_offset > 0
        ):
            found += _off_by_one(node, lines)
        elif isinstance(node, ast.Call) and len(node.args) >= 2 and not node.keywords:
            found += _swapped_arguments(node, lines)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "range" and node.args:
            found += _range_bound(node, lines)
    return sorted(found, key=lambda m: (m.line, m.family, m.after))


def _replace(
    family: str, lines: list[str], lineno: int, start: int, end: int, text: str
) -> Mutation:
    """`lines[lineno]` with columns start..end replaced by `text`."""
    line = lines[lineno - 1]
    return Mutation(family, lineno, line, line[:start] + text + line[end:])


def _swap_operator(
    family: str,
    lineno: int,
    left: ast.expr,
    right: ast.expr,
    table: dict[str, str],
    lines: list[str],
    brackets: bool = False,
) -> list[Mutation]:
    """The operator written between `left` and `right`, swapped for its partner in `table`;
    none when it has none. `brackets`: the operands' brackets may stand in the gap too."""
    line = lines[lineno - 1]
    gap = line[left.end_col_offset : right.col_offset]
    op = gap.strip().strip("()").strip() if brackets else gap.strip()
    if op not in table:
        return []
    start = left.end_col_offset + gap.index(op)
    return [_replace(family, lines, lineno, start, start + len(op), table[op])]


def _off_by_one(node: ast.Constant, lines: list[str]) -> list[Mutation]:
    """An integer literal one more and one less (not in a module constant)."""
    if re.match(r"\s*[A-Z_]+ = ", lines[node.lineno - 1]):  # constants are for edit tasks
        return []
    return [
        _replace(
            "bugfix/off_by_one",
            lines,
            node.lineno,
            node.col_offset,
            node.end_col_offset,
            str(node.value + delta),
        )
        for delta in (1, -1)
    ]


def _swapped_arguments(node: ast.Call, lines: list[str]) -> list[Mutation]:
    a, b = node.args[0], node.args[1]
    if not (a.lineno == a.end_lineno == b.lineno == b.end_lineno):
        return []
    line = lines[a.lineno - 1]
    ta = line[a.col_offset : a.end_col_offset]
    tb = line[b.col_offset : b.end_col_offset]
    if ta == tb:
        return []
    mutated = line[: a.col_offset] + tb + line[a.end_col_offset : b.col_offset] + ta
    return [
        Mutation("bugfix/swapped_arguments", a.lineno, line, mutated + line[b.end_col_offset :])
    ]


def _range_bound(node: ast.Call, lines: list[str]) -> list[Mutation]:
    """`range(..., n)` -> `range(..., n - 1)`: the `len(x) - 1` kind of off-by-one."""
    arg = node.args[-1]
    if arg.lineno != arg.end_lineno or isinstance(arg, ast.Constant):
        return []
    text = lines[arg.lineno - 1][arg.col_offset : arg.end_col_offset]
    return [
        _replace(
            "bugfix/off_by_one",
            lines,
            arg.lineno,
            arg.col_offset,
            arg.end_col_offset,
            f"{text} - 1",
        )
    ]


_BUG_PHRASES = [
    "The tests in {t} fail. Find the bug and fix it without changing the tests.",
    "fix the failing tests",
    "Something is wrong in {f}: {test} fails. Please fix it.",
    "{test} is failing, can you fix the code?",
    "Run the tests, find out why they fail and fix the code (not the tests).",
]


def bugfix_tasks(p: Project, rng: random.Random, heldout_fraction: float, limit: int) -> list[Task]:
    """Up to `limit` tasks from mutating the module; the tests are the original, passing ones."""
    files = project_files(p)
    mod_file, test_file = f"{p.module}.py", f"test_{p.module}.py"
    candidates = mutations(p.source)
    rng.shuffle(candidates)
    tasks: list[Task] = []
    seen_families: dict[str, int] = {}
    for m in sorted(candidates, key=lambda m: seen_families.get(m.family, 0)):
        if len(tasks) >= limit:
            break
        if seen_families.get(m.family, 0) >= max(1, limit // 3):
            continue
        lines = p.source.splitlines(keepends=True)
        lines[m.line - 1] = m.after + "\n"
        broken = "".join(lines)
        code, output = run_tests({**files, mod_file: broken}, verify_command(p))
        if code in (0, 124):
            continue  # tests do not notice this mutation (or it hangs): not a verifiable task
        # unittest's "FAIL: test_x (...)", pytest's "FAILED test_m.py::test_x - ..."
        failing = re.findall(r"(?:FAIL: |ERROR: |FAILED \S+::)(test_\w+)", output)
        test = failing[0] if failing else "a test"
        instruction = rng.choice(_BUG_PHRASES).format(t=test_file, f=mod_file, test=test)
        task = make_task(
            m.family,
            p,
            instruction,
            {**files, mod_file: broken},
            {mod_file: p.source},
            heldout_fraction,
            line=m.line,
            mutated=m.after.strip(),
            original=m.before.strip(),
            failing=failing,
        )
        tasks.append(task)  # the fix restores the original module, whose tests pass
        seen_families[m.family] = seen_families.get(m.family, 0) + 1
    return tasks
