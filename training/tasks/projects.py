"""Projects: a template made concrete as a module, a helper module and a passing unittest file.

`write_tests` takes each expected value from running the sources themselves, so a project passes
its own tests by construction; the task families then change or break it.
"""

from __future__ import annotations

import random
import re
import sys
from dataclasses import dataclass

from training.tasks.templates import HELPER_NAMES, MODULE_NAMES, TEMPLATES


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


def make_project(template: str, seed: int) -> Project:
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
    )


def write_tests(
    module: str,
    helper: str,
    source: str,
    helper_source: str,
    calls: list[str],
    extra: list[str] = (),
) -> str:
    """A unittest file asserting what the given module and helper sources compute for `calls`.

    Expected values come from executing the sources themselves; a call that raises becomes an
    assertRaises. `extra` lines are added verbatim to one more test method.
    """
    mod = _load(module, source, {})
    helper_mod = _load(helper, helper_source, {module: mod})
    lines = [
        "import unittest",
        "",
        f"import {helper} as helper",
        f"import {module} as mod",
        "",
        "",
        f"class Test{module.title().replace('_', '')}(unittest.TestCase):",
    ]
    for i, expr in enumerate(calls):
        name = re.sub(r"\W+", "_", expr.split("(")[0].split(".")[-1]).strip("_")
        lines.append(f"    def test_{name}_{i}(self):")
        try:
            value = eval(expr, {"mod": mod, "helper": helper_mod})  # noqa: S307 - our own text
        except Exception as exc:  # the code under test raises: the test expects it
            lines.append(f"        with self.assertRaises({type(exc).__name__}):")
            lines.append(f"            {expr}")
        else:
            if isinstance(value, float):
                lines.append(f"        self.assertAlmostEqual({expr}, {value!r})")
            else:
                lines.append(f"        self.assertEqual({expr}, {value!r})")
        lines.append("")
    if extra:
        lines.append("    def test_requested_change(self):")
        lines += [f"        {line}" for line in extra]
        lines.append("")
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
    tests = write_tests(p.module, p.helper, source, helper_source, calls or p.calls, extra)
    return {f"{p.module}.py": source, f"{p.helper}.py": helper_source, f"test_{p.module}.py": tests}
