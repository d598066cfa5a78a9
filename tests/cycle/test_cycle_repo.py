"""`flywheel cycle --workspace`: the repository stage runs when the code changed enough, and the
gate compares the candidate with its parent on the repository's held-out files."""

from __future__ import annotations

from telemetry import open_db
from tests.training.test_repo import CODE, make_workspace
from training import cycle
from training.cycle import CycleBench


def _config(registry, tmp_path, ws, **extra) -> cycle.CycleConfig:
    settings = dict(
        registry=str(registry.root),
        telemetry_db=str(tmp_path / "telemetry.db"),
        work=str(tmp_path / "work"),
        quick=True,
        workspace=str(ws),
        min_repo_chars=2_000,
        repo_lines=3,
        repo_requests=3,
        bench=CycleBench(projects=1, max_tasks=1, max_steps=1, turn_max_tokens=8),
    )
    return cycle.CycleConfig(**{**settings, **extra})


def test_a_changed_workspace_trains_a_candidate_gated_on_its_held_out_files(
    registry, tiny_checkpoint, tmp_path
):
    open_db(tmp_path / "telemetry.db").conn.close()  # a new user: no session logged yet
    ws = make_workspace(tmp_path / "ws")
    v1 = registry.add(tiny_checkpoint)
    registry.promote(v1, forced=True)
    lines: list[str] = []
    summary = cycle.run_cycle(_config(registry, tmp_path, ws), log=lines.append)
    lane = summary["completion"]  # a candidate for inline completions, gated on its own
    assert lane["status"] in ("promoted", "rejected")
    # no suggestion logged, and the tiny model's few samples are all rejected alike: the tab stage
    # finds no learning signal, and the repo stage's model is the candidate
    assert lane["tab"]["source"] == "simulated" and lane["tab"]["updates"] == 0
    assert lane["stages"] == ["repo"]
    assert summary["status"] == lane["status"] and "candidate" not in summary
    assert summary["reason"].startswith("nothing for the agent to learn from")
    candidate = lane["candidate"]
    assert lane["parent"] == v1 and set(lane["repo_benchmark"]) == {candidate, v1}
    theirs = [r for r in registry.benchmarks(v1) if r["benchmark"] == "repo_heldout"]
    mine = registry.benchmarks(candidate)  # the agent benchmark does not judge it
    assert len(theirs) == len(mine) == 1 and theirs[0]["task_set"] == mine[0]["task_set"]
    (gate,) = registry.get(candidate)["gate"]
    assert any(r.startswith("nll:") for r in gate["reasons"])
    assert any(r.startswith("exact:") for r in gate["reasons"])
    assert any(r.startswith("reward:") for r in gate["reasons"])  # the simulated user's tab reward
    assert registry.promoted() == v1  # the agent's version never changes for it
    expected = candidate if lane["status"] == "promoted" else v1
    assert registry.serving("completion") == expected
    assert any("characters new or changed" in x and "enough" in x for x in lines)

    # nothing changed since: no stage, and the next cycle is skipped
    again: list[str] = []
    skipped = cycle.run_cycle(_config(registry, tmp_path, ws), log=again.append)
    assert skipped["status"] == "skipped" and "0 characters new or changed" in again[0]
    (ws / "shop" / "added.py").write_text(CODE * 10)  # 2,000+ new characters
    grown: list[str] = []
    cycle.run_cycle(_config(registry, tmp_path, ws, min_repo_chars=10**9), log=grown.append)
    assert f"{len(CODE * 10)} characters new or changed" in grown[0]


def test_logged_suggestions_train_the_candidate_by_completion_rl_after_the_repo_stage(
    registry, tiny_checkpoint, tmp_path
):
    """The completion lane's tab stage learns from the suggestions the editor logged (accepted
    and rejected), beside the simulated user; its model, with its lineage, is the candidate."""
    from tests.training.test_tab import logged_db

    ws = make_workspace(tmp_path / "ws")
    logged_db(tmp_path / "telemetry.db", ws)
    v1 = registry.add(tiny_checkpoint)
    registry.promote(v1, forced=True)
    config = _config(registry, tmp_path, ws, stages={"tab": {"tasks_per_step": 6}})
    lane = cycle.run_cycle(config, log=lambda line: None)["completion"]
    assert lane["stages"] == ["repo", "tab"] and lane["tab"]["updates"] == 1
    assert lane["tab"]["source"] == "simulated+telemetry"
    entry = registry.get(lane["candidate"])
    assert set(entry["recipe"]) == {"repo", "tab"} and entry["reward"] == "tab@2 x 1"
    assert entry["data"]["tab"]["outcomes"] == lane["tab"]["outcomes"]
    (result,) = registry.benchmarks(lane["candidate"])
    assert result["reward"] == "tab@2" and "reward" in result["metrics"]


