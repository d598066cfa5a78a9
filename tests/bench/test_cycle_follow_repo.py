"""benchmarks/cycle_follow_repo.py end to end on the tiny model (random weights: it measures
nothing, but the editor, the cycle's repository stage, the gate and the report all run)."""

from __future__ import annotations

import json

from benchmarks import cycle_follow_repo as bench


def test_paired_exact_compares_the_same_lines():
    before = [{"exact": e} for e in (False, False, True, False)]
    after = [{"exact": e} for e in (True, True, True, False)]
    out = bench.paired_exact(before, after)
    assert (out["lines"], out["before"], out["after"]) == (4, 0.25, 0.75)
    low, high = out["ci95"]  # per-line differences 1, 1, 0, 0: never below 0
    assert 0 <= low <= 0.5 <= high <= 1
    assert bench.paired_exact(before, before)["ci95"] == [0.0, 0.0]


def test_quick_run_asks_the_editor_before_and_after_the_cycle(tmp_path):
    out = tmp_path / "follow.json"
    code = bench.main(
        ["--quick", "--repo", "flywheel", "--work", str(tmp_path / "w"), "--json", str(out)]
    )
    report = json.loads(out.read_text())
    assert code == (0 if report["editor_follows"] else 1)
    assert report["exact"]["lines"] == len(report["editor_before"]) == 4
    assert [r["path"] for r in report["editor_after"]] == [
        r["path"] for r in report["editor_before"]
    ]
    assert report["versions_before"] in ([], [report["baseline"]])
    lane = report["cycle"]["summary"]["completion"]
    assert lane["stages"] == ["repo"] and "repo_benchmark" in lane
    assert lane["status"] in ("promoted", "rejected")
    assert report["cycle"]["agent_after"] == report["baseline"]  # the agent keeps its version
    if lane["status"] == "promoted":  # then every answer after it came from the new version
        assert report["editor_follows"] and report["versions_after"] == [lane["candidate"]]
