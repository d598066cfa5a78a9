"""Exports and import: manifest with counts and hashes, SFT in chat format
above a reward threshold, RL tasks, a held-out split that never leaks, idempotent merge."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from telemetry import PrivacyPolicy, Recorder, export, import_export, is_held_out
from telemetry.exports import ExportError
from tests.telemetry.conftest import count, record_session


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _held_out_and_kept(n: int = 40, percent: float = 25) -> tuple[list[str], list[str]]:
    ids = [f"session-{i}" for i in range(n)]
    held = [i for i in ids if is_held_out(i, percent)]
    return held, [i for i in ids if i not in held]


@pytest.fixture
def populated(db_path: Path) -> dict[str, str]:
    """good (passes tests), bad (fails), held (passes, but held out), metrics (no code)."""
    held, kept = _held_out_and_kept()  # held[0] is held out at 25 %, kept[i] are not
    ids: dict[str, str] = {}
    with Recorder(db_path) as rec:
        for name, sid, tests in (
            ("good", kept[0], (4, 0)),
            ("bad", kept[1], (0, 4)),
            ("held", held[0], (4, 0)),
        ):
            ids[name] = record_session(
                rec, f"MARK{name.upper()}", session_id=sid, tests_after=tests
            )["task"]
    with Recorder(db_path, PrivacyPolicy(consent="metrics")) as rec:
        ids["metrics"] = record_session(rec, "MARKMETRICS", session_id=kept[2])["task"]
    return ids


def test_export_writes_every_file_with_a_truthful_manifest(
    populated, db_path: Path, tmp_path: Path
):
    out = tmp_path / "export"
    report = export(db_path, out, held_out_percent=25, min_reward=0.5)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest == report.manifest
    assert manifest["reward"] == {"function": "total", "version": 2, "min": 0.5}
    assert manifest["sessions"] == 4 and manifest["held_out"]["sessions"] == 1
    for name, info in manifest["files"].items():
        data = (out / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == info["sha256"]
        assert len(data) == info["bytes"]
        assert len(data.splitlines()) == info["count"]
    counts = report.counts()
    assert counts["sft.jsonl"] == 1  # only "good": "bad" is under the threshold, "held" held out
    assert counts["rl_tasks.jsonl"] == 2  # good and bad are both verifiable tasks
    assert counts["benchmark.jsonl"] == 1


def test_sft_is_openai_chat_format_with_tool_calls(populated, db_path: Path, tmp_path: Path):
    export(db_path, tmp_path / "e", held_out_percent=25)
    (record,) = _lines(tmp_path / "e" / "sft.jsonl")
    assert record["id"] == populated["good"]
    assert record["reward_function"] == "total@2" and record["reward"] >= 0.5
    assert record["stop_reason"] == "answered"  # why the recorded run ended (schema v3)
    messages = record["messages"]
    assert [m["role"] for m in messages] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    call = messages[1]["tool_calls"][0]
    assert call["type"] == "function" and call["id"] == "c1"
    assert call["function"]["name"] == "read_file"
    assert json.loads(call["function"]["arguments"]) == {"path": "app/main.py"}
    assert messages[2]["tool_call_id"] == "c1" and "MARKGOOD" in messages[2]["content"]


def test_rl_tasks_carry_instruction_workspace_and_verify(populated, db_path: Path, tmp_path: Path):
    export(db_path, tmp_path / "e", held_out_percent=25)
    tasks = {t["id"]: t for t in _lines(tmp_path / "e" / "rl_tasks.jsonl")}
    task = tasks[populated["good"]]
    assert task["verify"] == "pytest -q tests"
    assert "MARKGOOD instruction" in task["instruction"]
    assert set(task["workspace"]) == {"app/main.py", "tests/test_main.py"}
    # the recorded run answered: its final diff comes along as a reference, never in the prompt
    assert task["stop_reason"] == "answered"
    assert task["reference_diff"].startswith("--- a/app/main.py\n")
    assert "+    return 'MARKGOOD'" in task["reference_diff"]


def test_held_out_sessions_never_reach_training_files(populated, db_path: Path, tmp_path: Path):
    out = tmp_path / "e"
    export(db_path, out, held_out_percent=25)
    training = "".join(
        (out / n).read_text() for n in ("pretrain.jsonl", "sft.jsonl", "rl_tasks.jsonl")
    )
    assert "MARKHELD" not in training and "markheld" not in training
    assert populated["held"] not in training
    (bench,) = _lines(out / "benchmark.jsonl")
    assert bench["id"] == populated["held"] and "MARKHELD" in bench["instruction"]
    assert "MARKGOOD" in training
    # metrics-consent sessions contribute no code to any training file
    assert "MARKMETRICS" not in training


def test_the_split_is_deterministic_and_about_the_asked_share():
    ids = [f"s{i}" for i in range(2000)]
    first = [i for i in ids if is_held_out(i, 10)]
    assert first == [i for i in ids if is_held_out(i, 10)]
    assert 150 < len(first) < 250
    assert not any(is_held_out(i, 0) for i in ids) and all(is_held_out(i, 100) for i in ids)
    assert first != [i for i in ids if is_held_out(i, 10, salt="other")]


def test_pretrain_corpus_is_deduplicated(populated, db_path: Path, tmp_path: Path):
    export(db_path, tmp_path / "e", held_out_percent=25)
    docs = _lines(tmp_path / "e" / "pretrain.jsonl")
    digests = [d["id"] for d in docs]
    assert len(digests) == len(set(digests))
    for d in docs:
        assert hashlib.sha256(d["text"].encode()).hexdigest() == d["id"]
    # good + bad sessions: file snapshot == workspace app/main.py (deduplicated), plus the tests
    assert len(docs) == 4


def test_import_merges_users_idempotently(tmp_path: Path):
    users = []
    for n in range(2):
        path = tmp_path / f"user{n}.db"
        with Recorder(path) as rec:
            record_session(rec, f"USER{n}")
        export(path, tmp_path / f"export{n}", held_out_percent=0)
        users.append(tmp_path / f"export{n}")
    team = tmp_path / "team.db"
    first = import_export(team, users[0])
    assert first.total_inserted > 20 and first.skipped == 0 and first.rejected == 0
    second = import_export(team, users[1])
    assert second.total_inserted == first.total_inserted
    before = count(team, "SELECT COUNT(*) FROM steps")
    again = import_export(team, users[0])
    assert again.total_inserted == 0 and again.skipped == first.total_inserted
    assert count(team, "SELECT COUNT(*) FROM steps") == before == 12
    assert count(team, "SELECT COUNT(*) FROM sessions") == 2
    # and the merged store exports both users' work
    out = export(team, tmp_path / "team-export", held_out_percent=0, min_reward=0.5)
    assert out.counts()["sft.jsonl"] == 2
    sft = (tmp_path / "team-export" / "sft.jsonl").read_text()
    assert "USER0" in sft and "USER1" in sft


def test_import_refuses_a_tampered_or_foreign_folder(populated, db_path: Path, tmp_path: Path):
    out = tmp_path / "e"
    export(db_path, out, held_out_percent=25)
    with (out / "sessions.jsonl").open("a") as f:
        f.write(json.dumps({"table": "sessions", "row": {"id": "evil"}}) + "\n")
    with pytest.raises(ExportError, match="does not match its sha256"):
        import_export(tmp_path / "t.db", out)
    with pytest.raises(ExportError, match="no manifest"):
        import_export(tmp_path / "t.db", tmp_path)
