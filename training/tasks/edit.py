"""Edit families: instruction-explicit changes whose updated tests describe the target.

`edit/rename`, `edit/constant`, `edit/add_parameter`, `edit/add_import`, `edit/remove_function`:
the workspace holds the project with its tests already rewritten for the change.
`rewrite/body`: a function's body is `raise NotImplementedError`, to be written from its docstring
or, where it has none, from its tests; the tests are the project's own.
"""

from __future__ import annotations

import ast
import random
import re
from dataclasses import dataclass, field
from typing import Any

from training.tasks.names import function_name
from training.tasks.projects import Project, project_files, write_tests
from training.tasks.task import Task, make_task


def _style(p: Project, unittest_lines: list[str], pytest_lines: list[str]) -> list[str]:
    """A requested change's test lines as the project's test file writes its checks."""
    return pytest_lines if p.test_style == "pytest" else unittest_lines


def _sub_word(text: str, old: str, new: str) -> str:
    return re.sub(rf"\b{re.escape(old)}\b", new, text)


def edit_tasks(p: Project, rng: random.Random, heldout_fraction: float) -> list[Task]:
    """Instruction-explicit edits, one per family (add_parameter only where the function's
    returns can be scaled). The workspace tests describe the target."""
    before = project_files(p)
    tasks = []
    makers = (_rename, _change_constant, _add_parameter, _add_import, _remove_function)
    edits = [make(p, rng) for make in makers]
    # its own draws: the other families' tasks (and the bug fixes drawn after them) stay as
    # they were before it existed
    edits.append(_write_body(p, random.Random(f"body:{p.key}")))
    for edit in edits:
        if edit is not None:
            files = {**before, **edit.workspace, f"test_{p.module}.py": edit.tests}
            tasks.append(
                make_task(
                    edit.family,
                    p,
                    edit.instruction,
                    files,
                    edit.solution,
                    heldout_fraction,
                    **edit.notes,
                )
            )
    return tasks


@dataclass
class _Edit:
    """One requested change: the workspace is the project with its test file already rewritten
    for it."""

    family: str
    instruction: str
    tests: str  # the project's test file, rewritten for the change
    solution: dict[str, str]  # the files as the change leaves them
    notes: dict[str, Any]  # what the oracle's answer names (Task.notes)
    workspace: dict[str, str] = field(default_factory=dict)  # other files that start changed


def _rename(p: Project, rng: random.Random) -> _Edit:
    """Rename a function everywhere it is used."""
    funcs = [v for k, v in p.names.items() if k not in ("cls", "legacy")]
    old = rng.choice(funcs)
    new = function_name(rng, set(funcs) | {old})
    src, hsrc = _sub_word(p.source, old, new), _sub_word(p.helper_source, old, new)
    after = project_files(p, src, hsrc, [_sub_word(c, old, new) for c in p.calls])
    phr = rng.choice(
        [
            "Rename the function `{o}` in {f} to `{n}` and update every caller.",
            "rename {o} -> {n} (in {f}), keep callers working",
            "Please rename `{o}` to `{n}`. It is defined in {f} and used elsewhere.",
        ]
    )
    instruction = phr.format(o=old, n=new, f=f"{p.module}.py")
    tests = after[f"test_{p.module}.py"]
    return _Edit("edit/rename", instruction, tests, after, {"old": old, "new": new})


def _change_constant(p: Project, rng: random.Random) -> _Edit:
    """Change the value of a module constant."""
    name, value = rng.choice(list(p.constants.items()))
    if isinstance(value, str):
        new_value: object = rng.choice([v for v in ["-", "_", ".", "...", "~", ":"] if v != value])
    elif isinstance(value, float):
        new_value = round(value * rng.choice([0.5, 2.0, 1.5]), 4)
    else:
        new_value = value + rng.choice([-2, -1, 1, 2, 5])
    src = p.source.replace(f"{name} = {value!r}", f"{name} = {new_value!r}", 1)
    after = project_files(p, src)
    phr = rng.choice(
        [
            "Change {c} in {f} from {o!r} to {n!r}.",
            "set {c} to {n!r}",
            "The {c} constant should be {n!r} instead of {o!r}; update {f}.",
        ]
    )
    mod_file = f"{p.module}.py"
    instruction = phr.format(c=name, f=mod_file, o=value, n=new_value)
    notes = {"constant": name, "old": value, "new": new_value}
    return _Edit("edit/constant", instruction, after[f"test_{p.module}.py"], {mod_file: src}, notes)


def _add_parameter(p: Project, rng: random.Random) -> _Edit | None:
    """Add a keyword parameter that scales a numeric result (None where the returns cannot be
    rewritten)."""
    func = rng.choice(p.numeric_functions)
    param = rng.choice(["scale", "factor", "multiplier", "weight"])
    src = _add_scale_parameter(p.source, func, param)
    if src is None:
        return None
    example = next((c for c in p.calls if c.startswith(f"mod.{func}(")), None)
    calls = list(p.calls)
    if example:
        calls.append(example[:-1] + f", {param}=3)")
    after = project_files(p, src, calls=calls)
    phr = rng.choice(
        [
            "Add a keyword parameter `{p}` (default 1) to `{fn}` in {f}; the "
            "function should return its result multiplied by `{p}`.",
            "{fn} needs an optional `{p}=1` argument that multiplies what it returns",
            "Give `{fn}` a `{p}` parameter, default 1, scaling the returned value.",
        ]
    )
    mod_file = f"{p.module}.py"
    instruction = phr.format(p=param, fn=func, f=mod_file)
    notes = {"function": func, "parameter": param}
    tests = after[f"test_{p.module}.py"]
    return _Edit("edit/add_parameter", instruction, tests, {mod_file: src}, notes)


