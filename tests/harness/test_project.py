"""Real projects: `run_tests` finds and runs each shape's own test command, and the harness reads
the project's rules (AGENTS.md and friends) into the context and the tool results."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent import run
from agent.harness import Sandbox, Workspace
from agent.harness.project import RULES_TOKENS, detect_test_command, project_rules
from agent.harness.sandbox import SandboxConfig
from agent.harness.tools import ToolContext, ToolsConfig, run_tool
from tests.harness.replay import ReplayEngine, call

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")

STATS = "def average(xs):\n    return sum(xs) / len(xs)\n"
UNITTEST = (
    "import unittest\nfrom stats import average\n\n\n"
    "class TestStats(unittest.TestCase):\n"
    "    def test_average(self):\n        self.assertEqual(average([1, 2, 3]), 2)\n"
)


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def _bare_venv(root: Path) -> None:
    """A project virtualenv without pytest (so discovery must fall back to unittest)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / ".venv")], check=True)


def _run_tests(root: Path, **config) -> tuple[str, bool]:
    ctx = ToolContext(
        Workspace(root), Sandbox(root, SandboxConfig(timeout_s=120)), ToolsConfig(**config)
    )
    return run_tool(ctx, "run_tests", {})


def _shapes() -> list:
    cases = [
        (
            "unittest-root",
            {"stats.py": STATS, "test_stats.py": UNITTEST},
            True,
            "-m unittest discover -p 'test*.py'",
        ),
        (
            "unittest-tests-dir",
            {"stats.py": STATS, "tests/test_stats.py": UNITTEST},
            True,
            "-m unittest discover -p 'test*.py' -s tests",
        ),
        ("unittest-suffix", {"stats.py": STATS, "stats_test.py": UNITTEST}, True, "-p '*_test.py'"),
        (
            "pytest-config",
            {
                "pyproject.toml": "[tool.pytest.ini_options]\naddopts = '-q'\n",
                "stats.py": STATS,
                "tests/test_stats.py": "from stats import average\n\n\n"
                "def test_average():\n    assert average([2, 4]) == 3\n",
            },
            False,
            "-m pytest",
        ),
        ("makefile", {"Makefile": "check:\n\t@echo all good\n"}, False, "make check"),
    ]
    return [pytest.param(*c, id=c[0]) for c in cases]


@needs_bwrap
@pytest.mark.parametrize("name,files,bare_venv,expected", _shapes())
def test_run_tests_runs_each_project_shapes_own_command(tmp_path, name, files, bare_venv, expected):
    root = _write(tmp_path / name, files)
    if bare_venv:
        _bare_venv(root)
    found = detect_test_command(Workspace(root))
    assert found is not None and expected in found.command, found
    text, is_error = _run_tests(root)
    assert not is_error, text
    assert text.startswith("tests passed") and expected in text.splitlines()[0]
    assert f"test command from {found.source}" in text
    if bare_venv:  # the project's own interpreter, not this one
        assert (
            found.command.startswith(".venv/bin/python") and "no pytest in .venv/" in found.source
        )


@needs_bwrap
def test_a_failing_unittest_project_fails_with_its_output(tmp_path):
    root = _write(
        tmp_path, {"stats.py": STATS.replace("len(xs)", "(len(xs) + 1)"), "test_stats.py": UNITTEST}
    )
    _bare_venv(root)
    text, is_error = _run_tests(root)
    assert is_error and text.startswith("tests FAILED") and "AssertionError" in text, text


@needs_bwrap
def test_a_failing_pytest_run_shows_the_failure_not_the_runners_plugins_deprecations(tmp_path):
    """Flywheel's own environment has pytest-asyncio, whose unset-loop-scope warning used to open
    every pytest result of a project tested in this interpreter (the demo's)."""
    pytest.importorskip("pytest_asyncio")
    test = "from stats import average\n\n\ndef test_average():\n    assert average([2, 4]) == 3\n"
    root = _write(
        tmp_path,
        {
            "pyproject.toml": "[tool.pytest.ini_options]\n",
            "stats.py": STATS.replace("len(xs)", "(len(xs) + 1)"),
            "tests/test_stats.py": test,
        },
    )
    text, is_error = _run_tests(root)
    assert is_error and "pytest in this interpreter" in text and "assert 2.0 == 3" in text, text
    assert "asyncio_default_fixture_loop_scope" not in text


@pytest.mark.parametrize(
    "files,command",
    [
        ({"package.json": json.dumps({"scripts": {"test": "node t.js"}})}, "npm test --silent"),
        (
            {"package.json": json.dumps({"scripts": {"test": "x"}}), "pnpm-lock.yaml": ""},
            "pnpm test --silent",
        ),
        ({"package.json": json.dumps({"scripts": {}}), "Makefile": "test:\n\ttrue\n"}, "make test"),
        ({"go.mod": "module x\n"}, "go test ./..."),
        ({"Cargo.toml": "[package]\nname = 'x'\n"}, "cargo test --quiet"),
        ({"tox.ini": "[tox]\nenvlist = py\n"}, "tox -q"),
        ({"noxfile.py": "import nox\n"}, "nox"),
        ({"README.md": "no tests here\n"}, None),
    ],
    ids=["npm", "pnpm", "makefile-test", "go", "cargo", "tox", "nox", "none"],
)
def test_detection_by_project_files(tmp_path, files, command):
    found = detect_test_command(Workspace(_write(tmp_path, files)))
    assert (found.command if found else None) == command


