"""A task interrupted by an approval resumes from the SQLite checkpoint in a new process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import rows

ROOT = Path(__file__).resolve().parents[2]


def phase(*args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.harness.resume_worker", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_approval_resumes_in_a_new_process(workspace, tmp_path):
    ckpt, tel = str(tmp_path / "ckpt.db"), str(tmp_path / "tel.db")
    first = phase("start", str(workspace), ckpt, tel, "t1")
    assert first["stop_reason"] is None
    assert first["approval"]["calls"][0]["name"] == "delete_file"
    assert (workspace / "calc.py").exists()

    second = phase("resume", str(workspace), ckpt, tel, "t1")
    assert second["stop_reason"] == "answered" and second["final"] == "Deleted calc.py."
    assert not (workspace / "calc.py").exists()
    assert "-def add(a, b):" in second["diff"]  # the diff spans both processes

    [task] = rows(tel, "SELECT * FROM tasks")
    assert task["status"] == "done"
    roles = [r["role"] for r in rows(tel, "SELECT role FROM steps ORDER BY idx")]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    assert task["stop_reason"] == "answered" and "-def add(a, b):" in task["diff"]
