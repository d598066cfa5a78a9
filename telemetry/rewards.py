"""Named, versioned reward functions over recorded signals, and their recomputation.

A reward function is pure: `fn(signals) -> float | None`, where `signals` is a plain dict (the
vocabulary below) and None means "no signal to judge by". Each has a name and an integer version;
a change of rule is a new version, never an edit of an old one, so stored rewards stay explainable
and `recompute()` can add the new version beside the old ones.

Training imports this module directly: `compute_reward("total", signals)` is the RL reward for a
rollout whose signals the harness collected; `signals_for_task(conn, task_id)` builds the same
dict from the database for real sessions.

Signals (all optional; a missing key means "unknown"):
  tests_before_passed/failed, tests_after_passed/failed   test counts around the change
  accepted            bool: the user kept the suggestion / the agent's edit (any hunk)
  accepted_share      float in [0, 1]: share of the proposal that was accepted
  survival            {after_s: share}: accepted characters still present after 30 s, 2 min, ...
  dissatisfied_followup, reverted   bool
  rating              -1 | 0 | +1 (explicit feedback)
  lint_before, lint_after           lint findings in the changed files
  final_message_chars int, final_message str: the agent's last answer
  tool_calls, tool_errors, invalid_tool_calls, repeated_tool_calls   counts over a task
  status              task status (done | failed | cancelled | limit | running)
  stop_reason         why the harness stopped the task (answered | max_steps | repeated_failure
                      | ...), None for tasks recorded before schema v3
  shown               bool: an inline suggestion was displayed (False: the model declined)

Worked example (values in tests/telemetry/test_rewards.py): a task whose tests went from 3 passed /
2 failed to 4 passed / 1 failed, one tool error in 4 calls, no repeats, lint 2 -> 1, a 300-char
answer: task_success@2 = 4/5 - 0 = 0.8, tool_errors@1 = -0.5*1/4 = -0.125, loops@1 = 0,
style@1 = +0.2, communication@1 = 1.0, so total@1 = 0.8 + 0.2*(-0.125) + 0.2*0.2 + 0.1*1.0 = 0.915.
task_success@3 scores the gap closed instead: 1 of the 2 failing tests fixed = 0.5, so
total@2 (the latest) = 0.5 - 0.025 + 0.04 + 0.1 = 0.615.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Signals = Mapping[str, Any]


@dataclass(frozen=True)
class RewardFunction:
    name: str
    version: int
    fn: Callable[[Signals], float | None]
    doc: str  # one line: what it rewards

    @property
    def key(self) -> str:
        return f"{self.name}@{self.version}"


def _clip(x: float, lo: float = -1.0, hi: float = 1.0) -> float:
    return max(lo, min(hi, x))


def _known(signals: Signals, *names: str) -> bool:
    return all(signals.get(n) is not None for n in names)


# --- the functions -----------------------------------------------------------------------------


def task_success_v1(s: Signals) -> float | None:
    """1 when all tests pass afterwards (or, without tests, the change was accepted), else 0."""
    if _known(s, "tests_after_passed", "tests_after_failed"):
        total = s["tests_after_passed"] + s["tests_after_failed"]
        if total > 0:
            return 1.0 if s["tests_after_failed"] == 0 else 0.0
    if s.get("accepted") is not None:
        return 1.0 if s["accepted"] else 0.0
    return None


def task_success_v2(s: Signals) -> float | None:
    """Share of tests passing afterwards, minus half the share of previously passing tests lost;
    without tests, the accepted share (or 1/0 for accepted)."""
    if _known(s, "tests_after_passed", "tests_after_failed"):
        after = s["tests_after_passed"] + s["tests_after_failed"]
        if after > 0:
            value = s["tests_after_passed"] / after
            before_passed = s.get("tests_before_passed") or 0
            if before_passed > 0:
                lost = max(0, before_passed - s["tests_after_passed"]) / before_passed
                value -= 0.5 * lost
            return _clip(value, 0.0, 1.0)
    if s.get("accepted_share") is not None:
        return _clip(float(s["accepted_share"]), 0.0, 1.0)
    if s.get("accepted") is not None:
        return 1.0 if s["accepted"] else 0.0
    return None


def task_success_v3(s: Signals) -> float | None:
    """How much of the gap the change closed, from the test counts before and after:
    1 when every test passes afterwards; else the share of previously failing tests now passing;
    negative (down to -1) for the share of previously passing tests lost. Unlike @2, tests that
    already passed earn nothing: a do-nothing change scores 0, not the pass share. Without the
    counts before (or with no failing test before and none lost), task_success@2's rule.

    >>> task_success_v3({"tests_before_passed": 2, "tests_before_failed": 2,
    ...                  "tests_after_passed": 3, "tests_after_failed": 1})
    0.5
    """
    if not _known(s, "tests_before_passed", "tests_before_failed", "tests_after_passed"):
        return task_success_v2(s)
    after_failed = s.get("tests_after_failed") or 0
    if s["tests_after_passed"] + after_failed == 0:
        return task_success_v2(s)
    before_passed, before_failed = s["tests_before_passed"], s["tests_before_failed"]
    gain = s["tests_after_passed"] - before_passed
    if gain < 0:
        return _clip(gain / max(before_passed, 1))
    if before_failed == 0:
        return task_success_v2(s)
    if after_failed == 0:
        return 1.0
    return _clip(gain / before_failed, 0.0, 1.0)


# Later checks say more about whether code was really kept.
_SURVIVAL_WEIGHTS = {30: 1.0, 120: 1.0, 300: 1.0, 600: 1.0, 900: 2.0}


def kept_code_v1(s: Signals) -> float | None:
    """Weighted mean share of accepted characters still present (weights 1,1,1,1,2 at
    30 s, 2, 5, 10, 15 min); None before the first check or when nothing was accepted."""
    survival = s.get("survival") or {}
    pairs = [
        (_SURVIVAL_WEIGHTS.get(int(k), 1.0), float(v)) for k, v in survival.items() if v is not None
    ]
    if not pairs:
        return None
    return sum(w * v for w, v in pairs) / sum(w for w, _ in pairs)


def dissatisfied_v1(s: Signals) -> float | None:
    """-1 after a dissatisfied follow-up, a revert or a thumbs-down; 0 when none happened."""
    flags = [s.get("dissatisfied_followup"), s.get("reverted")]
    rating = s.get("rating")
    if any(bool(f) for f in flags if f is not None) or rating == -1:
        return -1.0
    if any(f is not None for f in flags) or rating is not None:
        return 0.0
    return None


def style_v1(s: Signals) -> float | None:
    """Lint findings removed (+) or added (-) in the changed files, 5 findings = +-1."""
    if not _known(s, "lint_before", "lint_after"):
        return None
    return _clip(-(s["lint_after"] - s["lint_before"]) / 5.0)


def communication_v1(s: Signals) -> float | None:
    """The final answer: empty = -1; 40..1200 chars = 1; shorter scales up from 0, longer
    falls by 1 per 2000 extra chars (to -1); a single line over 600 chars loses 0.25."""
    chars = s.get("final_message_chars")
    if chars is None:
        return None
    if chars == 0:
        return -1.0
    if chars < 40:
        value = chars / 40
    elif chars <= 1200:
        value = 1.0
    else:
        value = _clip(1.0 - (chars - 1200) / 2000)
    text = s.get("final_message")
    if isinstance(text, str) and chars > 600 and "\n" not in text.strip():
        value -= 0.25
    return _clip(value)


def tool_errors_v1(s: Signals) -> float | None:
    """Penalty per tool call: -0.5 for each that failed, -1 for each invalid one (cap -1)."""
    calls = s.get("tool_calls")
    if calls is None:
        return None
    errors = s.get("tool_errors") or 0
    invalid = s.get("invalid_tool_calls") or 0
    return _clip(-(0.5 * errors + 1.0 * invalid) / max(calls, 1), -1.0, 0.0)


def loops_v1(s: Signals) -> float | None:
    """-1/3 for each tool call that repeats an earlier identical call (cap -1)."""
    repeated = s.get("repeated_tool_calls")
    if repeated is None:
        return None
    return _clip(-repeated / 3.0, -1.0, 0.0)


def loops_v2(s: Signals) -> float | None:
    """loops@1, and -1 when the harness stopped the task for repeating a failing call."""
    if s.get("stop_reason") == "repeated_failure":
        return -1.0
    return loops_v1(s)


# Components of total@1 and their weights. task_success@2 is the main term.
TOTAL_V1_WEIGHTS: dict[str, float] = {
    "task_success@2": 1.0,
    "kept_code@1": 0.5,
    "dissatisfied_followup@1": 0.5,
    "style@1": 0.2,
    "communication@1": 0.1,
    "tool_errors@1": 0.2,
    "loops@1": 0.3,
}


# total@2: the same weights, with task success measured against the tests before (@3) and
# loops that count a stop for repeated failure (@2).
TOTAL_V2_WEIGHTS: dict[str, float] = {
    **{k: v for k, v in TOTAL_V1_WEIGHTS.items() if k not in ("task_success@2", "loops@1")},
    "task_success@3": 1.0,
    "loops@2": 0.3,
}


TAB_REJECT_COST = 0.25  # tab@1: what a shown, rejected suggestion costs


def tab_v1(s: Signals) -> float | None:
    """Inline completion (Cursor Tab's rule): a declined request (`shown` False) is 0; a shown
    suggestion earns the larger of its accepted share and its kept share (survival at 5 minutes
    or later), or -TAB_REJECT_COST when neither is above 0. Showing then pays only when the
    chance of acceptance p satisfies p - (1 - p) * 0.25 > 0, i.e. p > 0.2; below that, staying
    silent is better. None without an outcome.

    >>> [tab_v1(x) for x in ({"shown": False}, {"shown": True, "accepted": True},
    ...  {"shown": True, "accepted": False}, {"shown": True, "accepted": True,
    ...  "accepted_share": 0.5})]
    [0.0, 1.0, -0.25, 0.5]
    """
    if s.get("shown") is False:
        return 0.0
    survival = s.get("survival") or {}
    kept = [float(v) for k, v in survival.items() if int(k) >= 300 and v is not None]
    if s.get("accepted") is None and not kept:
        return None
    share = s.get("accepted_share")
    if share is None:
        share = 1.0 if s.get("accepted") else 0.0
    value = max(float(share), max(kept, default=0.0))
    return value if value > 0 else -TAB_REJECT_COST


def tab_v2(s: Signals) -> float | None:
    """tab@1, except that an output the editor cannot show (`unfit`: it does not continue the
    cursor's line, e.g. it skips the line break a healed prompt left to it) costs what a rejected
    suggestion does. Under tab@1 such an output was silence, paid better than a rejection, and
    completion RL learnt to write it everywhere instead of suggesting.

    >>> [tab_v2(x) for x in ({"shown": False}, {"shown": False, "unfit": True})]
    [0.0, -0.25]
    """
    if s.get("unfit"):
        return -TAB_REJECT_COST
    return tab_v1(s)


def _weighted(weights: dict[str, float], s: Signals) -> float | None:
    values = {key: REWARDS[key].fn(s) for key in weights}
    known = {k: v for k, v in values.items() if v is not None}
    if not known:
        return None
    return sum(weights[k] * v for k, v in known.items())


def total_v1(s: Signals) -> float | None:
    """Weighted sum of the known components (TOTAL_V1_WEIGHTS); None if none is known."""
    return _weighted(TOTAL_V1_WEIGHTS, s)


def total_v2(s: Signals) -> float | None:
    """Weighted sum of the known components (TOTAL_V2_WEIGHTS); None if none is known."""
    return _weighted(TOTAL_V2_WEIGHTS, s)


REWARDS: dict[str, RewardFunction] = {
    f.key: f
    for f in [
        RewardFunction("task_success", 1, task_success_v1, "all tests pass / edit accepted"),
        RewardFunction("task_success", 2, task_success_v2, "test pass share minus regressions"),
        RewardFunction("task_success", 3, task_success_v3, "share of failing tests fixed"),
        RewardFunction("kept_code", 1, kept_code_v1, "accepted code still present later"),
        RewardFunction(
            "dissatisfied_followup", 1, dissatisfied_v1, "no revert/complaint/thumbs-down"
        ),
        RewardFunction("style", 1, style_v1, "lint findings removed in changed files"),
        RewardFunction("communication", 1, communication_v1, "length and shape of the answer"),
        RewardFunction("tool_errors", 1, tool_errors_v1, "penalty for failing/invalid tool calls"),
        RewardFunction("loops", 1, loops_v1, "penalty for repeating identical tool calls"),
        RewardFunction("loops", 2, loops_v2, "loops@1, or -1 when stopped for a repeated failure"),
        RewardFunction("total", 1, total_v1, "weighted sum of the above (TOTAL_V1_WEIGHTS)"),
        RewardFunction("total", 2, total_v2, "weighted sum (TOTAL_V2_WEIGHTS)"),
        RewardFunction(
            "tab", 1, tab_v1, "inline completion: accepted/kept +, rejected -, silent 0"
        ),
        RewardFunction("tab", 2, tab_v2, "tab@1, and an output that cannot be shown -"),
    ]
}


def get(name: str, version: int | None = None) -> RewardFunction:
    """The function `name` at `version` (latest when None); KeyError names what exists."""
    if "@" in name and version is None:
        name, v = name.split("@", 1)
        version = int(v)
    versions = sorted(f.version for f in REWARDS.values() if f.name == name)
    if not versions:
        raise KeyError(
            f"no reward function {name!r}; known: {sorted({f.name for f in REWARDS.values()})}"
        )
    version = versions[-1] if version is None else version
    key = f"{name}@{version}"
    if key not in REWARDS:
        raise KeyError(f"no version {version} of {name!r}; known: {versions}")
    return REWARDS[key]


def latest() -> list[RewardFunction]:
    """The newest version of every reward function."""
    best: dict[str, RewardFunction] = {}
    for f in REWARDS.values():
        if f.name not in best or f.version > best[f.name].version:
            best[f.name] = f
    return list(best.values())


def compute_reward(name: str, signals: Signals, version: int | None = None) -> float | None:
    """The reward `name` (e.g. "total", "task_success@1") for a dict of signals."""
    return get(name, version).fn(signals)


# --- signals from the database -----------------------------------------------------------------


def signals_for_task(conn: sqlite3.Connection, task_id: str) -> dict[str, Any]:
    """Everything recorded about one agent task, as a signals dict."""
    s: dict[str, Any] = {}
    task = conn.execute(
        "SELECT status, final_message, final_message_chars, stop_reason FROM tasks WHERE id = ?",
        (task_id,),
    ).fetchone()
    if task is None:
        return s
    s["status"], final_message, s["final_message_chars"], s["stop_reason"] = task
    if final_message is not None:
        s["final_message"] = final_message
    _add_outcome(conn, s, "task_id", task_id)
    hunks = conn.execute(
        "SELECT h.outcome, COUNT(*) FROM hunks h JOIN edits e ON h.edit_id = e.id "
        "WHERE e.task_id = ? GROUP BY h.outcome",
        (task_id,),
    ).fetchall()
    by = dict(hunks)
    decided = by.get("accepted", 0) + by.get("rejected", 0) + by.get("reverted", 0)
    if decided:
        s["accepted"] = by.get("accepted", 0) > 0
        s["accepted_share"] = by.get("accepted", 0) / decided
    calls = errors = invalid = repeated = 0
    seen: set[str] = set()
    for role, tool_calls, call_hash, is_error, is_invalid in conn.execute(
        "SELECT role, tool_calls, tool_calls_hash, is_error, invalid FROM steps "
        "WHERE task_id = ? ORDER BY idx",
        (task_id,),
    ):
        if role == "assistant" and call_hash is not None:
            n = 1
            if tool_calls:
                try:
                    n = max(1, len(json.loads(tool_calls)))
                except ValueError:
                    n = 1
            calls += n
            if call_hash in seen:
                repeated += n
            seen.add(call_hash)
        if role == "tool" and is_error:
            errors += 1
        invalid += int(bool(is_invalid))
    s.update(tool_calls=calls, tool_errors=errors, invalid_tool_calls=invalid)
    s["repeated_tool_calls"] = repeated
    _add_rating(conn, s, "task_id", task_id)
    return s


def signals_for_suggestion(conn: sqlite3.Connection, suggestion_id: str) -> dict[str, Any]:
    """Everything recorded about one suggestion (inline, next edit, apply), as a signals dict."""
    s: dict[str, Any] = {}
    row = conn.execute(
        "SELECT output_chars FROM suggestions WHERE id = ?", (suggestion_id,)
    ).fetchone()
    if row is None:
        return s
    output_chars = row[0]
    events = conn.execute(
        "SELECT event, accepted_chars FROM suggestion_events WHERE suggestion_id = ? ORDER BY at",
        (suggestion_id,),
    ).fetchall()
    for event, accepted_chars in events:
        if event == "shown":
            s["shown"] = True
        elif event == "accepted":
            s["accepted"], s["accepted_share"] = True, 1.0
        elif event == "partially_accepted":
            s["accepted"] = True
            if accepted_chars is not None and output_chars:
                s["accepted_share"] = min(1.0, accepted_chars / output_chars)
        elif event in ("rejected", "ignored") and "accepted" not in s:
            s["accepted"], s["accepted_share"] = False, 0.0
    survival = conn.execute(
        "SELECT after_s, share FROM survival WHERE suggestion_id = ? AND share IS NOT NULL",
        (suggestion_id,),
    ).fetchall()
    if survival:
        s["survival"] = {int(a): float(v) for a, v in survival}
    _add_outcome(conn, s, "suggestion_id", suggestion_id)
    _add_rating(conn, s, "suggestion_id", suggestion_id)
    return s


_OUTCOME_COLUMNS = (
    "tests_before_passed",
    "tests_before_failed",
    "tests_after_passed",
    "tests_after_failed",
    "lint_before",
    "lint_after",
    "reverted",
    "dissatisfied_followup",
)


def _add_outcome(conn: sqlite3.Connection, s: dict[str, Any], column: str, value: str) -> None:
    """Latest known value of each outcome column (outcomes can arrive in pieces)."""
    rows = conn.execute(
        f"SELECT {', '.join(_OUTCOME_COLUMNS)} FROM outcomes WHERE {column} = ? ORDER BY at",
        (value,),
    ).fetchall()
    for row in rows:
        for name, v in zip(_OUTCOME_COLUMNS, row, strict=True):
            if v is not None:
                s[name] = bool(v) if name in ("reverted", "dissatisfied_followup") else v


def _add_rating(conn: sqlite3.Connection, s: dict[str, Any], column: str, value: str) -> None:
    row = conn.execute(
        f"SELECT rating FROM feedback WHERE {column} = ? AND rating IS NOT NULL "
        "ORDER BY at DESC LIMIT 1",
        (value,),
    ).fetchone()
    if row is not None:
        s["rating"] = int(row[0])


# --- storing and recomputing ---------------------------------------------------------------------


@dataclass
class RecomputeReport:
    subjects: int = 0  # tasks + suggestions visited
    rows: int = 0  # reward rows written (inserted or refreshed)
    functions: tuple[str, ...] = ()


def recompute(
    conn: sqlite3.Connection,
    functions: list[RewardFunction] | None = None,
    *,
    batch: int = 500,
    task_ids: list[str] | None = None,
) -> RecomputeReport:
    """Compute `functions` (default: every version of every function) for every task and
    suggestion — or only for the tasks in `task_ids` — and upsert them into `rewards`. Other
    versions' rows are left as they are."""
    from telemetry import store

    functions = functions if functions is not None else list(REWARDS.values())
    report = RecomputeReport(functions=tuple(f.key for f in functions))
    if task_ids is not None:
        marks = ",".join("?" * len(task_ids))
        subjects = [
            ("task", sid, session)
            for sid, session in conn.execute(
                f"SELECT id, session_id FROM tasks WHERE id IN ({marks})", task_ids
            ).fetchall()
        ]
    else:
        subjects = [
            ("task", sid, session)
            for sid, session in conn.execute("SELECT id, session_id FROM tasks").fetchall()
        ] + [
            ("suggestion", sid, session)
            for sid, session in conn.execute("SELECT id, session_id FROM suggestions").fetchall()
        ]
    now = time.time()
    for start in range(0, len(subjects), batch):
        rows = []
        for kind, subject_id, session_id in subjects[start : start + batch]:
            signals = (
                signals_for_task(conn, subject_id)
                if kind == "task"
                else signals_for_suggestion(conn, subject_id)
            )
            for f in functions:
                rows.append(
                    (
                        f"{kind}:{subject_id}:{f.key}",
                        session_id,
                        kind,
                        subject_id,
                        f.name,
                        f.version,
                        f.fn(signals),
                        now,
                    )
                )
        with store.write_transaction(conn):
            conn.executemany(
                "INSERT INTO rewards (id, session_id, subject_kind, subject_id, function, version,"
                " value, computed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE"
                " SET value = excluded.value, computed_at = excluded.computed_at",
                rows,
            )
        report.rows += len(rows)
    report.subjects = len(subjects)
    return report
