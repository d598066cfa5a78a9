"""The `flywheel` command: fast help, and every subcommand documented and helpful."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agent.cli import COMMANDS, GROUPS

ROOT = Path(__file__).resolve().parent.parent


def test_help_lists_every_command_without_heavy_imports():
    code = (
        "import sys, agent.cli; agent.cli.main(['--help']); "
        "heavy = [m for m in ('torch', 'transformers', 'langgraph') if m in sys.modules]; "
        "print('HEAVY', heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    for name in COMMANDS:
        assert re.search(rf"^\s+{name}\s", out.stdout, re.M), name
    assert "HEAVY []" in out.stdout


def test_a_reader_that_goes_away_stops_the_command_without_a_traceback(tmp_path):
    read, write = os.pipe()
    os.close(read)  # like `flywheel models | head -1` once head has its line
    with os.fdopen(write, "w") as closed:
        out = subprocess.run(
            [sys.executable, "-m", "agent.cli", "models", "--registry", str(tmp_path)],
            stdout=closed,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    assert out.returncode == 141
    assert out.stderr == ""


def test_ctrl_c_stops_a_command_with_one_line(tmp_path):
    code = (
        "import agent.cli, agent.models_cli, sys\n"
        "def interrupted(argv): raise KeyboardInterrupt\n"
        "agent.models_cli.main = interrupted\n"
        "sys.exit(agent.cli.main(['models', 'list']))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 130
    assert out.stderr == "flywheel models: interrupted\n"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_help(name):
    out = subprocess.run(
        [sys.executable, "-m", "agent.cli", name, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "usage:" in out.stdout


@pytest.mark.parametrize("group, sub", [(g, s) for g, subs in GROUPS.items() for s in subs])
def test_every_grouped_command_has_help_and_docs(group, sub):
    out = subprocess.run(
        [sys.executable, "-m", "agent.cli", group, sub, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert f"usage: flywheel {group} {sub}" in out.stdout
    assert f"flywheel {group} {sub}" in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_is_documented_in_readme(name):
    readme = (ROOT / "README.md").read_text()
    assert f"### flywheel {name}" in readme, f"README.md needs a '### flywheel {name}' section"


def test_unknown_command_fails_clearly():
    out = subprocess.run(
        [sys.executable, "-m", "agent.cli", "nope"], capture_output=True, text=True
    )
    assert out.returncode == 2
    assert "unknown command 'nope'" in out.stderr
