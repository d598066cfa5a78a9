"""A real `flywheel serve` subprocess for tests (tests/test_serve.py, the engine's `openai` param).

    with running_server(checkpoint, "--speculative", "ngram") as url:   # http://127.0.0.1:PORT
        httpx.get(url + "/health")

The server binds a free port on 127.0.0.1; the context manager returns once `/health` answers
(polled until a deadline, failing with the server's log if it exits or never answers) and stops
the process on the way out.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_server(model: Path | str, *flags: str, deadline_s: float = 120.0) -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "agent.cli", "serve", "--model", str(model)]
    command += ["--port", str(port), *flags]
    with tempfile.TemporaryFile("w+") as log:
        # Tiny models decode fastest on one thread, and the test process keeps a core.
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)

        def output() -> str:
            log.seek(0)
            return log.read()[-4000:]

        try:
            wait_for_health(process, url, "flywheel serve", deadline_s, output)
            yield url
        finally:
            stop(process, 20)


def wait_for_health(
    process: subprocess.Popen, url: str, what: str, deadline_s: float, output: Callable[[], str]
) -> None:
    """Until `url`/health answers 200; raises with the server's `output()` when it exits or
    does not answer within `deadline_s`."""
    deadline = time.monotonic() + deadline_s
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}:\n{output()}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not answer in {deadline_s}s:\n{output()}")
        time.sleep(0.1)  # poll interval while the server imports and loads


def stop(process: subprocess.Popen, grace_s: float) -> None:
    """Terminate a server process; kill it when it has not ended after `grace_s` seconds."""
    process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
