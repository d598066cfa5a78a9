"""benchmarks/next_turn.py replays tool calls on a scratch copy and asks a model for its next turn,
as is and after each forced start; the workspace itself is never touched."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_next_turn_replays_calls_and_writes_the_turns(tiny_checkpoint, tmp_path):
    spec = importlib.util.spec_from_file_location("next_turn", ROOT / "benchmarks" / "next_turn.py")
    assert spec and spec.loader
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    project = tmp_path / "project"
    project.mkdir()
    (project / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (project / "test_calc.py").write_text(
        "from calc import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n"
    )
    before = {p.name: p.read_text() for p in project.iterdir()}
    out = tmp_path / "turns.json"
    argv = ["--model", str(tiny_checkpoint), "--workspace", str(project), "--max-tokens", "4"]
    argv += [
        "--call",
        "read_file",
        '{"path": "calc.py"}',
        "--prefix",
        "The bug",
        "--json",
        str(out),
    ]
    assert probe.main(argv) == 0
    record = json.loads(out.read_text())
    assert record["command"].startswith("python benchmarks/next_turn.py --model")
    assert [t["prefix"] for t in record["turns"]] == [None, "The bug"]
    assert all(isinstance(t["text"], str) for t in record["turns"])
    assert {p.name: p.read_text() for p in project.iterdir()} == before
