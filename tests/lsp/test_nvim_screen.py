"""What a Neovim user sees: no "Press ENTER" prompt during a task, a status that is never wrong.

The first test runs the real terminal UI inside tmux (headless Neovim has no screen) and captures
the screen once the task has finished; the second starts the server on an empty cache (the base
converted first, tests/lsp/first_start_server.py) and records every statusline value. The
scripts are in tests/lsp/nvim/ and wait on events; tmux's `wait-for` channels connect them to
the test.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import uuid

import pytest

from tests.harness.replay import call
from tests.lsp import first_start_server
from tests.lsp.conftest import replay_command
from tests.lsp.test_nvim import NVIM, SCRIPTS, nvim_env, run_nvim, workspace

pytestmark = pytest.mark.skipif(NVIM is None, reason="needs Neovim 0.12 (see test_nvim.py)")

CODE = "def add(a, b):\n    return a + b\n"
TURNS = [
    "I will read the file first.\nIt is short.\nThen I can say what it does.\n"
    + call("read_file", path="calc.py"),
    "The file defines add(a, b).\nIt returns the sum of its two arguments.\n"
    "Nothing else is in it.\nThat is all.",
]


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (apt-get install tmux)")
def test_agent_steps_and_answer_never_ask_to_press_enter(tmp_path):
    root = workspace(tmp_path, "calc.py", CODE)
    socket, tag = str(tmp_path / "tmux.sock"), uuid.uuid4().hex[:8]
    ready, done, captured = f"ready-{tag}", f"done-{tag}", tmp_path / "captured"
    cmd = replay_command("--model", "replay", "--db", str(tmp_path / "t.db"))
    extra = {"turns": TURNS, "socket": socket, "ready": ready, "captured": str(captured)}
    env = nvim_env(tmp_path, root, "calc.py", cmd, **extra)
    nvim = f"{shlex.quote(NVIM)} --clean -S {shlex.quote(str(SCRIPTS / 'no_prompt.lua'))}"
    shell = f"cd {shlex.quote(str(root))} && {nvim}; tmux -S {socket} wait-for -S {done}"
    tmux = ["tmux", "-S", socket]
    env_flags = [f"-e{k}={env[k]}" for k in env if k.startswith(("FLYWHEEL_", "XDG_", "PYTHON"))]
    subprocess.run(
        [*tmux, "new-session", "-d", "-x", "110", "-y", "30", *env_flags, shell],
        env=env,
        check=True,
        timeout=60,
    )
    try:
        try:
            subprocess.run([*tmux, "wait-for", ready], check=True, timeout=120)  # a hang guard
        finally:
            screen = subprocess.run(
                [*tmux, "capture-pane", "-p"], capture_output=True, text=True, check=True
            ).stdout
            print(screen)  # shown when it failed: a prompt blocks the script
        (tmp_path / "screen.txt").write_text(screen)
        captured.touch()
        subprocess.run([*tmux, "wait-for", done], check=True, timeout=120)
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["ok"], results.get("error")
    lines = screen.rstrip("\n").split("\n")
    assert "Press ENTER" not in screen and "-- More --" not in screen, screen
    assert results["mode"] == "n"  # not "r": the hit-enter prompt
    assert lines[-1].startswith("Flywheel: done: The file defines add(a, b). | It returns"), screen
    assert any(line.startswith("Flywheel idle (replay-1)") for line in lines), screen
    assert results["before_first_status"] == "Flywheel starting"
    assert "Flywheel stopped" not in results["statuslines"]
    assert results["statuslines"][-1] == "Flywheel idle (replay-1)"
    assert "That is all." in results["steps_text"]  # the whole answer, in the steps buffer


def test_first_start_shows_the_preparation_in_the_statusline(
    tmp_path, tiny_checkpoint, monkeypatch
):
    root = workspace(tmp_path, "main.py", "x = 1\n")
    cmd = [*replay_command()[:2], *first_start_server.arguments(tiny_checkpoint, tmp_path / "t.db")]
    cache = tmp_path / "cache"
    monkeypatch.setenv("FLYWHEEL_CACHE", str(cache))  # empty: the server converts its base
    results = run_nvim(tmp_path, "first_start.lua", root, "main.py", cmd)
    seen = results["statuslines"]
    assert results["before_first_status"] == "Flywheel starting"
    preparing = [s for s in seen if s.startswith("Flywheel preparing the model ")]
    percentages = [int(s.split()[4].rstrip("%")) for s in preparing]
    assert len(set(percentages)) >= 2 and percentages == sorted(percentages)
    assert seen.index(preparing[-1]) < len(seen) - 1 and "Flywheel stopped" not in seen
    assert results["final"].startswith("Flywheel idle (")
    assert any("%" in s for s in results["lsp_status"])  # Neovim's own progress status
    # a progress message that updates in place shows it too, with no statusline set up
    shown = [e for e in results["echoes"] if e["kind"] == "progress"]
    running = [e["percent"] for e in shown if e["status"] == "running"]
    assert len(set(running)) >= 2 and running == sorted(running), shown
    assert shown[-1]["status"] == "success" and "\n" not in "".join(e["text"] for e in shown)
    assert (cache / "base" / "tiny-first-base" / "flywheel.json").is_file()


def test_accept_word_takes_a_word_not_one_character():
    """`<M-l>` takes the ghost text's next word as VS Code's Accept Word should: blanks,
    punctuation and the word after it, never a lone "(" (suggestions.lua `next_word`)."""
    cases = ["(a, b)", "foo.bar()", "\n    return x", " = value", "):", "   "]
    lua = (
        f"vim.opt.rtp:prepend({json.dumps(str(SCRIPTS.parents[2] / 'lsp/clients/nvim'))})\n"
        "local S = require('flywheel.suggestions')\n"
        f"local out = vim.tbl_map(S.next_word, vim.json.decode({json.dumps(json.dumps(cases))}))\n"
        "io.write(vim.json.encode(out))\n"
    )
    run = subprocess.run(
        [NVIM, "--headless", "--clean", "-l", "-"], input=lua, capture_output=True, text=True
    )
    assert json.loads(run.stdout) == ["(a", "foo", "\n    return", " =", "):", "   "], run.stderr


@pytest.mark.base
def test_the_real_default_shows_ghost_text_in_neovim(tmp_path):
    """The shipped default (an adapter on the real base) through Neovim and the real server, as
    benchmarks/nvim_ghost_latency.py measures it: every trial gets ghost text."""
    from agent.model import base_needed

    if base_needed("default") is None:
        pytest.skip("the default adapter is not trained on this install's base yet (make starter)")
    out = tmp_path / "ghost.json"
    bench = SCRIPTS.parents[2] / "benchmarks" / "nvim_ghost_latency.py"
    run = subprocess.run(
        [sys.executable, str(bench), "--model", "default", "--trials", "2", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(out.read_text())
    trials = report["trials"]
    assert all(t["typed_line"] == "    return w" for t in trials), trials  # the key was typed
    assert all(t["answered"] for t in trials), trials  # a trial without ghost text was declined
    # a real model may rightly decline a place; it must show ghost text somewhere, and only
    # text the server answered for the line as typed (never a late answer for the line before)
    assert any(t["ms"] is not None and t["ghost"] for t in trials), trials
    answers = {a["output"] for a in report["server_answers"] if a["prefix_tail"].endswith("w")}
    assert all(t["ghost"] in answers for t in trials if t["ghost"]), (trials, answers)
    assert len(report["server_latency_all_ms"]) >= 2


def test_ghost_text_has_a_terminal_colour_without_termguicolors():
    """Neovim's ghost-text group has only a GUI colour; in a 256-colour terminal (tmux without
    RGB) the plugin gives it a grey one, or the suggestion reads like typed code."""
    lua = (
        "vim.o.termguicolors = false\n"
        f"vim.opt.rtp:prepend({json.dumps(str(SCRIPTS.parents[2] / 'lsp/clients/nvim'))})\n"
        "require('flywheel').init()\n"
        "local hl = vim.api.nvim_get_hl(0, { name = 'ComplHint', link = false })\n"
        "vim.cmd.colorscheme('default')\n"  # a colour scheme resets it; the plugin sets it again
        "local again = vim.api.nvim_get_hl(0, { name = 'ComplHint', link = false })\n"
        "io.write(vim.json.encode({ hl.ctermfg or false, again.ctermfg or false, hl.fg or false }))\n"
    )
    run = subprocess.run(
        [NVIM, "--headless", "--clean", "-l", "-"], input=lua, capture_output=True, text=True
    )
    cterm, after_scheme, gui = json.loads(run.stdout)
    assert cterm == 8 and after_scheme == 8, run.stderr
    assert gui, "its GUI colour is kept"
