"""What an agent command can read: only the system's programs, the interpreters the
project needs, the folders the user lists, and the workspace. Canaries sit outside /tmp, where
the old sandbox (the whole disk read-only, only /tmp emptied) showed them."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from agent.harness import ApprovalPolicy, Sandbox, SandboxConfig, Workspace
from agent.harness.project import detect_test_command

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")


@pytest.fixture
def outside_tmp():
    """A folder outside /tmp (the old sandbox hid only /tmp), removed afterwards."""
    try:
        folder = Path(tempfile.mkdtemp(prefix="flywheel-test-", dir="/var/tmp"))
    except OSError as exc:
        pytest.skip(f"cannot make a folder under /var/tmp: {exc}")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def home_canary():
    """A file in the user's real home, removed afterwards."""
    path = Path.home() / f".flywheel-canary-{uuid.uuid4().hex[:8]}"
    try:
        path.write_text("HOME-CANARY\n")
    except OSError as exc:
        pytest.skip(f"cannot write a canary in the home folder: {exc}")
    yield path
    path.unlink(missing_ok=True)


@needs_bwrap
def test_a_command_cannot_read_canaries_outside_the_workspace(
    outside_tmp, home_canary, monkeypatch
):
    ws = outside_tmp / "project" / "ws"
    ws.mkdir(parents=True)
    (ws / "mine.txt").write_text("WORKSPACE-FILE\n")
    sibling = outside_tmp / "project" / "sibling-secret.txt"
    sibling.write_text("SIBLING-CANARY\n")
    other = outside_tmp / "other-project"
    other.mkdir()
    (other / "key.pem").write_text("OTHER-CANARY\n")
    monkeypatch.setenv("GITHUB_TOKEN", "ENV-CANARY")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "ENV-CANARY")
    sb = Sandbox(ws, SandboxConfig(timeout_s=60))
    res = sb.run(f"cat mine.txt {home_canary} ../sibling-secret.txt {other}/key.pem; env")
    assert "WORKSPACE-FILE" in res.output, res.output
    for canary in ("HOME-CANARY", "SIBLING-CANARY", "OTHER-CANARY", "ENV-CANARY"):
        assert canary not in res.output, res.output
    assert res.output.count("No such file or directory") == 3
    listed = sb.run("ls -a ~ ..").output
    assert home_canary.name not in listed and "sibling-secret" not in listed, listed
    etc = sb.run("ls /etc").output.split()
    assert "passwd" in etc and "ssl" in etc and not {"shadow", "gshadow", "sudoers"} & set(etc)
    users = {line.split(":")[0] for line in sb.run("cat /etc/passwd").output.splitlines()}
    assert users <= {"root", "nobody", pwd.getpwuid(os.getuid()).pw_name}, users


@needs_bwrap
def test_the_workspace_tests_run_with_the_project_interpreters(outside_tmp):
    ws = outside_tmp / "ws"
    ws.mkdir()
    (ws / "test_ok.py").write_text("def test_ok():\n    assert 6 * 7 == 42\n")
    command = detect_test_command(Workspace(ws)).command
    res = Sandbox(ws, SandboxConfig(timeout_s=120)).run(command)
    assert res.exit_code == 0 and "1 passed" in res.output, res.output
    # `python` resolves even when the user's PATH finds it in the hidden home (pyenv shims).
    res = Sandbox(ws, SandboxConfig(timeout_s=60)).run("python -c 'print(6 * 7)'")
    assert res.exit_code == 0 and res.output == "42\n", res.output
    # A virtual environment inside the workspace, made from this interpreter's base installation
    # (which may live in the user's home, e.g. under pyenv).
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(ws / ".venv")], check=True)
    res = Sandbox(ws, SandboxConfig(timeout_s=60)).run(
        ".venv/bin/python -c 'import sys, json; print(sys.prefix, json.dumps([42]))'"
    )
    assert res.exit_code == 0 and f"{ws}/.venv [42]" in res.output, res.output


@needs_bwrap
def test_listed_folders_are_readable_and_never_writable(outside_tmp):
    ws = outside_tmp / "ws"
    ws.mkdir()
    toolchain = outside_tmp / "toolchain"
    toolchain.mkdir()
    (toolchain / "VERSION").write_text("TOOLCHAIN-1\n")
    command = f"cat {toolchain}/VERSION; echo x > {toolchain}/pwned"
    res = Sandbox(ws, SandboxConfig(timeout_s=60)).run(command)
    assert "TOOLCHAIN-1" not in res.output
    config = SandboxConfig(timeout_s=60, read_only_paths=(str(toolchain),))
    res = Sandbox(ws, config).run(command)
    assert "TOOLCHAIN-1" in res.output and "Read-only file system" in res.output, res.output
    assert not (toolchain / "pwned").exists()


def test_read_only_paths_must_be_absolute():
    with pytest.raises(ValueError, match="absolute"):
        SandboxConfig(read_only_paths=("relative/dir",))
    with pytest.raises(ValueError, match="whole disk"):
        SandboxConfig(read_only_paths=("/",))
    assert SandboxConfig(read_only_paths=("~/x/../y",)).read_only_paths == (str(Path.home() / "y"),)


def test_without_bubblewrap_commands_are_refused_unless_allowed(tmp_path):
    sb = Sandbox(tmp_path, SandboxConfig(use_bwrap=False))
    res = sb.run("touch ran")
    assert not (tmp_path / "ran").exists()
    assert res.exit_code is None and not res.confined
    assert res.summary().startswith("not run\nrefused: bubblewrap (bwrap) is not installed")
    assert "apt-get install bubblewrap" in res.output and "--allow-unconfined" in res.output
    assert "\n" not in res.output
    # Nothing can run unconfined, so there is nothing to approve.
    assert sb.confined and ApprovalPolicy().reason("run_command", {"command": "ls"}, True) is None
    allowed = Sandbox(tmp_path, SandboxConfig(use_bwrap=False, allow_unconfined=True))
    assert not allowed.confined and allowed.run("touch ran").exit_code == 0
    assert (tmp_path / "ran").exists()


def test_the_editor_settings_reach_the_sandbox_config():
    from lsp.settings import parse_settings

    settings, warnings = parse_settings(
        {"agent": {"readOnlyPaths": ["/opt/go", "~/.cargo"], "allowUnconfined": True}}
    )
    assert warnings == []
    assert settings.agent.read_only_paths == ["/opt/go", "~/.cargo"]
    assert settings.agent.allow_unconfined is True
    settings, warnings = parse_settings({"agent": {"readOnlyPaths": ["relative"]}})
    assert settings.agent.read_only_paths == [] and "absolute" in " ".join(warnings)
