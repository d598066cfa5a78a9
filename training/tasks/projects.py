"""Projects: a template made concrete as a module, a helper module and a passing test file.

`write_tests` takes each expected value from running the sources themselves, so a project passes
its own tests by construction; the task families then change or break it. The test file is a
unittest class or plain pytest functions (`Project.test_style`), so the agent learns to read both
kinds of failure report; `verify_command` is the command each runs with.
"""

from __future__ import annotations

import random
import re
import sys
from dataclasses import dataclass

from agent.harness.project import PYTEST_ARGS
from training.tasks.names import HELPER_NAMES, MODULE_NAMES
from training.tasks.templates import TEMPLATES


@dataclass
class Project:
    """A working project: every test passes. Names are the template's symbols, randomised."""

    key: str  # template:seed, decides the split
    module: str  # module file name without .py
    helper: str  # helper module file name without .py
    names: dict[str, str]  # role -> chosen symbol name
    constants: dict[str, object]  # constant name -> value
    numeric_functions: list[str]  # functions returning numbers (for add_parameter)
    source: str  # the module's text
    helper_source: str  # the helper module's text
    calls: list[str]  # expressions the tests check, in terms of `mod.` and `helper.`
    test_style: str = "unittest"  # or "pytest": how the test file is written and run


TEST_COMMAND = "python -m unittest"  # unittest projects, the default
PYTEST_COMMAND = f"python {PYTEST_ARGS}"  # as the harness runs a detected pytest project
TEST_STYLES = ("unittest", "pytest")


def verify_command(p: Project) -> str:
    """The command that runs `p`'s tests from the workspace root."""
    return PYTEST_COMMAND if p.test_style == "pytest" else TEST_COMMAND


def make_project(template: str, seed: int, test_style: str = "unittest") -> Project:
    if test_style not in TEST_STYLES:
        raise ValueError(f"test_style must be one of {TEST_STYLES}, not {test_style!r}")
    rng = random.Random(f"{template}:{seed}")
    used: set[str] = set()
    names, constants, source, helper_source, calls = TEMPLATES[template](rng, used)
    module = rng.choice(MODULE_NAMES)
    helper = rng.choice(HELPER_NAMES)
    numeric = [
        names[k]
        for k in (
            "total",
            "tax",
            "discount",
            "window",
            "average",
            "passed",
            "interest",
            "fee",
            "count",
            "score",
            "retries",
            "total_of",
            "shipping",
        )
        if k in names
    ]
    return Project(
        key=f"{template}:{seed}",
        module=module,
        helper=helper,
        names=names,
        constants=constants,
        numeric_functions=numeric,
        source=source,
        helper_source=helper_source.replace("{module}", module),
        calls=calls,
        test_style=test_style,
    )


def write_tests(
    module: str,
    helper: str,
    source: str,
    helper_source: str,
    calls: list[str],
    extra: list[str] = (),
    style: str = "unittest",
) -> str:
    """A test file asserting what the given module and helper sources compute for `calls`.

    Expected values come from executing the sources themselves; a call that raises becomes an
    assertRaises (`pytest.raises`). `extra` lines (in the file's style: `self.assert…` in a
    unittest class, plain `assert` in pytest) make one more test. `style` is "unittest" (a TestCase class) or "pytest" (functions).
    """
    mod = _load(module, source, {})
    helper_mod = _load(helper, helper_source, {module: mod})
    pytest_style = style == "pytest"
    indent = "    " if pytest_style else "        "
    if pytest_style:
        lines = ["import pytest", "", f"import {helper} as helper", f"import {module} as mod"]
    else:
        lines = [
            "import unittest",
            "",
            f"import {helper} as helper",
            f"import {module} as mod",
            "",
            "",
            f"class Test{module.title().replace('_', '')}(unittest.TestCase):",
        ]

    def test(name: str, body: list[str]) -> None:
        if pytest_style:
            lines.extend(["", "", f"def {name}():"])
        else:
            lines.append(f"    def {name}(self):")
        lines.extend(indent + line for line in body)
        if not pytest_style:
            lines.append("")

    for i, expr in enumerate(calls):
        name = re.sub(r"\W+", "_", expr.split("(")[0].split(".")[-1]).strip("_")
        try:
            value = eval(expr, {"mod": mod, "helper": helper_mod})  # noqa: S307 - our own text
        except Exception as exc:  # the code under test raises: the test expects it
            kind = type(exc).__name__
            raises = f"pytest.raises({kind})" if pytest_style else f"self.assertRaises({kind})"
            body = [f"with {raises}:", f"    {expr}"]
        else:
            if pytest_style and isinstance(value, float):
                body = [f"assert {expr} == pytest.approx({value!r})"]
            elif pytest_style:
                body = [f"assert {expr} == {value!r}"]
            elif isinstance(value, float):
                body = [f"self.assertAlmostEqual({expr}, {value!r})"]
            else:
                body = [f"self.assertEqual({expr}, {value!r})"]
        test(f"test_{name}_{i}", body)
    if extra:
        test("test_requested_change", list(extra))
    if pytest_style:
        lines.append("")
    else:
        lines += ["", 'if __name__ == "__main__":', "    unittest.main()", ""]
    return "\n".join(lines)


def _load(name: str, source: str, deps: dict) -> object:
    import types

    module = types.ModuleType(name)
    module.__file__ = f"{name}.py"
    saved = {k: sys.modules.get(k) for k in deps}
    sys.modules.update(deps)
    try:
        exec(compile(source, f"{name}.py", "exec"), module.__dict__)  # noqa: S102 - our own text
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    return module


def project_files(
    p: Project,
    source: str | None = None,
    helper_source: str | None = None,
    calls: list[str] | None = None,
    extra: list[str] = (),
) -> dict[str, str]:
    source = p.source if source is None else source
    helper_source = p.helper_source if helper_source is None else helper_source
    tests = write_tests(
        p.module, p.helper, source, helper_source, calls or p.calls, extra, p.test_style
    )
    return {f"{p.module}.py": source, f"{p.helper}.py": helper_source, f"test_{p.module}.py": tests}