@pytest.mark.parametrize(
    "tool,files",
    [
        (
            "npm",
            {
                "package.json": json.dumps({"scripts": {"test": "node t.js"}}),
                "t.js": "console.log('node ok')\n",
            },
        ),
        (
            "go",
            {
                "go.mod": "module example.com/x\n\ngo 1.20\n",
                "x_test.go": 'package x\nimport "testing"\nfunc TestX(t *testing.T) {}\n',
            },
        ),
        (
            "cargo",
            {
                "Cargo.toml": '[package]\nname = "x"\nversion = "0.1.0"\nedition = "2021"\n',
                "src/lib.rs": "#[test]\nfn t() {}\n",
            },
        ),
    ],
)
def test_toolchain_projects_run_where_the_toolchain_exists(tmp_path, tool, files):
    if shutil.which(tool) is None or shutil.which("bwrap") is None:
        pytest.skip(f"{tool} or bubblewrap not installed")
    text, is_error = _run_tests(_write(tmp_path, files))
    assert not is_error and text.startswith("tests passed"), text


def test_a_setting_overrides_detection(tmp_path):
    root = _write(tmp_path, {"test_x.py": "", "AGENTS.md": "Run the tests with `make check`.\n"})
    assert detect_test_command(Workspace(root)).command == "make check"
    assert detect_test_command(Workspace(root)).source == "AGENTS.md"
    text, _ = _run_tests(root, test_command="true")
    assert text.startswith("tests passed (`true`") and "test command from" not in text


@needs_bwrap
def test_tests_that_need_the_network_say_why_they_fail(tmp_path):
    test = (
        "import socket\n\n\ndef test_fetch():\n"
        "    socket.create_connection(('pypi.org', 443), timeout=5)\n"
    )
    text, is_error = _run_tests(_write(tmp_path, {"test_net.py": test}))
    assert is_error and "without network access" in text, text


def test_rules_are_read_and_cut_to_their_budget(tmp_path):
    root = _write(
        tmp_path, {"AGENTS.md": "Use tabs.\n", ".cursor/rules/style.mdc": "No globals.\n"}
    )
    rules = project_rules(Workspace(root))
    assert rules.files == ("AGENTS.md", ".cursor/rules/style.mdc") and not rules.truncated
    assert "Use tabs." in rules.render() and "No globals." in rules.render()
    (root / "AGENTS.md").write_text("a rule that goes on\n" * 5000)
    rules = project_rules(Workspace(root))
    assert rules.truncated and len(rules.text) <= RULES_TOKENS * 3 + 10
    assert "cut to about" in rules.render() and "read the files for the rest" in rules.render()
    assert project_rules(Workspace(_write(tmp_path / "none", {"a.py": ""}))) is None


def test_a_subfolders_rules_come_with_the_first_file_touched_there(tmp_path):
    root = _write(
        tmp_path,
        {
            "pkg/AGENTS.md": "Never touch generated.py.\n",
            "pkg/a.py": "x = 1\n",
            "pkg/b.py": "y = 2\n",
            "top.py": "",
        },
    )
    ctx = ToolContext(Workspace(root), Sandbox(root))
    assert "Never touch" not in run_tool(ctx, "read_file", {"path": "top.py"})[0]
    first, _ = run_tool(ctx, "read_file", {"path": "pkg/a.py"})
    assert "x = 1" in first and "Project rules (pkg/AGENTS.md):\nNever touch generated.py." in first
    assert "Never touch" not in run_tool(ctx, "read_file", {"path": "pkg/b.py"})[0]


def test_agents_md_changes_what_flywheel_run_runs(tmp_path, capsys, monkeypatch):
    """Through `flywheel run` with a scripted model: the root's AGENTS.md is in the task's context,
    the trace says so, and its test command is the one `run_tests` runs."""
    root = _write(
        tmp_path,
        {
            "stats.py": STATS,
            "test_stats.py": UNITTEST,
            "AGENTS.md": "Run the tests with `echo custom-suite-ran`.\n",
        },
    )
    engine = ReplayEngine([call("run_tests"), "The tests pass."])
    monkeypatch.setattr("agent.engine.open_engine", lambda config: engine)
    code = run.main(
        ["check the tests", "--workspace", str(root), "--no-telemetry", "--approve", "yes"]
    )
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "project rules: AGENTS.md" in out
    user = engine.requests[0].messages[1]["content"]
    assert "Project rules (AGENTS.md):\nRun the tests with `echo custom-suite-ran`." in user
    result = engine.requests[1].messages[-1]["content"]
    assert "custom-suite-ran" in result and "test command from AGENTS.md" in result, result
