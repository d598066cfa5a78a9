"""The `flywheel` command: fast help, and every subcommand documented and helpful."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from agent import cli_docs
from agent.cli import COMMANDS, GROUPS

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "cli.md"


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
def test_every_grouped_command_has_help(group, sub):
    out = subprocess.run(
        [sys.executable, "-m", "agent.cli", group, sub, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert f"usage: flywheel {group} {sub}" in out.stdout


@pytest.fixture(scope="module")
def parsers() -> dict[str, argparse.ArgumentParser]:
    return dict(cli_docs.parsers())


@pytest.fixture(scope="module")
def blocks(parsers) -> dict[str, str]:
    return {name: cli_docs.render(name, parser) for name, parser in parsers.items()}


def test_the_command_reference_covers_every_command_and_matches_its_parser(blocks):
    expected = {f"flywheel {n}" for n in COMMANDS if n not in GROUPS}
    expected |= {f"flywheel {g} {s}" for g, subs in GROUPS.items() for s in subs}
    assert expected <= set(blocks)
    problems = cli_docs.problems(DOCS.read_text(), blocks)
    assert not problems, "docs/cli.md: " + "; ".join(problems) + " (python -m agent.cli_docs)"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_a_written_section(name):
    assert f"## flywheel {name}\n" in DOCS.read_text(), f"docs/cli.md needs '## flywheel {name}'"


def test_the_reference_check_fails_for_a_missing_or_stale_command(blocks):
    text = DOCS.read_text()
    name = "flywheel train eval"
    missing = cli_docs._pattern(name).sub("", text)
    assert cli_docs.problems(missing, blocks) == [f"{name}: no generated block"]
    assert f"## {name}" in cli_docs.update(missing, blocks)  # regenerating adds a section
    stale = {**blocks, name: blocks[name].replace("--free-tool-calls", "--free-calls")}
    assert cli_docs.problems(text, stale) == [f"{name}: the block differs from its parser"]


def _examples(text: str) -> list[str]:
    """The `flywheel ...` command lines of a Markdown file's code blocks (fenced, or indented by
    four spaces), with their continuation lines joined; generated synopses are not examples."""
    text = re.sub(r"<!-- (flywheel [^:]+): generated.*?<!-- end \1 -->", "", text, flags=re.S)
    found, fenced, lines = [], False, text.replace("\\\n", " ").splitlines()
    for line in lines:
        if line.startswith("```"):
            fenced = not fenced
        elif (fenced or line.startswith("    ")) and line.strip().startswith("flywheel "):
            found.append(line.strip())
    return found


@pytest.mark.parametrize("doc", ["README.md", "docs/cli.md"])
def test_every_example_command_parses(doc, parsers):
    """Each example a reader may copy names a real command with flags it accepts."""
    examples = _examples((ROOT / doc).read_text())
    assert examples
    for example in examples:
        words = shlex.split(example, comments=True)
        command = " ".join(words[:3]) if words[1] in GROUPS else " ".join(words[:2])
        assert command in parsers, example
        try:
            parsers[command].parse_args(words[len(command.split()) :])
        except SystemExit:
            pytest.fail(f"{doc}: {example!r} does not parse")


def test_unknown_command_fails_clearly():
    out = subprocess.run(
        [sys.executable, "-m", "agent.cli", "nope"], capture_output=True, text=True
    )
    assert out.returncode == 2
    assert "unknown command 'nope'" in out.stderr
