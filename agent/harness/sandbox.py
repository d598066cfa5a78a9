"""Running a shell command for the agent: confined, time-limited, with capped output.

With bubblewrap (`bwrap`) installed, a command runs as

    bwrap --ro-bind / / --dev /dev --proc /proc --tmpfs /tmp --bind WS WS --unshare-net
          --unshare-pid --die-with-parent --new-session --chdir WS -- bash -c CMD

so the whole system is read-only except the workspace (and a throw-away /tmp), there is no
network (a port opened outside is unreachable), and the command lives in its own pid namespace.
Without bwrap the command runs directly in the workspace: `Sandbox.confined` is False, a warning
is logged once per process, and the harness's approval policy asks before every command.

Limits, in both modes:
- time: at `timeout_s` the whole process tree is killed (SIGKILL to the process group; under
  bwrap the pid namespace dies with its first process, taking every descendant with it);
- processes: a pids cgroup capped at `max_processes` when the cgroup filesystem is writable (it
  is for root on cgroup v1/v2 machines), and RLIMIT_NPROC (which the kernel enforces for non-root
  users only), so a fork bomb stays bounded until the time limit kills it;
- output: stdout and stderr, merged, are read to the end but only the first and last
  `max_output_bytes / 2` are kept; the result says how much was dropped;
- file size: RLIMIT_FSIZE caps any single file a command writes.

What it does not do: decide whether a command may run (graph.py's approval policy), or parse
test output (tools.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import selectors
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("flywheel.harness")

_WARNED = False


@dataclass
class SandboxConfig:
    timeout_s: float = 60.0  # wall time per command; the process tree is killed after it
    max_output_bytes: int = 32_000  # output kept (half from the start, half from the end)
    max_processes: int = 128  # processes/threads the command may have at once
    max_file_bytes: int = 1 << 30  # largest file a command may write (RLIMIT_FSIZE)
    use_bwrap: bool = True  # False forces the unconfined mode (tests of the fallback)

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s!r}")
        if self.max_output_bytes < 100:
            raise ValueError("max_output_bytes must be at least 100")
        if self.max_processes < 4:
            raise ValueError("max_processes must be at least 4")


@dataclass
class CommandResult:
    exit_code: int | None  # None when killed at the time limit
    output: str  # merged stdout+stderr, capped (see `truncated_bytes`)
    timed_out: bool
    truncated_bytes: int  # output bytes dropped from the middle
    duration_s: float
    confined: bool  # ran under bwrap

    def summary(self) -> str:
        """What the model sees: status line, then the (capped) output."""
        if self.timed_out:
            head = f"killed: the command exceeded its time limit ({self.duration_s:.0f} s)"
        else:
            head = f"exit code {self.exit_code}"
        if self.truncated_bytes:
            head += f" (output capped: {self.truncated_bytes} bytes dropped from the middle)"
        return f"{head}\n{self.output}" if self.output else head


def _keep_under_tmp(workspace: str) -> list[str]:
    """Read-only binds for this Python's installation when it lives under /tmp.

    The sandbox gives commands an empty /tmp; a virtual environment under /tmp (a fresh clone in
    a temporary folder, as CI makes) would vanish with it, and the project's test command, which
    runs this interpreter, would fail with "No such file or directory".
    """
    binds: list[str] = []
    for prefix in sorted({os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)}):
        inside_ws = prefix == workspace or prefix.startswith(workspace + os.sep)
        if prefix.startswith("/tmp/") and not inside_ws:
            binds += ["--ro-bind", prefix, prefix]
    return binds


class Sandbox:
    """Runs commands in one workspace folder under the limits of a `SandboxConfig`."""

    def __init__(self, root: str | os.PathLike[str], config: SandboxConfig | None = None) -> None:
        self.root = Path(root).resolve()
        self.config = config or SandboxConfig()
        self.bwrap = shutil.which("bwrap") if self.config.use_bwrap else None
        self.confined = self.bwrap is not None
        if not self.confined:
            _warn_once()

    def argv(self, command: str) -> list[str]:
        inner = ["bash", "-c", command]
        if not self.confined:
            return inner
        ws = str(self.root)
        return [
            self.bwrap,
            "--ro-bind", "/", "/",
            "--dev", "/dev",
            "--proc", "/proc",
            "--tmpfs", "/tmp",
            *_keep_under_tmp(ws),
            "--bind", ws, ws,
            "--unshare-net",
            "--unshare-pid",
            "--unshare-ipc",
            "--die-with-parent",
            "--new-session",
            "--chdir", ws,
            "--setenv", "HOME", "/tmp",
            "--",
            *inner,
        ]  # fmt: skip

    def run(self, command: str, timeout_s: float | None = None) -> CommandResult:
        """Run `command` with bash in the workspace; never raises for the command's failures."""
        if not self.root.is_dir():
            return CommandResult(
                None,
                f"the workspace folder {str(self.root)!r} no longer exists",
                False,
                0,
                0.0,
                self.confined,
            )
        cfg = self.config
        timeout = min(timeout_s or cfg.timeout_s, cfg.timeout_s)
        cgroup = _PidsCgroup.create(cfg.max_processes)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            "HOME": "/tmp" if self.confined else os.environ.get("HOME", "/tmp"),
            "TERM": "dumb",
            "PYTHONDONTWRITEBYTECODE": "1",
        }

        def limit() -> None:  # runs in the child between fork and exec
            if cgroup is not None:
                cgroup.enter()
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(resource.RLIMIT_NPROC, (cfg.max_processes, cfg.max_processes))
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(resource.RLIMIT_FSIZE, (cfg.max_file_bytes, cfg.max_file_bytes))

        start = time.monotonic()
        try:
            proc = subprocess.Popen(
                self.argv(command),
                cwd=self.root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=limit,
            )
        except OSError as exc:
            if cgroup is not None:
                cgroup.remove()
            return CommandResult(
                None, f"could not start the command: {exc}", False, 0, 0.0, self.confined
            )
        head, tail, dropped, timed_out = _read_capped(proc, start + timeout, cfg.max_output_bytes)
        _kill_tree(proc, cgroup)
        code = None if timed_out else proc.returncode
        if code is not None and code < 0:
            code = 128 - code  # killed by a signal, as the shell reports it
        text = head.decode("utf-8", "replace")
        if dropped:
            text += f"\n[... {dropped} bytes of output dropped ...]\n"
        text += tail.decode("utf-8", "replace")
        return CommandResult(
            code, text, timed_out, dropped, time.monotonic() - start, self.confined
        )


