"""Confinement: every file tool refuses paths outside the workspace, and commands run
in a sandbox that cannot write outside, reach the network, or outlive their limits."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

import pytest

from agent.harness import Sandbox, SandboxConfig, ToolContext, Workspace, run_tool
from agent.harness.sandbox import _pids_parents

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")

FILE_CALLS = [
    ("read_file", {"path": "{p}"}),
    ("list_files", {"path": "{p}"}),
    ("search", {"pattern": "secret", "path": "{p}"}),
    ("outline", {"path": "{p}"}),
    ("find_symbol", {"name": "secret", "path": "{p}"}),
    ("edit_file", {"path": "{p}", "hunks": [{"search": "secret", "replace": "pwned"}]}),
    ("write_file", {"path": "{p}", "content": "pwned"}),
    ("delete_file", {"path": "{p}"}),
]


@pytest.fixture
def layout(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "ok.py").write_text("x = 1\n")
    outside = tmp_path / "outside.py"
    outside.write_text("secret = 1\n")
    (ws / "link.py").symlink_to(outside)
    (ws / "linkdir").symlink_to(tmp_path)
    return ws, outside


def _fill(args, p):
    return {k: (v.replace("{p}", p) if isinstance(v, str) else v) for k, v in args.items()}


@pytest.mark.parametrize("tool,args", FILE_CALLS, ids=[c[0] for c in FILE_CALLS])
@pytest.mark.parametrize(
    "path", ["../outside.py", "{abs}", "link.py", "linkdir/outside.py", "sub/../../outside.py"]
)
def test_file_tools_refuse_paths_outside(layout, tool, args, path):
    ws, outside = layout
    path = path.replace("{abs}", str(outside))
    ctx = ToolContext(Workspace(ws), Sandbox(ws))
    out, is_error = run_tool(ctx, tool, _fill(args, path))
    assert is_error, out
    assert "outside the workspace" in out
    assert outside.read_text() == "secret = 1\n"  # nothing changed outside


def test_listing_skips_symlinks_leading_outside(layout):
    ws, _ = layout
    ctx = ToolContext(Workspace(ws), Sandbox(ws))
    out, _ = run_tool(ctx, "list_files", {})
    assert out.split() == ["ok.py"]
    out, _ = run_tool(ctx, "search", {"pattern": "secret"})
    assert out.startswith("no match")


def test_a_task_snapshot_holds_only_the_workspace_text_and_has_a_size_limit(layout):
    """What the harness logs as a task's starting state (for RL replay): no file reached through
    a link out of the workspace, no binary file, and nothing at all when the workspace is big."""
    ws, _ = layout
    (ws / "b.bin").write_bytes(b"\x00\x01" * 50)
    assert Workspace(ws).snapshot() == {"ok.py": "x = 1\n"}
    assert Workspace(ws).snapshot(max_chars=3) is None
    (ws / "two.py").write_text("y = 2\n")
    assert Workspace(ws).snapshot(max_files=1) is None


def test_binary_huge_and_invalid_utf8_files(tmp_path):
    (tmp_path / "b.bin").write_bytes(b"\x00\x01\x02" * 100)
    (tmp_path / "big.txt").write_bytes(b"line\n" * 700_000)  # 3.5 MB
    (tmp_path / "bad.txt").write_bytes(b"ok\n\xff\xfe broken\n")
    ctx = ToolContext(Workspace(tmp_path), Sandbox(tmp_path))
    out, is_error = run_tool(ctx, "read_file", {"path": "b.bin"})
    assert is_error and "binary" in out
    out, is_error = run_tool(
        ctx, "edit_file", {"path": "big.txt", "hunks": [{"search": "a", "replace": "b"}]}
    )
    assert is_error and "MB" in out and "line range" in out
    out, is_error = run_tool(ctx, "read_file", {"path": "big.txt", "start_line": 699_999})
    assert not is_error and "700000  line" in out
    out, is_error = run_tool(ctx, "read_file", {"path": "bad.txt"})
    assert not is_error and "\ufffd" in out
    out, _ = run_tool(ctx, "search", {"pattern": "broken"})
    assert "bad.txt:2" in out


def test_vanished_workspace_is_a_clear_error(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    ctx = ToolContext(Workspace(ws), Sandbox(ws))
    ws.rmdir()
    out, is_error = run_tool(ctx, "read_file", {"path": "a.py"})
    assert is_error and "no longer exists" in out


@needs_bwrap
def test_only_the_plugin_switch_of_the_environment_reaches_a_command(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_TEST_SECRET", "s3cret")
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    res = Sandbox(tmp_path, SandboxConfig(timeout_s=20)).run("env")
    assert "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1" in res.output
    assert "s3cret" not in res.output
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD")
    assert "PYTEST_DISABLE_PLUGIN_AUTOLOAD" not in Sandbox(tmp_path).run("env").output


def test_command_cannot_write_outside(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    outside = Path(tempfile.mkdtemp(dir="/var/tmp"))
    try:
        target = outside / "pwned"
        sb = Sandbox(ws, SandboxConfig(timeout_s=20))
        res = sb.run(
            f"echo x > {target}; echo y > ../escaped; echo w > /usr/pwned; echo z > inside"
        )
        assert "Read-only file system" in res.output  # /usr
        assert f"{target}: No such file or directory" in res.output  # hidden, not merely read-only
        assert not target.exists() and not (tmp_path / "escaped").exists()
        assert (ws / "inside").read_text() == "z\n"
    finally:
        shutil.rmtree(outside)


@needs_bwrap
def test_command_cannot_reach_a_port_opened_outside(tmp_path):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        sb = Sandbox(tmp_path, SandboxConfig(timeout_s=20))
        script = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3); print('CONNECTED')"
        res = sb.run(f'python3 -c "{script}"')
        assert res.exit_code != 0 and "CONNECTED" not in res.output
        assert "refused" in res.output or "unreachable" in res.output
    finally:
        server.close()


def test_endless_loop_is_killed_at_the_time_limit(tmp_path):
    sb = Sandbox(tmp_path, SandboxConfig(timeout_s=1))
    res = sb.run("while true; do :; done")
    assert res.timed_out and res.exit_code is None
    assert "time limit" in res.summary()


def test_background_children_are_killed(tmp_path):
    sb = Sandbox(tmp_path, SandboxConfig(timeout_s=1))
    res = sb.run("(sleep 300 & echo $! > pid); sleep 300")
    assert res.timed_out
    pid_text = (tmp_path / "pid").read_text().strip()
    if not sb.confined:  # under bwrap the pid is the namespace's; the namespace is gone
        pid = int(pid_text)
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@needs_bwrap
@pytest.mark.skipif(not _pids_parents(), reason="no writable pids cgroup to bound a fork bomb")
def test_fork_bomb_is_bounded_and_cleaned_up(tmp_path):
    sb = Sandbox(tmp_path, SandboxConfig(timeout_s=2, max_processes=32))
    marker = f"bomb-{os.getpid()}-{time.monotonic_ns()}"  # in the command line of every copy
    res = sb.run(f": {marker}; bomb(){{ bomb | bomb & }}; bomb; sleep 60")
    assert res.timed_out  # the main process lives on, so the time limit ends it
    assert "Resource temporarily unavailable" in res.output  # the process cap held
    # Count our bomb's processes, not all of /proc: other jobs on the machine start processes
    # too. Killed ones may wait a moment to be reaped; the guard only ends the wait.
    deadline = time.monotonic() + 60
    while _processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _processes_with(marker) == []
    leftover = [
        p for p in _pids_parents()[0].iterdir() if p.name.startswith(f"flywheel-{os.getpid()}-")
    ]
    assert leftover == []


def _processes_with(marker: str) -> list[int]:
    """Live (not zombie) processes whose command line contains `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker.encode() in cmdline and state != "Z":
            found.append(int(entry))
    return found


def test_huge_output_is_capped(tmp_path):
    sb = Sandbox(tmp_path, SandboxConfig(timeout_s=60, max_output_bytes=10_000))
    res = sb.run("head -c 100000000 /dev/zero | tr '\\0' 'a'")
    assert res.exit_code == 0
    assert res.truncated_bytes == 100_000_000 - 10_000
    assert len(res.output) < 11_000 and "bytes of output dropped" in res.output


def test_unconfined_mode_warns_and_needs_approval(tmp_path):
    from agent.harness import ApprovalPolicy

    sb = Sandbox(tmp_path, SandboxConfig(use_bwrap=False, allow_unconfined=True))
    assert not sb.confined
    policy = ApprovalPolicy()
    assert "unconfined" in policy.reason("run_command", {"command": "ls"}, sb.confined)
    assert policy.reason("run_command", {"command": "ls"}, True) is None


def test_an_interpreter_under_tmp_stays_visible_in_the_sandbox(monkeypatch):
    """A fresh clone's virtual environment under /tmp must survive the sandbox's empty /tmp:
    the project's test command runs this interpreter (found when `make test` ran in a clone
    under /tmp: every sandboxed run_tests failed with "No such file or directory")."""
    from agent.harness import sandbox

    monkeypatch.setattr(sandbox.sys, "prefix", "/tmp/clone/.venv")
    monkeypatch.setattr(sandbox.sys, "exec_prefix", "/tmp/clone/.venv")
    monkeypatch.setattr(sandbox.sys, "base_prefix", "/usr/local")
    monkeypatch.setattr(sandbox.sys, "base_exec_prefix", "/usr/local")
    monkeypatch.setattr(sandbox.sys, "executable", "/usr/bin/python3")
    assert sandbox._readable("/tmp/ws", "/home/u", ()) == [("/tmp/clone/.venv", "/tmp/clone/.venv")]
    assert sandbox._readable("/tmp/clone", "/home/u", ()) == []  # in the workspace: bound anyway


@needs_bwrap
def test_this_interpreter_runs_inside_the_sandbox(tmp_path):
    import sys

    sb = Sandbox(tmp_path, SandboxConfig(timeout_s=60))
    res = sb.run(f"{sys.executable} -c 'print(6 * 7)'")
    assert res.exit_code == 0 and "42" in res.output, res.output
