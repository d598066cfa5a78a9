"""Running a shell command for the agent: confined, time-limited, with capped output.

With bubblewrap (`bwrap`) installed, a command runs in a file system built from an allow-list
(`mounts`), with no network, in its own pid, IPC and UTS namespaces:

    read-only   /usr, /bin, /sbin, /lib* (the system's programs and libraries);
                a filtered /etc (`ETC_KEPT`: certificates, the dynamic linker, time zone, name
                service and OS release files, language runtimes' system config) with a made-up
                passwd and group naming only root, the current user and nobody; no shadow,
                sudoers, SSH host keys, pip/npm/git system config;
                the language toolchains installed in the home (`HOME_TOOLCHAINS`: rustup's
                ~/.cargo/bin and ~/.rustup, nvm's node versions), without their credentials;
                this interpreter's installation and virtual environment (`sys.prefix`,
                `sys.base_prefix`), and the interpreter of each virtual environment at the
                workspace's top level (`home` in its pyvenv.cfg), so the project's tests run;
                the folders in `SandboxConfig.read_only_paths` (`--read-only` on the command line,
                `agent.readOnlyPaths` in the editor);
    read-write  the workspace; an empty /tmp and an empty home (at $HOME's path, so `~` works),
                both thrown away after the command;
    nothing     else: the user's home (~/.ssh, ~/.aws, ~/.netrc, other projects), the
                workspace's siblings, /opt, /var, /srv, /run, /mnt, /media, /root, /sys.

The environment is built from scratch (PATH, HOME, TMPDIR, LANG, TERM,
PYTHONDONTWRITEBYTECODE): no variable of the user's (tokens, keys, proxies) reaches a command,
except PYTEST_DISABLE_PLUGIN_AUTOLOAD: a switch, set where Flywheel runs, that keeps the pytest
plugins of Flywheel's own environment out of a project tested with its interpreter.
PATH keeps the user's entries that the sandbox shows, then this interpreter's bin folders.
The root of that file system is read-only, so a command cannot write anywhere else either.

How this compares: Codex CLI's Linux sandbox (Landlock, or bubblewrap with `--ro-bind / /`) and
Claude Code's bubblewrap runtime (`denyRead` deny-list) both let a command read the whole disk
by default and restrict writes and network. Here reading is an allow-list too: a file outside
the workspace is hidden unless it belongs to the system, the interpreters or a listed folder.

Without bwrap, commands are refused: the result says why and how to fix it
(`apt-get install bubblewrap`), and nothing runs. Only `SandboxConfig.allow_unconfined`
(`flywheel run --allow-unconfined`, `agent.allowUnconfined`) lets them run directly in the
workspace, unconfined; the harness's default approval policy then asks before each one. A
warning is logged once per process in both cases.

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
import fnmatch
import grp
import logging
import os
import pwd
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

_WARNED: set[str] = set()

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")  # read-only
# Language toolchains that installers put in the home (rustup, nvm), shown read-only when present:
# binaries and toolchains only, never ~/.cargo's credentials or registry.
HOME_TOOLCHAINS = (".cargo/bin", ".rustup", ".nvm/versions")
# /etc entries kept (read-only, when present; fnmatch patterns). passwd and group are made up.
ETC_KEPT = (
    "alternatives",
    "ca-certificates",
    "ca-certificates.conf",
    "crypto-policies",
    "pki",
    "ssl",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "timezone",
    "locale.alias",
    "locale.conf",
    "hosts",
    "host.conf",
    "nsswitch.conf",
    "gai.conf",
    "protocols",
    "services",
    "os-release",
    "debian_version",
    "lsb-release",
    "redhat-release",
    "alpine-release",
    "mime.types",
    "magic",
    "magic.mime",
    "terminfo",
    "fonts",
    "shells",
    "mtab",
    "python3",
    "python3.*",
    "perl",
    "java-*",
)
# What a refused command returns, and what `flywheel run` and the language server say once.
NO_BWRAP = (
    "bubblewrap (bwrap) is not installed, so agent commands cannot be confined and are refused; "
    "install it (Debian/Ubuntu: apt-get install bubblewrap), or let them run unconfined with "
    "`flywheel run --allow-unconfined` (editor setting agent.allowUnconfined)"
)


@dataclass
class SandboxConfig:
    timeout_s: float = 60.0  # wall time per command; the process tree is killed after it
    max_output_bytes: int = 32_000  # output kept (half from the start, half from the end)
    max_processes: int = 128  # processes/threads the command may have at once
    max_file_bytes: int = 1 << 30  # largest file a command writes (RLIMIT_FSIZE)
    read_only_paths: tuple[str, ...] = ()  # extra folders commands may read (absolute or ~/...)
    allow_unconfined: bool = False  # without bwrap: run commands unconfined instead of refusing
    use_bwrap: bool = True  # False acts as if bwrap were missing (tests of the fallback)

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s!r}")
        if self.max_output_bytes < 100:
            raise ValueError("max_output_bytes must be at least 100")
        if self.max_processes < 4:
            raise ValueError("max_processes must be at least 4")
        paths = []
        for path in self.read_only_paths:
            full = os.path.expanduser(str(path))
            if not os.path.isabs(full):
                raise ValueError(f"read-only path {path!r} must be absolute (or start with ~/)")
            full = os.path.normpath(full)
            if full == "/":
                raise ValueError("read-only path / would show the whole disk; list the folders")
            paths.append(full)
        self.read_only_paths = tuple(paths)


@dataclass
class CommandResult:
    exit_code: int | None  # None when killed at the time limit, or when it did not run
    output: str  # merged stdout+stderr, capped (see `truncated_bytes`); why, when it did not run
    timed_out: bool
    truncated_bytes: int  # output bytes dropped from the middle
    duration_s: float
    confined: bool  # ran under bwrap

    def summary(self) -> str:
        """What the model sees: status line, then the (capped) output."""
        if self.timed_out:
            head = f"killed: the command exceeded its time limit ({self.duration_s:.0f} s)"
        elif self.exit_code is None:
            head = "not run"
        else:
            head = f"exit code {self.exit_code}"
        if self.truncated_bytes:
            head += f" (output capped: {self.truncated_bytes} bytes dropped from the middle)"
        return f"{head}\n{self.output}" if self.output else head


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _home() -> str:
    """Where the command's empty home goes: $HOME's path, unless that is / or a system folder."""
    home = os.path.normpath(os.path.abspath(os.path.expanduser("~")))
    hidden = (*SYSTEM_DIRS, "/etc", "/dev", "/proc")
    if home == "/" or any(_inside(home, d) for d in hidden):
        return "/tmp"
    return home


def _venv_interpreters(workspace: str) -> list[str]:
    """Installations of the virtual environments at the workspace's top level (pyvenv.cfg)."""
    out = []
    for cfg in sorted(Path(workspace).glob("*/pyvenv.cfg")):
        with contextlib.suppress(OSError, UnicodeDecodeError):
            for line in cfg.read_text().splitlines():
                key, _, value = line.partition("=")
                if key.strip() == "home" and os.path.isabs(value.strip()):
                    out.append(os.path.dirname(os.path.realpath(value.strip())))
    return out


