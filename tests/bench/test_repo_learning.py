"""benchmarks/repo_learning.py: the paired comparison, and a quick run end to end on the tiny
model (random weights: it measures nothing, but every stage runs and the JSON has its shape)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location(
        "repo_learning", ROOT / "benchmarks" / "repo_learning.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _rows(shown: list[int], chars: list[int]) -> list[dict]:
    return [
        {"id": f"a.py:{i}", "shown": bool(s), "accepted_chars": c}
        for i, (s, c) in enumerate(zip(shown, chars, strict=True))
    ]


def test_paired_bootstrap_compares_the_same_requests():
    bench = _bench()
    before = _rows([1, 1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0, 0, 10])
    after = _rows([1, 1, 1, 1, 0, 0, 0, 1], [10, 10, 10, 0, 0, 0, 0, 10])
    out = bench.paired_bootstrap(before, after)
    rate = out["accept_rate"]
    assert rate["before"] == 1 / 8 and rate["after"] == 4 / 5
    assert rate["ci95"][0] > 0  # accepted more often, beyond noise
    assert out["shown_per_request"]["difference"] == pytest.approx(-3 / 8)
    assert out["accepted_chars_per_request"]["difference"] == pytest.approx(30 / 8)
    same = bench.paired_bootstrap(before, before)
    assert same["accept_rate"]["ci95"] == [0.0, 0.0] and out["requests"] == 8
    assert bench.paired_bootstrap(before, _rows([1], [0])[:0]) == {}


def test_quick_run_writes_every_stage_and_comparison(tmp_path, capsys):
    bench = _bench()
    out = tmp_path / "repo_learning.json"
    code = bench.main(
        ["--quick", "--repos", "flywheel", "--work", str(tmp_path / "work"), "--json", str(out)]
    )
    assert code == 0
    report = json.loads(out.read_text())
    (repo,) = report["repos"]
    assert repo["repo"] == "flywheel" and repo["source"].startswith("git:")
    assert repo["split"]["heldout_files"] > 0 and repo["split"]["train_files"] > 0
    assert set(repo["scores"]) == {"before", "cpt", "tab"}
    for scores in repo["scores"].values():
        assert {"ppl", "exact", "accept_rate", "shown_per_request"} <= set(scores)
    assert repo["paired"]["tab_vs_before"]["requests"] == 6
    assert {"before", "cpt"} <= set(repo["infill"]) and repo["infill"]["before"]["tasks"] == 2
    assert repo["timings_s"]["cpt_and_both_evaluations"] > 0
    assert "accept" in capsys.readouterr().out
    # a second run takes every finished stage from the work folder
    assert (
        bench.main(
            ["--quick", "--repos", "flywheel", "--work", str(tmp_path / "work"), "--json", str(out)]
        )
        == 0
    )
    assert json.loads(out.read_text())["repos"][0]["scores"] == repo["scores"]
    # stopped after continued pretraining: no completion-RL scores or comparisons
    args = ["--quick", "--repos", "flywheel", "--work", str(tmp_path / "cpt"), "--json", str(out)]
    assert bench.main([*args, "--no-tab"]) == 0
    (cpt_only,) = json.loads(out.read_text())["repos"]
    assert set(cpt_only["scores"]) == {"before", "cpt"} and set(cpt_only["paired"]) == {
        "cpt_vs_before"
    }
    assert not (tmp_path / "cpt" / "flywheel" / "tab.json").exists()
    # benchmarks/show_threshold.py on the finished run: the completion model's threshold
    spec = importlib.util.spec_from_file_location(
        "show_threshold", ROOT / "benchmarks" / "show_threshold.py"
    )
    show = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(show)
    shown = tmp_path / "show.json"
    argv = ["--work", str(tmp_path / "work"), "--repos", "flywheel", "--fit-requests", "4"]
    assert show.main([*argv, "--json", str(shown)]) == 0
    (measured,) = json.loads(shown.read_text())["repos"]
    assert measured["paired"]["threshold_vs_cpt"]["requests"] == 6
    assert len(measured["requests"]) == 6 and measured["timings_s"]["fit"] > 0
    assert show.main(["--work", str(tmp_path / "none"), "--json", str(shown)]) == 2
    # benchmarks/threshold_dtype.py: the same threshold decided on int8 log-probabilities
    spec = importlib.util.spec_from_file_location(
        "threshold_dtype", ROOT / "benchmarks" / "threshold_dtype.py"
    )
    dtype = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dtype)
    folder = tmp_path / "work" / "flywheel"
    meta_path = Path(dtype.final_model(folder)[0]) / "flywheel.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "show_min_confidence": -3.0}))  # a threshold to test
    out = tmp_path / "dtype.json"
    argv = ["--work", str(tmp_path / "work"), "--repo", "flywheel", "--requests", "4"]
    assert dtype.main([*argv, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["threshold"] == -3.0 and 1 <= result["requests"] == len(result["rows"]) <= 4
    for row in result["rows"]:  # the same tokens scored twice: close, not necessarily equal
        assert row["float32"] <= 0 and row["int8"] <= 0 and abs(row["int8"] - row["float32"]) < 1
        assert row["shown_float32"] == (row["float32"] >= -3.0)


def test_unknown_repository_is_one_line(capsys):
    assert _bench().main(["--quick", "--repos", "nope"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
