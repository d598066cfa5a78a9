"""What a real project tells the harness about itself: how its tests run, and its rules.

Test command (`detect_test_command`), first match wins:
1. a line of the project's rules that names one in backticks ("Run the tests with `make check`");
2. JS/TS: a `test` script in package.json (`pnpm test` with a pnpm lockfile, else `npm test`);
   Go: `go test ./...`; Rust: `cargo test`;
3. Python test files (`test_*.py`, `*_test.py`) or pytest configuration: pytest when the project's
   interpreter has it, otherwise `unittest` discovery from the folder that holds the tests. The
   interpreter is the project's own virtualenv (`.venv`, `venv`) when it has one;
4. a Makefile `test` (or `check`) target; then tox.ini (`tox`) and noxfile.py (`nox`).
A setting (`ToolsConfig.test_command`) overrides all of this. The result says where the command
came from, so the tool result (and the trace) shows what was detected.

Rules (`project_rules`): AGENTS.md and the other common names (CLAUDE.md, CONVENTIONS.md,
.cursorrules, .cursor/rules/*, .github/copilot-instructions.md) of one folder, joined and cut to a
token budget with a note when cut. The harness puts the root's rules in the task's context and a
subfolder's rules in the first result of a tool that touches a file there (tools.py).

What it does not do: install anything (a project whose tests need packages it lacks fails, and
the output says why), or decide which rules to obey (the model reads them).
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from agent.harness.workspace import Workspace, WorkspaceError

# How a detected pytest project runs, after its interpreter (synthetic tasks use the same).
# The -W filter hides pytest's and its plugins' own deprecation notices (pytest-asyncio's unset
# loop scope, in an environment that has it): lines about the test runner, not the project.
PYTEST_ARGS = (
    "-m pytest -q -p no:cacheprovider --tb=short -W ignore::pytest.PytestDeprecationWarning"
)
RULE_FILES = (
    "AGENTS.md",
    "CLAUDE.md",
    "CONVENTIONS.md",
    ".cursorrules",
    ".github/copilot-instructions.md",
)
RULE_DIRS = (".cursor/rules",)  # every .md / .mdc file inside
RULES_TOKENS = 1024  # budget of one folder's rules in the context
CHARS_PER_TOKEN = 3  # the same estimate as the repository map
MAX_TEST_SCAN = 2000  # files looked at when searching for Python tests
NOT_PROJECT_DIRS = frozenset({"venv", "env", "site-packages", "build", "dist"})  # never test dirs

# "run the tests with `make check`", "Test command: `pytest -x`", "to test: `npm run t`"
_RULE_TEST_LINE = re.compile(r"\btest(?:s|ing)?\b[^`\n]*`([^`\n]+)`", re.IGNORECASE)


@dataclass(frozen=True)
class TestCommand:
    command: str
    source: str  # where it came from, shown to the model: "AGENTS.md", "package.json", ...

    __test__ = False  # not a pytest test class


@dataclass(frozen=True)
class Rules:
    text: str  # the rules, joined, within the budget
    files: tuple[str, ...]  # workspace-relative paths they came from
    truncated: bool

    def render(self) -> str:
        head = f"Project rules ({', '.join(self.files)})"
        if self.truncated:
            head += f", cut to about {RULES_TOKENS} tokens; read the files for the rest"
        return f"{head}:\n{self.text}"


def rule_files(ws: Workspace, folder: str = ".") -> list[str]:
    """Workspace-relative paths of the rule files in `folder` (not its subfolders)."""
    base = "" if folder in ("", ".") else folder.rstrip("/") + "/"
    found = [base + name for name in RULE_FILES if ws.is_file(base + name)]
    for sub in RULE_DIRS:
        try:
            directory = ws.resolve(base + sub)
        except WorkspaceError:
            continue
        if directory.is_dir():
            found += sorted(
                base + sub + "/" + p.name
                for p in directory.iterdir()
                if p.suffix in (".md", ".mdc") and p.is_file()
            )
    return found


def project_rules(
    ws: Workspace, folder: str = ".", budget_tokens: int = RULES_TOKENS
) -> Rules | None:
    """The rules of `folder`, or None when it has none (or none that can be read)."""
    texts, files = [], []
    for rel in rule_files(ws, folder):
        try:
            text = ws.display(ws.read_text(rel)).strip()
        except WorkspaceError:
            continue
        if text:
            texts.append(text if len(files) == 0 else f"({rel})\n{text}")
            files.append(rel)
    if not texts:
        return None
    joined = "\n\n".join(texts)
    budget = budget_tokens * CHARS_PER_TOKEN
    truncated = len(joined) > budget
    if truncated:
        joined = joined[:budget].rsplit("\n", 1)[0] + "\n[...]"
    return Rules(joined, tuple(files), truncated)


def rules_test_command(ws: Workspace) -> TestCommand | None:
    """A test command named in the root's rules (the first line about tests with `code`)."""
    for rel in rule_files(ws):
        try:
            text = ws.read_text(rel)
        except WorkspaceError:
            continue
        match = _RULE_TEST_LINE.search(text)
        if match and match.group(1).strip():
            return TestCommand(match.group(1).strip(), rel)
    return None


