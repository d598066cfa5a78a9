"""`flywheel telemetry ...`: every subcommand has help and works, and the
database path resolved as --db > $FLYWHEEL_DB > $XDG_DATA_HOME default."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from telemetry import Recorder, store
from telemetry.cli import _COMMANDS, main
from telemetry.folders import db_path
from tests.telemetry.conftest import count, record_session

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("command", sorted(_COMMANDS))
def test_every_subcommand_has_help(command: str, capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "usage: flywheel telemetry" in out and "--db" in out


def test_path_precedence(tmp_path: Path):
    env = {"FLYWHEEL_DB": str(tmp_path / "env.db"), "XDG_DATA_HOME": str(tmp_path / "xdg")}
    assert db_path(str(tmp_path / "flag.db"), env) == tmp_path / "flag.db"
    assert db_path(None, env) == tmp_path / "env.db"
    del env["FLYWHEEL_DB"]
    assert db_path(None, env) == tmp_path / "xdg" / "flywheel" / "telemetry.db"
    assert db_path(None, {}) == Path.home() / ".local/share/flywheel/telemetry.db"


def test_path_reads_the_environment_through_the_real_command(tmp_path: Path):
    out = subprocess.run(
        [sys.executable, "-m", "agent.cli", "telemetry", "path"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"XDG_DATA_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(tmp_path / "flywheel" / "telemetry.db")


def test_stats_export_import_rewards_forget(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    db = tmp_path / "t.db"
    with Recorder(db) as rec:
        ids = record_session(rec, "CLI")
    assert main(["--db", str(db), "stats"]) == 0
    assert "steps" in capsys.readouterr().out
    assert main(["stats", "--db", str(db), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["tables"]["steps"] == 6 and stats["schema_version"] == store.SCHEMA_VERSION
    assert stats["tasks_by_stop_reason"] == {"answered": 1} and stats["tasks_not_ended"] == 0
    conn = sqlite3.connect(db)
    ended = conn.execute("SELECT ended_at FROM tasks").fetchone()[0]
    with conn:
        conn.execute("UPDATE tasks SET ended_at = NULL")  # as a killed `flywheel run` leaves it
    assert main(["stats", "--db", str(db)]) == 0
    assert "tasks not ended: 1" in capsys.readouterr().out
    with conn:
        conn.execute("UPDATE tasks SET ended_at = ?", (ended,))
    conn.close()

    assert main(["rewards", "--db", str(db), "--recompute", "--function", "total"]) == 0
    out = capsys.readouterr().out
    assert "recomputed 1 function(s) over 2 subjects" in out and "total@2" in out
    assert count(db, "SELECT COUNT(*) FROM rewards") == 2

    assert main(["export", "--db", str(db), str(tmp_path / "e"), "--held-out-percent", "0"]) == 0
    assert "sft.jsonl" in capsys.readouterr().out
    assert main(["import", "--db", str(tmp_path / "team.db"), str(tmp_path / "e")]) == 0
    assert "0 already present" in capsys.readouterr().out
    assert main(["import", "--db", str(tmp_path / "team.db"), str(tmp_path / "e")]) == 0
    assert " 0 rows new" in capsys.readouterr().out

    assert main(["forget", "--db", str(db), "--all"]) == 2  # needs --yes
    assert main(["forget", "--db", str(db), "--session", ids["session"]]) == 0
    assert "forgot 1 session(s)" in capsys.readouterr().out
    assert count(db, "SELECT COUNT(*) FROM sessions") == 0


def test_errors_are_one_clear_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["stats", "--db", str(tmp_path / "missing.db")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("flywheel telemetry: error: no telemetry database at")
    assert not (tmp_path / "missing.db").exists()
    assert main(["import", "--db", str(tmp_path / "x.db"), str(tmp_path)]) == 1
    assert "no manifest.json" in capsys.readouterr().err
    with Recorder(tmp_path / "t.db") as rec:
        rec.record("session_start")
    assert (
        main(["export", "--db", str(tmp_path / "t.db"), str(tmp_path / "o"), "--reward", "vibes"])
        == 1
    )
    assert "no reward function 'vibes'" in capsys.readouterr().err
