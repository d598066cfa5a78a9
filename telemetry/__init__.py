"""Telemetry: every session logged to SQLite as task and reward data, safely.

What it is. One SQLite file per user (default `$XDG_DATA_HOME/flywheel/telemetry.db`) holding
sessions, suggestions and their lifecycle, agent tasks and steps (messages, tool calls, token ids
and sampling logprobs), edits and hunks, outcomes, survival of accepted code, feedback, rewards,
compressed code snapshots, model versions and training runs. Modules, by role:

  folders.py      per-user folders (XDG) and the database's path for command lines
  store.py        schema as ordered, recorded migrations; opening the file (WAL, busy timeout)
  events.py       the vocabulary: each event kind's table, fields, code fields, enumerated values
  recorder.py     Recorder: enqueue-and-return events, one writer thread committing in batches
  row_builder.py  an event -> the row stored: cleaned, redacted, stripped per the privacy policy
  inserts.py      a batch's inserts, held and sent with one executemany per statement
  privacy.py      consent levels, exclusion globs, cleaning, forget
  redaction.py    secret shapes and high-entropy tokens -> `[REDACTED:<kind>]`
  rewards.py      named, versioned, pure reward functions; signals from the database; recompute
  acceptance.py   inline suggestions as outcomes (shown, accepted, declined, kept) and their
                  scores, for real and simulated users alike
  queries.py      the reads that the dashboard, the cycle and the demo make of the tables
  exports.py      pretrain / SFT / RL-task / benchmark JSONL with a manifest; idempotent import
  cli.py          `flywheel telemetry stats | export | import | forget | rewards | path`

How to use it (language server, harness):

    from telemetry import PrivacyPolicy, Recorder
    rec = Recorder(db_path, PrivacyPolicy(consent="code"))   # "off" | "metrics" | "code"
    sid = rec.record("session_start", editor="nvim", plugin_version="0.1.0",
                     workspace_id=workspace_id(root), git_head=head)
    tid = rec.record("task_start", session_id=sid, instruction=text,
                     workspace_files={"a.py": "..."}, verify_command="pytest -q")
    rec.record("step", session_id=sid, task_id=tid, idx=0, role="assistant", content="...",
               tool_calls=[{"id": "c1", "name": "read", "arguments": {"path": "a.py"}}],
               token_ids=[...], logprobs=[...])
    rec.record("task_end", session_id=sid, task_id=tid, status="done", final_message="...",
               stop_reason="answered", stop_detail="", diff=unified_diff_text)
    rec.close()

`record(kind, **fields)` takes one of the kinds in `EVENTS` (events.py lists each kind's table,
fields, which fields are code, and enumerated values), returns the event's id, or None when it
refused the event (logged once per reason, counted in `stats()`). It never raises and never
blocks on the database; `flush()` waits until everything before it is durable.

Training uses `compute_reward(name, signals)`, `signals_for_task(conn, id)` and the export files;
`open_db(path)` gives a migrated `sqlite_utils.Database` for reading.

What it deliberately does not do. It reads no environment variables (the command line resolves
the path); it never sends anything anywhere (exports are files the user moves); it does not decide
when a follow-up is dissatisfied or a check of survival is due — the language server and the
harness record those facts, and rewards.py turns them into numbers. Redaction is a safety net, not
a guarantee: consent `metrics` and the exclusion globs are the ways to keep code out entirely.
"""

from telemetry.events import EVENTS
from telemetry.exports import export, import_export, is_held_out
from telemetry.privacy import PrivacyPolicy, forget, workspace_id
from telemetry.recorder import Recorder
from telemetry.redaction import redact
from telemetry.rewards import (
    REWARDS,
    compute_reward,
    recompute,
    signals_for_suggestion,
    signals_for_task,
)
from telemetry.store import SCHEMA_VERSION, open_db

__all__ = [
    "EVENTS",
    "REWARDS",
    "SCHEMA_VERSION",
    "PrivacyPolicy",
    "Recorder",
    "compute_reward",
    "export",
    "forget",
    "import_export",
    "is_held_out",
    "open_db",
    "recompute",
    "redact",
    "signals_for_suggestion",
    "signals_for_task",
    "workspace_id",
]