def _read_capped(
    proc: subprocess.Popen[bytes], deadline: float, cap: int
) -> tuple[bytes, bytes, int, bool]:
    """Read the pipe until EOF or the deadline; keep `cap/2` bytes from each end."""
    half = cap // 2
    head = bytearray()
    tail = bytearray()
    dropped = 0
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    timed_out = False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            if not sel.select(timeout=min(left, 1.0)):
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            room = half - len(head)
            if room > 0:
                head += chunk[:room]
                chunk = chunk[room:]
            if chunk:
                tail += chunk
                if len(tail) > half:
                    dropped += len(tail) - half
                    del tail[: len(tail) - half]
    finally:
        sel.close()
        proc.stdout.close()
    if not timed_out:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
    return bytes(head), bytes(tail), dropped, timed_out


def _kill_tree(proc: subprocess.Popen[bytes], cgroup: _PidsCgroup | None) -> None:
    """Kill whatever is left of the command's process tree, then reap."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    if cgroup is not None:
        cgroup.kill_all()
        cgroup.remove()


def _warn_once() -> None:
    global _WARNED
    if not _WARNED:
        _WARNED = True
        log.warning(
            "bubblewrap (bwrap) is not installed: agent commands will run UNCONFINED in the "
            "workspace (full file system and network access); every command will need your "
            "approval. Install it with `apt-get install bubblewrap` (Debian/Ubuntu)."
        )


class _PidsCgroup:
    """A throw-away pids cgroup (v1 or v2) that caps how many processes a command may have."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, max_pids: int) -> _PidsCgroup | None:
        for parent in _pids_parents():
            path = parent / f"flywheel-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            try:
                path.mkdir()
            except OSError:
                continue
            try:
                (path / "pids.max").write_text(str(max_pids))
                return cls(path)
            except OSError:
                with contextlib.suppress(OSError):
                    path.rmdir()
        return None

    def enter(self) -> None:
        with open(self.path / "cgroup.procs", "w") as f:
            f.write("0")

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def kill_all(self) -> None:
        for _ in range(100):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)

    def remove(self) -> None:
        for _ in range(100):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:  # still busy: processes are exiting
                self.kill_all()
                time.sleep(0.01)
        log.warning("could not remove cgroup %s", self.path)


def _pids_parents() -> list[Path]:
    """Folders where a child pids cgroup may be created, most specific first."""
    out: list[Path] = []
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        rel = rel.lstrip("/")
        if "pids" in controllers.split(","):
            out.append(Path("/sys/fs/cgroup/pids") / rel)
        elif controllers == "":
            base = Path("/sys/fs/cgroup") / rel
            try:
                if "pids" in (base / "cgroup.subtree_control").read_text().split():
                    out.append(base)
            except OSError:
                pass
    return [p for p in out if p.is_dir() and os.access(p, os.W_OK)]