def test_enough_logged_suggestions_train_a_candidate_by_completion_rl_alone(
    registry, tiny_checkpoint, tmp_path
):
    """The workspace did not change enough, but the editor logged enough suggestions: the tab
    stage alone trains from the version serving completions; the suggestions are not counted
    again by the next cycle."""
    from tests.training.test_tab import logged_db

    ws = make_workspace(tmp_path / "ws")
    logged_db(tmp_path / "telemetry.db", ws)  # 3 suggestions shown with their code and an outcome
    logged_db(tmp_path / "telemetry.db", tmp_path / "other")  # 3 more, in another workspace
    v1 = registry.add(tiny_checkpoint)
    registry.promote(v1, forced=True)
    quiet = dict(min_repo_chars=10**9, min_tab_suggestions=3, min_sessions=10)
    config = _config(registry, tmp_path, ws, stages={"tab": {"tasks_per_step": 6}}, **quiet)
    lines: list[str] = []
    lane = cycle.run_cycle(config, log=lines.append)["completion"]
    assert "3 logged suggestion(s) to learn from" in lines[0]
    assert lane["stages"] == ["tab"] and lane["tab"]["source"] == "simulated+telemetry"
    entry = registry.get(lane["candidate"])
    assert entry["parent"] == v1 and set(entry["recipe"]) == {"tab"}
    assert entry["data"]["logged_suggestions"] == 3
    again: list[str] = []
    skipped = cycle.run_cycle(config, log=again.append)
    assert skipped["status"] == "skipped" and "0 logged suggestion(s)" in again[0]


def test_completion_rl_without_an_update_makes_no_candidate_and_uses_the_suggestions(
    registry, tiny_checkpoint, tmp_path
):
    from tests.training.test_tab import logged_db

    ws = make_workspace(tmp_path / "ws")
    logged_db(tmp_path / "telemetry.db", ws)
    v1 = registry.add(tiny_checkpoint)
    registry.promote(v1, forced=True)
    quiet = dict(min_repo_chars=10**9, min_tab_suggestions=3, min_sessions=10)
    # one logged sample a step is its own baseline, and the tiny model's two samples at a
    # cursor are rejected alike: no learning signal
    config = _config(registry, tmp_path, ws, stages={"tab": {"tasks_per_step": 1}}, **quiet)
    summary = cycle.run_cycle(config, log=lambda line: None)
    lane = summary["completion"]
    assert lane["status"] == summary["status"] == "skipped" and "candidate" not in lane
    assert "no update" in lane["reason"] and len(registry.versions()) == 1
    assert cycle.load_state(tmp_path / "work")["tab_watermark"] > 0
    again: list[str] = []
    cycle.run_cycle(config, log=again.append)
    assert "0 logged suggestion(s)" in again[0]


def test_a_workspace_without_code_consent_is_refused_naming_the_setting(registry, tmp_path):
    import pytest

    from training.repo_files import RepoError

    open_db(tmp_path / "telemetry.db").conn.close()
    ws = make_workspace(tmp_path / "ws")
    with pytest.raises(RepoError, match="consent is 'metrics'"):
        cycle.run_cycle(_config(registry, tmp_path, ws, repo_consent="metrics"), log=print)


def test_a_watched_cycle_is_due_when_the_workspace_changed_enough(registry, tmp_path, capsys):
    from training.cycle.cli import _workspace_due

    ws = make_workspace(tmp_path / "ws")
    state = cycle.load_state(tmp_path / "work")
    assert "characters of" in _workspace_due(_config(registry, tmp_path, ws), state)
    assert _workspace_due(_config(registry, tmp_path, ws, min_repo_chars=10**9), state) == ""
    from tests.training.test_tab import logged_db

    logged_db(tmp_path / "telemetry.db", ws)  # 3 suggestions to learn from
    few = _config(registry, tmp_path, ws, min_repo_chars=10**9, min_tab_suggestions=3)
    assert _workspace_due(few, state) == "3 new suggestions logged with their outcome"
    gone = _config(registry, tmp_path, tmp_path / "missing")
    assert _workspace_due(gone, state) == "" and "does not exist" in capsys.readouterr().err