def _add_import(p: Project, rng: random.Random) -> _Edit:
    """Add an import and the one line that uses it."""
    variant = rng.choice(["logging", "pathlib"])
    if variant == "logging":
        addition = "import logging\n\nlogger = logging.getLogger(__name__)\n"
        extra = _style(
            p,
            ["import logging", "self.assertIsInstance(mod.logger, logging.Logger)"],
            ["import logging", "assert isinstance(mod.logger, logging.Logger)"],
        )
        phr = rng.choice(
            [
                "Add `import logging` to {f} and a module-level "
                "`logger = logging.getLogger(__name__)`.",
                "{f} should define logger = logging.getLogger(__name__) (import logging)",
            ]
        )
    else:
        addition = 'from pathlib import Path\n\nDATA_DIR = Path(__file__).parent / "data"\n'
        extra = _style(
            p,
            [
                "from pathlib import Path",
                "self.assertIsInstance(mod.DATA_DIR, Path)",
                'self.assertEqual(mod.DATA_DIR.name, "data")',
            ],
            [
                "from pathlib import Path",
                "assert isinstance(mod.DATA_DIR, Path)",
                'assert mod.DATA_DIR.name == "data"',
            ],
        )
        phr = rng.choice(
            [
                "In {f}, import `Path` from pathlib and add a constant "
                '`DATA_DIR = Path(__file__).parent / "data"`.',
                'add DATA_DIR (a pathlib Path to the "data" folder next to {f})',
            ]
        )
    doc_end = p.source.index('"""', 3) + 4
    src = p.source[:doc_end] + "\n" + addition + p.source[doc_end:]
    tests = write_tests(p.module, p.helper, src, p.helper_source, p.calls, extra, p.test_style)
    mod_file = f"{p.module}.py"
    notes = {"variant": variant}
    return _Edit("edit/add_import", phr.format(f=mod_file), tests, {mod_file: src}, notes)


def _remove_function(p: Project, rng: random.Random) -> _Edit:
    """Remove the unused legacy function."""
    legacy = p.names["legacy"]
    src = re.sub(rf"\n\n\ndef {legacy}\(.*?(?=\n\n\n|\Z)", "", p.source, flags=re.S)
    src = src.rstrip("\n") + "\n"
    gone = _style(
        p, [f'self.assertFalse(hasattr(mod, "{legacy}"))'], [f'assert not hasattr(mod, "{legacy}")']
    )
    tests = write_tests(p.module, p.helper, src, p.helper_source, p.calls, gone, p.test_style)
    phr = rng.choice(
        [
            "Remove the unused function `{l}` from {f}.",
            "delete {l}, nothing uses it",
            "`{l}` in {f} is dead code; remove it.",
        ]
    )
    mod_file = f"{p.module}.py"
    instruction = phr.format(l=legacy, f=mod_file)
    return _Edit("edit/remove_function", instruction, tests, {mod_file: src}, {"function": legacy})


def _write_body(p: Project, rng: random.Random) -> _Edit | None:
    """Write a function's body: a function the tests call, with everything after its signature
    (and docstring, if it has one) replaced by `raise NotImplementedError`. A documented one is
    written from its docstring, another from what its tests expect."""
    tree = ast.parse(p.source)
    called = [
        n
        for n in tree.body
        if isinstance(n, ast.FunctionDef) and any(c.startswith(f"mod.{n.name}(") for c in p.calls)
    ]
    if not called:
        return None
    node = rng.choice(called)
    documented = ast.get_docstring(node) is not None
    if documented and len(node.body) == 1:
        return None
    lines = p.source.splitlines(keepends=True)
    start = node.body[int(documented)].lineno - 1  # the body's first line after a docstring
    indent = lines[start][: len(lines[start]) - len(lines[start].lstrip())]
    stub = lines[:start] + [f"{indent}raise NotImplementedError\n"] + lines[node.end_lineno :]
    mod_file, test_file = f"{p.module}.py", f"test_{p.module}.py"
    phrasings = (
        [
            "Implement `{fn}` in {f} as its docstring describes.",
            "`{fn}` in {f} only raises NotImplementedError. Write its body so the tests pass.",
            "write the body of {fn} ({f}) from its docstring",
        ]
        if documented
        else [
            "Implement `{fn}` in {f}; {t} shows what it must return.",
            "`{fn}` in {f} only raises NotImplementedError. Write its body so {t} passes.",
            "write the body of {fn} ({f}), the tests say what it returns",
        ]
    )
    return _Edit(
        "rewrite/body",
        rng.choice(phrasings).format(fn=node.name, f=mod_file, t=test_file),
        project_files(p)[test_file],
        {mod_file: p.source},
        {"function": node.name, "documented": documented},
        {mod_file: "".join(stub)},
    )


def _add_scale_parameter(source: str, func: str, param: str) -> str | None:
    """Add `param=1` to `func`'s signature and multiply each of its return values by it."""
    tree = ast.parse(source)
    node = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == func), None)
    if node is None:
        return None
    lines = source.splitlines(keepends=True)
    for ret in sorted(
        (n for n in ast.walk(node) if isinstance(n, ast.Return) and n.value),
        key=lambda n: -n.lineno,
    ):
        value = ret.value
        if value.lineno != value.end_lineno:
            return None
        line = lines[value.lineno - 1]
        expr = line[value.col_offset : value.end_col_offset]
        lines[value.lineno - 1] = (
            line[: value.col_offset] + f"({expr}) * {param}" + line[value.end_col_offset :]
        )
    header = lines[node.lineno - 1]
    lines[node.lineno - 1] = header.replace("):", f", {param}=1):", 1)
    return "".join(lines)