def _readable(workspace: str, home: str, read_only: tuple[str, ...]) -> list[tuple[str, str]]:
    """(source, target) read-only binds: the interpreters the project needs, then the user's list.

    Each folder is bound at its real path and, when different, at the path it was named by (a
    virtual environment's scripts name their interpreter by the path it was created at). Folders
    under the system folders or the workspace are visible anyway and skipped. An interpreter
    installed at a folder that holds the home (`--prefix=$HOME`) is bound by its bin/ and lib/
    only, so that the home stays hidden.
    """
    interpreters = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
    interpreters.append(os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))))
    interpreters += _venv_interpreters(workspace)
    wanted: list[str] = [
        os.path.join(home, sub) for sub in HOME_TOOLCHAINS if os.path.isdir(os.path.join(home, sub))
    ]
    for root in interpreters:
        if _inside(home, os.path.realpath(root)) and home != "/tmp":
            wanted += [os.path.join(root, sub) for sub in ("bin", "lib", "lib64", "include")]
        else:
            wanted.append(root)
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for path in [*wanted, *read_only]:
        source = os.path.realpath(path)
        for target in dict.fromkeys((source, os.path.normpath(os.path.abspath(path)))):
            skip = target == "/" or _inside(target, workspace)
            skip = skip or any(_inside(target, d) for d in SYSTEM_DIRS)
            if not skip and target not in seen:
                seen.add(target)
                out.append((source, target))
    return out


