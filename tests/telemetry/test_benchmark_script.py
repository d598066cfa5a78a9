"""The benchmark script runs end to end and writes its JSON (no timing is asserted here: timings
belong to the benchmark's own output, see benchmarks/telemetry_recorder.py)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_benchmark_runs_small_and_writes_json(tmp_path: Path, capsys):
    spec = importlib.util.spec_from_file_location(
        "telemetry_recorder_bench", ROOT / "benchmarks" / "telemetry_recorder.py"
    )
    assert spec and spec.loader
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "bench.json"
    bench.main(
        [
            "--events",
            "400",
            "--rate",
            "2000",
            "--seconds",
            "0.2",
            "--repeat",
            "1",
            "--json",
            str(out),
        ]
    )
    result = json.loads(out.read_text())
    assert set(result["median"]) == {"naive", "burst", "paced"}
    assert (
        result["median"]["burst"]["written"] == 400 and result["median"]["paced"]["written"] == 400
    )
    assert result["median"]["burst"]["all_ok"]
    assert "burst vs naive" in capsys.readouterr().out
