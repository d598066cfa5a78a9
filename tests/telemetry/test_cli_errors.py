"""`flywheel telemetry` on a file that is not its database: one line naming the file
and a fix that fits where the path came from; a user who passed --db is not told to pass --db."""

from __future__ import annotations

from pathlib import Path

import pytest

from telemetry.cli import main


@pytest.mark.parametrize("command", [["stats"], ["export", "OUT"], ["rewards"]])
def test_a_file_that_is_not_sqlite_given_with_db(tmp_path: Path, capsys, command):
    notes = tmp_path / "notes.txt"
    notes.write_text("not a database\n" * 100)
    argv = [c.replace("OUT", str(tmp_path / "out")) for c in command]
    assert main([*argv, "--db", str(notes)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"flywheel telemetry: error: {notes}: ")
    assert "not a flywheel telemetry database" in err and "check the path given to --db" in err
    assert "pass --db" not in err
    assert notes.read_text() == "not a database\n" * 100  # left as it was


def test_a_folder_given_with_db(tmp_path: Path, capsys):
    assert main(["stats", "--db", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a folder, not a database file" in err
    assert "pass --db" not in err


def test_a_bad_file_from_the_environment_names_the_variable(tmp_path: Path, capsys, monkeypatch):
    notes = tmp_path / "notes.txt"
    notes.write_text("not a database\n")
    monkeypatch.setenv("FLYWHEEL_DB", str(notes))
    assert main(["stats"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "check $FLYWHEEL_DB, or pass --db FILE" in err