def project_python(root: Path) -> tuple[str, Path | None]:
    """The interpreter to test with: the project's virtualenv's, else this process's."""
    for name in (".venv", "venv"):
        python = root / name / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
        if python.is_file() and os.access(python, os.X_OK):
            return f"{name}/{python.relative_to(root / name).as_posix()}", root / name
    return shlex.quote(sys.executable), None


def _has_pytest(venv: Path | None) -> bool:
    if venv is None:
        import importlib.util

        return importlib.util.find_spec("pytest") is not None
    return any(venv.glob("lib/python*/site-packages/pytest")) or any(
        venv.glob("Lib/site-packages/pytest")
    )


def _pytest_configured(root: Path) -> bool:
    if (root / "pytest.ini").is_file() or (root / "conftest.py").is_file():
        return True
    try:
        if "[tool.pytest" in (root / "pyproject.toml").read_text(errors="replace"):
            return True
    except OSError:
        pass
    for name, section in (("setup.cfg", "tool:pytest"), ("tox.ini", "pytest")):
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read(root / name, encoding="utf-8")
        except (configparser.Error, UnicodeDecodeError):
            continue
        if parser.has_section(section):
            return True
    return False


def python_test_dirs(ws: Workspace) -> list[str]:
    """Folders (workspace-relative, "." for the root) holding Python test files, shallowest first."""
    dirs: set[str] = set()
    for i, rel in enumerate(ws.files()):
        if i >= MAX_TEST_SCAN:
            break
        *parents, name = rel.split("/")
        if NOT_PROJECT_DIRS.intersection(parents):
            continue
        if name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py")):
            dirs.add(rel.rsplit("/", 1)[0] if "/" in rel else ".")
    return sorted(dirs, key=lambda d: (d.count("/") + (d != "."), d))


def _python_command(ws: Workspace) -> TestCommand | None:
    root = ws.root
    test_dirs = python_test_dirs(ws)
    if not test_dirs and not _pytest_configured(root):
        return None
    python, venv = project_python(root)
    where = f"{venv.name}/" if venv else "this interpreter"
    if _has_pytest(venv):
        return TestCommand(
            f"{python} {PYTEST_ARGS}",
            f"Python tests, pytest in {where}",
        )
    if not test_dirs:
        return None
    top = test_dirs[0]
    names = [r.rsplit("/", 1)[-1] for r in ws.files(top) if r.endswith(".py")]
    pattern = "test*.py" if any(n.startswith("test") for n in names) else "*_test.py"
    command = f"{python} -m unittest discover -p {shlex.quote(pattern)}"
    if top != ".":
        command += f" -s {shlex.quote(top)}"
    return TestCommand(command, f"Python tests in {top}, unittest (no pytest in {where})")


def _make_target(root: Path) -> str | None:
    for name in ("Makefile", "makefile", "GNUmakefile"):
        try:
            text = (root / name).read_text(errors="replace")
        except OSError:
            continue
        for target in ("test", "check"):
            if re.search(rf"^{target}\s*:(?!=)", text, re.M):
                return target
    return None


def detect_test_command(ws: Workspace) -> TestCommand | None:
    """The project's own test command and where it came from (see the module docstring)."""
    root = ws.root
    found = rules_test_command(ws)
    if found:
        return found
    if (root / "package.json").is_file():
        try:
            scripts = json.loads((root / "package.json").read_text()).get("scripts", {})
        except (ValueError, OSError, AttributeError):
            scripts = {}
        if isinstance(scripts, dict) and "test" in scripts:
            runner = "pnpm" if (root / "pnpm-lock.yaml").is_file() else "npm"
            return TestCommand(f"{runner} test --silent", "package.json")
    if (root / "go.mod").is_file():
        return TestCommand("go test ./...", "go.mod")
    if (root / "Cargo.toml").is_file():
        return TestCommand("cargo test --quiet", "Cargo.toml")
    python = _python_command(ws)
    if python:
        return python
    target = _make_target(root)
    if target:
        return TestCommand(f"make {target}", f"the Makefile's `{target}` target")
    if (root / "tox.ini").is_file():
        return TestCommand("tox -q", "tox.ini")
    if (root / "noxfile.py").is_file():
        return TestCommand("nox", "noxfile.py")
    return None
