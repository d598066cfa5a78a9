"""benchmarks/lowbit_matmul.py times every precision's layer on each shape and row count and
writes its table to JSON; here on small shapes standing in for the 0.5B's, no timing checked."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from agent.engine.local.lowbit import int4_unavailable

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(int4_unavailable() is not None, reason=f"no int4: {int4_unavailable()}")
def test_lowbit_matmul_writes_every_cell_and_a_step_estimate(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location(
        "lowbit_matmul", ROOT / "benchmarks" / "lowbit_matmul.py"
    )
    assert spec and spec.loader
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    shapes = ((64, 64), (64, 48), (128, 256))  # the last stands for the lm_head
    monkeypatch.setattr(bench, "SHAPES", shapes)
    monkeypatch.setattr(bench, "PER_STEP", {(64, 64): 4, (64, 48): 2, (128, 256): 1})
    out = tmp_path / "lowbit.json"
    argv = ["lowbit_matmul.py", "--threads", "1", "--repeats", "1", "--calls", "2"]
    monkeypatch.setattr(sys, "argv", [*argv, "--working-set-mb", "1", "--json", str(out)])
    assert bench.main() == 0
    report = json.loads(out.read_text())
    cells = {(r["in"], r["out"], r["rows"], r["precision"]) for r in report["results"]}
    precisions = ["float32", "bfloat16", "int8", "int4-g32", "int4-g64", "int4-dyn-g32"]
    for k, n in shapes:
        for p in precisions[:5] + (precisions[5:] if (k, n) != shapes[-1] else []):
            assert {(k, n, 1, p), (k, n, 5, p)} <= cells
    int4 = [r for r in report["results"] if r["precision"] == "int4-g32"]
    assert all(0 < r["error"] < 0.2 and r["copies"] >= 1 for r in int4)
    names = {e["precision"] for e in report["step_estimates"]}
    assert "int4-g32, lm_head int8" in names and "float32" in names
    assert report["command"].startswith("python benchmarks/lowbit_matmul.py --threads 1")