def _search_path(workspace: str, home: str, read_only: tuple[str, ...]) -> str:
    """PATH for a confined command: the entries of the user's PATH that the sandbox shows, in
    order, then this interpreter's bin folders, so that `python` resolves (to this Python, as
    the project's test command uses) where nothing earlier provides one. Entries in the hidden
    home that the sandbox does not show (~/.pyenv/shims) are left out: they would be empty."""
    shown = [
        *SYSTEM_DIRS,
        workspace,
        *(target for _, target in _readable(workspace, home, read_only)),
    ]
    entries = [
        os.path.normpath(p)
        for p in os.environ.get("PATH", "").split(os.pathsep)
        if os.path.isabs(p) and any(_inside(os.path.normpath(p), root) for root in shown)
    ]
    entries += [os.path.dirname(sys.executable)]
    entries += [os.path.join(prefix, "bin") for prefix in (sys.prefix, sys.base_prefix)]
    return os.pathsep.join(dict.fromkeys(entries))


def _etc() -> list[str]:
    """bwrap arguments for the kept /etc entries (a symlink stays a symlink)."""
    try:
        names = sorted(os.listdir("/etc"))
    except OSError:
        return []
    args: list[str] = []
    for name in names:
        if not any(fnmatch.fnmatchcase(name, pattern) for pattern in ETC_KEPT):
            continue
        path = f"/etc/{name}"
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        else:
            args += ["--ro-bind-try", path, path]
    return args


def _accounts(home: str) -> tuple[str, str]:
    """/etc/passwd and /etc/group for the sandbox: root, the current user (home: `home`), nobody."""
    uid, gid = os.getuid(), os.getgid()
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = "user"
    try:
        group = grp.getgrgid(gid).gr_name
    except KeyError:
        group = user
    passwd = {0: "root:x:0:0:root:/root:/bin/sh", 65534: "nobody:x:65534:65534:nobody:/:/bin/false"}
    passwd[uid] = f"{user}:x:{uid}:{gid}:{user}:{home}:/bin/bash"
    groups = {0: "root:x:0:", 65534: "nogroup:x:65534:", gid: f"{group}:x:{gid}:"}
    return "".join(v + "\n" for v in passwd.values()), "".join(v + "\n" for v in groups.values())


def mounts(
    workspace: str, home: str, read_only: tuple[str, ...], passwd_fd: int, group_fd: int
) -> list[str]:
    """bwrap's file-system arguments (the module docstring says what is visible).

    Order matters: a later mount covers an earlier one at the same place, so the empty /tmp and
    home come before what is bound inside them, and the workspace comes last.
    """
    args: list[str] = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):  # merged /usr: /bin -> usr/bin
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    args += _etc()
    args += ["--ro-bind-data", str(passwd_fd), "/etc/passwd"]
    args += ["--ro-bind-data", str(group_fd), "/etc/group"]
    args += ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    if home != "/tmp":
        args += ["--tmpfs", home]
    for source, target in _readable(workspace, home, read_only):
        args += ["--ro-bind-try", source, target]
    args += ["--bind", workspace, workspace]
    return args


def _data_fd(text: str) -> int:
    """A pipe holding `text` for bwrap's --ro-bind-data (small: fits the pipe's buffer)."""
    read, write = os.pipe()
    try:
        os.write(write, text.encode())
    finally:
        os.close(write)
    return read


