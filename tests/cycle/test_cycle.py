"""`flywheel cycle`: logged sessions -> a trained, benchmarked, gated candidate that a
running server picks up; one cycle at a time; clear messages when there is nothing to do."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx

from tests.cycle.conftest import record_sessions
from tests.flywheel_server import running_server
from training import cycle
from training.cycle import CycleBusy, cycle_lock, due

MODULES = {"cycle": "training.cycle", "models": "agent.models_cli"}


def flywheel(command: str, *args: str) -> subprocess.CompletedProcess:
    """`flywheel COMMAND ARGS` once agent/cli.py lists it; `python -m MODULE ARGS` until then."""
    from agent.cli import COMMANDS

    head = ["agent.cli", command] if command in COMMANDS else [MODULES[command]]
    return subprocess.run(
        [sys.executable, "-m", *head, *args], capture_output=True, text=True, timeout=600
    )


def quick_cycle(registry_root: Path, db: Path, work: Path, *extra: str):
    """`flywheel cycle --quick` on every session (none held out), scored on four tasks."""
    return flywheel(
        "cycle",
        "--quick",
        "--registry",
        str(registry_root),
        "--telemetry-db",
        str(db),
        "--work",
        str(work),
        "--held-out-percent",
        "0",
        "--bench-projects",
        "1",
        "--bench-tasks",
        "4",
        *extra,
    )


def version_and_ids(url: str) -> tuple[str, list[int], list[float]]:
    """The serving version, a seeded sample's token ids and their logprobs (which tell two sets of
    weights apart even when a short sample happens to come out the same)."""
    body = {
        "prompt": "def add(a, b):",
        "max_tokens": 6,
        "temperature": 1.0,
        "seed": 0,
        "return_token_ids": True,
        "logprobs": 1,
    }
    answer = httpx.post(url + "/v1/completions", json=body, timeout=60).json()
    choice = answer["choices"][0]
    return answer["system_fingerprint"], choice["token_ids"], choice["logprobs"]["token_logprobs"]


def test_cycle_trains_gates_promotes_and_the_server_follows(registry, tiny_checkpoint, tmp_path):
    db = tmp_path / "telemetry.db"
    record_sessions(db, 3)
    v1 = registry.add(tiny_checkpoint)
    registry.promote(v1, forced=True)
    flags = ("--registry", str(registry.root), "--reload-interval", "600")
    with running_server("registry", *flags) as url:
        before = version_and_ids(url)
        assert before[0] == v1
        done = quick_cycle(registry.root, db, tmp_path / "work")
        assert done.returncode == 0, done.stdout + done.stderr
        candidate = registry.promoted()
        assert candidate != v1 and f"{candidate} promoted" in done.stdout
        after = version_and_ids(url)
        assert after[0] == candidate and after[1:] != before[1:]  # new weights, next request
        assert flywheel("models", "--registry", str(registry.root), "rollback").returncode == 0
        assert version_and_ids(url) == before

    record = registry.get(candidate)
    assert record["parent"] == v1 and set(record["recipe"]) == {"sft", "mtp"}
    assert record["data"]["new_trajectories"] == 3 and record["reward"].startswith("total@")
    assert record["gate"][-1]["accepted"]
    assert not record["benchmarks"][0]["provisional"]
    # the real benchmark, pass@1 and oracle_logprob per task
    (result,) = registry.benchmarks(candidate)
    assert result["format"] == "flywheel-benchmark/1" and not result["provisional"]
    assert set(result["metrics"]) == {"pass@1", "oracle_logprob"}
    assert all("oracle_logprob" in t["scores"] for t in result["tasks"])
    assert {r["task_set"] for r in registry.benchmarks(v1)} == {result["task_set"]}
    assert (registry.verify(candidate) / "mtp" / "model.safetensors").exists()
    conn = sqlite3.connect(db)
    runs = dict(conn.execute("SELECT stage, status FROM training_runs").fetchall())
    assert runs["cycle"] == "promoted" and runs["sft"] == "done" and runs["mtp"] == "done"
    (metrics,) = conn.execute("SELECT metrics FROM model_versions WHERE id = ?", (candidate,))
    assert "oracle_logprob" in json.loads(metrics[0])["benchmark"]

    # Nothing new since: the next cycle says so and trains nothing.
    again = quick_cycle(registry.root, db, tmp_path / "work")
    assert again.returncode == 0 and "0 new session(s)" in again.stdout
    assert registry.promoted() == v1 and len(registry.versions()) == 2


def test_two_cycles_at_once_one_is_refused(registry, tmp_path, capsys):
    db = tmp_path / "telemetry.db"
    args = [
        "--registry",
        str(registry.root),
        "--telemetry-db",
        str(db),
        "--work",
        str(tmp_path / "w"),
    ]
    with cycle_lock(registry.root):
        assert cycle.main(args) == 3
        err = capsys.readouterr().err
        assert "another flywheel cycle is running" in err and "pid" in err
        try:
            with cycle_lock(registry.root):
                raise AssertionError("the lock was taken twice")
        except CycleBusy:
            pass
    assert cycle.main(args) == 2  # the lock is free again; now the missing database is named
    assert "no telemetry database at" in capsys.readouterr().err


def test_an_empty_telemetry_database_is_a_clear_skip(registry, tmp_path, capsys):
    from telemetry import open_db

    db = tmp_path / "empty.db"
    open_db(db).conn.close()
    args = ["--registry", str(registry.root), "--telemetry-db", str(db), "--work", str(tmp_path)]
    assert cycle.main(args) == 0
    assert "has no sessions yet" in capsys.readouterr().out
    assert not registry.exists()


def test_when_a_watched_cycle_is_due():
    state = {"last_at": 1000.0}
    assert due(state, 5, 1001.0, min_sessions=5, period_s=3600) == "5 new session(s) (>= 5)"
    assert due(state, 4, 1001.0, min_sessions=5, period_s=3600) == ""
    assert due(state, 1, 4600.0, min_sessions=5, period_s=3600).startswith("3600 s since")
    assert due(state, 0, 9999.0, min_sessions=5, period_s=3600) == ""  # nothing new to learn


def test_a_cycle_runs_rl_on_the_tasks_its_sessions_yield(registry, tiny_checkpoint, tmp_path):
    """Logged tasks that replay (tests fail at the start, pass after the recorded
    change) are the RL stage's pool; the summary says how many the logs yielded and why the
    others were dropped. The tiny random model solves nothing and its samples score alike, so
    the RL run finds no learning signal, and the cycle registers no candidate rather than one
    identical to its parent."""
    db = tmp_path / "telemetry.db"
    record_sessions(db, 3, diff=True)
    record_sessions(db, 1, seed=5)  # ends without a recorded change: dropped, with its reason
    v1 = registry.add(tiny_checkpoint)
    registry.promote(v1, forced=True)
    config = cycle.CycleConfig(
        registry=str(registry.root),
        telemetry_db=str(db),
        work=str(tmp_path / "work"),
        quick=True,
        min_trajectories=100,  # no SFT stage: only RL would train
        min_rl_tasks=3,
        held_out_percent=0,
    )
    lines: list[str] = []
    summary = cycle.run_cycle(config, log=lines.append)
    assert summary["data"]["rl_tasks"] == {
        "logged_tasks": 4,
        "replayed": 3,
        "new": 3,
        "synthetic": 0,
        "dropped": {"no_change": 1},
    }
    assert "RL tasks: 3 of 4 logged tasks replay (3 new)" in lines
    assert any("dropped 1: the task did not end with an answer and a change" in x for x in lines)
    assert summary["status"] == "skipped" and "no learning signal" in summary["reason"]
    assert "candidate" not in summary and [v["id"] for v in registry.versions()] == [v1]
    # the RL run did roll out the mined tasks, in the harness, and recorded itself
    (run,) = (tmp_path / "work").glob("cycle-*/rl")
    state = json.loads((run / "checkpoints" / "step_0000000" / "state.json").read_text())
    pool = [json.loads(x) for x in (run.parent / "rl_tasks.jsonl").read_text().splitlines()]
    assert len(pool) == 3 and all(t["workspace"] and t["reference_diff"] for t in pool)
    assert state["jobs"] >= 2 and state["step"] == 0
    assert any(x.startswith("stopping early at step 0: the last 2 groups") for x in lines)
    runs = dict(sqlite3.connect(db).execute("SELECT stage, status FROM training_runs").fetchall())
    assert runs["rl"] == "done" and runs["cycle"] == "skipped"


def test_the_cycles_rl_recipe_updates_the_model_on_tasks_mined_from_sessions(
    tmp_path, stopping_checkpoint
):
    """The CPU path of the cycle's RL stage, the same code as the GPU run: sessions logged with
    their changes are mined into RL tasks, and recipes/cycle/rl.toml (its sizes shrunk to
    seconds) makes an update on them with a tiny model whose samples differ in length, so their
    rewards differ (communication, effort) and the update has a signal."""
    from telemetry import export
    from training.cycle.rl import rl_pool, train_rl_stage
    from training.rl import load_rl_recipe

    db = tmp_path / "telemetry.db"
    record_sessions(db, 3, diff=True)
    export(str(db), tmp_path / "export", held_out_percent=0)
    lines: list[str] = []
    pool, summary, mined = rl_pool(tmp_path, tmp_path / "export", set(), 0, lines.append)
    assert summary["new"] == 3 and len(mined) == 3
    shrunk = dict(max_turns=1, max_tokens=12, steps=1, rollout_wall_s=60.0)
    recipe = load_rl_recipe(
        cycle.RECIPES / "rl.toml",
        dict(name="c-rl", init=str(stopping_checkpoint), out=str(tmp_path / "rl"), tasks=str(pool))
        | shrunk,
    )
    model, updates = train_rl_stage(recipe, progress=False, log=lines.append)
    assert updates == 1, lines
    assert json.loads((model / "flywheel.json").read_text())["version"] == "c-rl@rl1"
    records = [json.loads(x) for x in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    (update,) = [r for r in records if r["kind"] == "train"]
    assert update["trained_trajectories"] >= 2 and update["skipped"] == 0.0