class Sandbox:
    """Runs commands in one workspace folder under the limits of a `SandboxConfig`.

    `confined` is True when no command can run outside bubblewrap: bwrap is there, or commands
    are refused without it (`refusal` then says why). The approval policy asks before commands
    only when it is False (bwrap missing and `allow_unconfined` set).
    """

    def __init__(self, root: str | os.PathLike[str], config: SandboxConfig | None = None) -> None:
        self.root = Path(root).resolve()
        self.config = config or SandboxConfig()
        self.bwrap = shutil.which("bwrap") if self.config.use_bwrap else None
        self.refusal: str | None = None
        if self.bwrap is None and not self.config.allow_unconfined:
            self.refusal = NO_BWRAP
            _warn_once(NO_BWRAP)
        elif self.bwrap is None:
            _warn_once(
                "bubblewrap (bwrap) is not installed and unconfined commands are allowed: agent "
                "commands run UNCONFINED in the workspace (the whole disk and the network); each "
                "one needs your approval. Install it with `apt-get install bubblewrap`."
            )
        self.confined = self.bwrap is not None or self.refusal is not None

    def argv(self, command: str, passwd_fd: int = -1, group_fd: int = -1) -> list[str]:
        inner = ["bash", "-c", command]
        if self.bwrap is None:
            return inner
        ws = str(self.root)
        home = _home()
        return [
            self.bwrap,
            *mounts(ws, home, self.config.read_only_paths, passwd_fd, group_fd),
            "--remount-ro",
            "/",
            "--unshare-net",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--hostname",
            "sandbox",
            "--die-with-parent",
            "--new-session",
            "--chdir",
            ws,
            "--",
            *inner,
        ]

    def run(self, command: str, timeout_s: float | None = None) -> CommandResult:
        """Run `command` with bash in the workspace; never raises for the command's failures."""
        if self.refusal is not None:
            return CommandResult(None, f"refused: {self.refusal}", False, 0, 0.0, False)
        if not self.root.is_dir():
            return CommandResult(
                None,
                f"the workspace folder {str(self.root)!r} no longer exists",
                False,
                0,
                0.0,
                self.bwrap is not None,
            )
        cfg = self.config
        timeout = min(timeout_s or cfg.timeout_s, cfg.timeout_s)
        confined = self.bwrap is not None
        home = _home() if confined else os.environ.get("HOME", "/tmp")
        if confined:
            path = _search_path(str(self.root), home, cfg.read_only_paths)
        else:
            path = os.environ.get("PATH", "/usr/bin:/bin")
        env = {
            "PATH": path,
            "LANG": "C.UTF-8",
            "HOME": home,
            "TMPDIR": "/tmp",
            "TERM": "dumb",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
            env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"]
        fds: tuple[int, ...] = ()
        if confined:
            fds = tuple(_data_fd(text) for text in _accounts(home))
        cgroup = _PidsCgroup.create(cfg.max_processes)

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
                self.argv(command, *fds),
                cwd=self.root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=limit,
                pass_fds=fds,
            )
        except OSError as exc:
            if cgroup is not None:
                cgroup.remove()
            return CommandResult(
                None, f"could not start the command: {exc}", False, 0, 0.0, confined
            )
        finally:
            for fd in fds:
                os.close(fd)
        head, tail, dropped, timed_out = _read_capped(proc, start + timeout, cfg.max_output_bytes)
        _kill_tree(proc, cgroup)
        code = None if timed_out else proc.returncode
        if code is not None and code < 0:
            code = 128 - code  # killed by a signal, as the shell reports it
        text = head.decode("utf-8", "replace")
        if dropped:
            text += f"\n[... {dropped} bytes of output dropped ...]\n"
        text += tail.decode("utf-8", "replace")
        return CommandResult(code, text, timed_out, dropped, time.monotonic() - start, confined)


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


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        log.warning("%s", message)


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
