"""Benchmark: the telemetry recorder against a naive synchronous insert per event.

What it measures, on this machine, in one run:
  naive      each event is cleaned, redacted and inserted with its own commit on the caller's
             thread (sqlite-utils insert, WAL, synchronous=NORMAL): the baseline
  burst      Recorder.record() as fast as the caller can go, then flush(): events/s until every
             event is durable, and the caller's per-call enqueue latency
  paced      Recorder.record() at a fixed rate (default 5,000 events/s) for a few seconds, as an
             editor would: the rate at which events become durable while that rate is offered,
             the writer's backlog sampled every 50 ms, the time flush() needs after the last
             event, and the caller's enqueue latency while the writer works in parallel

For the recorder modes it also reads the writer thread's own CPU time, so the writer's cost per
event (and its capacity on one free core) can be told apart from the machine's load: on a
shared, busy machine the wall-clock rates are lower than the writer could do alone.

Events are a realistic mix: agent steps with ~300 chars of text and a tool call, inline
suggestions with ~600 chars of code context, suggestion lifecycle events, survival checks.
The targets: >= 5,000 events/s sustained, enqueue p99 < 1 ms on the caller's thread.
"Sustained" is checked in the paced mode: offered 5,000 events/s, the durable rate over the whole
run (first record() to flush() returning) is at least 99% of 5,000/s, and the writer keeps up
(its backlog, sampled every 50 ms, never holds 0.5 s of events). The burst mode and the writer's
CPU per event show the headroom above that.

    .venv/bin/python benchmarks/telemetry_recorder.py [--events 20000] [--rate 5000]
        [--seconds 10] [--repeat 3] [--json benchmarks/results/telemetry_recorder.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import sqlite_utils

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script too

from benchmarks.record import machine, write_json  # noqa: E402
from telemetry import Recorder, privacy, store  # noqa: E402

CODE = (
    "def load_config(path: str) -> dict:\n"
    '    """Read the YAML config and apply defaults."""\n'
    "    with open(path) as f:\n"
    "        data = yaml.safe_load(f) or {}\n"
    "    for key, value in DEFAULTS.items():\n"
    "        data.setdefault(key, value)\n"
    "    return data\n"
)


def make_events(rec_session: str, task: str, n: int) -> list[tuple[str, dict[str, Any]]]:
    """n events cycling through four realistic kinds (the ids are filled in as they go)."""
    events: list[tuple[str, dict[str, Any]]] = []
    for i in range(n):
        k = i % 4
        if k == 0:
            events.append(
                (
                    "step",
                    dict(
                        session_id=rec_session,
                        task_id=task,
                        idx=i,
                        role="assistant",
                        content=f"Step {i}: reading the config loader to find the bug. " * 5,
                        tool_calls=[
                            {"id": f"c{i}", "name": "read_file", "arguments": {"path": "cfg.py"}}
                        ],
                        duration_ms=120.0,
                        output_tokens=64,
                    ),
                )
            )
        elif k == 1:
            events.append(
                (
                    "suggestion",
                    dict(
                        session_id=rec_session,
                        kind="inline",
                        trigger="typing",
                        document_uri="file:///work/app/config.py",
                        document_version=i,
                        language="python",
                        context={"prefix": CODE * 2, "suffix": CODE[:120]},
                        output=CODE[:80],
                        latency_ms=35.0,
                        drafts_proposed=8,
                        drafts_accepted=6,
                    ),
                )
            )
        elif k == 2:
            events.append(
                (
                    "suggestion_event",
                    dict(session_id=rec_session, suggestion_id=f"s{i}", event="shown"),
                )
            )
        else:
            events.append(
                (
                    "survival",
                    dict(
                        session_id=rec_session,
                        suggestion_id=f"s{i}",
                        after_s=30,
                        accepted_chars=80,
                        surviving_chars=72,
                    ),
                )
            )
    return events


def percentiles(ns: list[int]) -> dict[str, float]:
    """Latencies in microseconds."""
    s = sorted(ns)

    def at(q: float) -> float:
        return s[min(len(s) - 1, int(q * len(s)))] / 1000

    return {"p50_us": at(0.50), "p99_us": at(0.99), "max_us": s[-1] / 1000}


def run_naive(folder: Path, n: int) -> dict[str, Any]:
    """The baseline: clean + redact + one INSERT and COMMIT per event on the caller's thread."""
    path = folder / "naive.db"
    db = store.open_db(path)
    conn = db.conn
    conn.execute("INSERT INTO sessions (id, started_at, consent) VALUES ('s', 0, 'code')")
    naive = sqlite_utils.Database(sqlite3.connect(path), execute_plugins=False)
    naive.execute("PRAGMA journal_mode=WAL")
    naive.execute("PRAGMA synchronous=NORMAL")
    events = make_events("s", "t", n)
    lat: list[int] = []
    start = time.perf_counter()
    for i, (kind, fields) in enumerate(events):
        t0 = time.perf_counter_ns()
        table = {"step": "steps", "suggestion": "suggestions"}.get(kind, "suggestion_events")
        row: dict[str, Any] = {"id": f"e{i}", "session_id": "s"}
        if kind == "step":
            row.update(
                task_id="t",
                idx=i,
                at=time.time(),
                role="assistant",
                content=privacy.clean_code(fields["content"], privacy.MAX_CODE_CHARS),
                tool_calls=privacy.clean_code(json.dumps(fields["tool_calls"]), 10**6),
            )
        elif kind == "suggestion":
            row.update(
                created_at=time.time(),
                kind="inline",
                context=privacy.clean_code(json.dumps(fields["context"]), privacy.MAX_CODE_CHARS),
                output=privacy.clean_code(fields["output"], privacy.MAX_CODE_CHARS),
            )
        else:
            row.update(suggestion_id=f"s{i}", at=time.time(), event="shown")
        naive[table].insert(row)  # autocommits: one transaction per event
        lat.append(time.perf_counter_ns() - t0)
    elapsed = time.perf_counter() - start
    naive.conn.close()
    conn.close()
    return {"events": n, "seconds": elapsed, "events_per_s": n / elapsed, **percentiles(lat)}


def _writer_cpu_s(rec: Recorder) -> float:
    """CPU seconds the writer thread has used so far (Linux: its own clock; else NaN)."""
    thread = rec._thread
    try:
        assert isinstance(thread, threading.Thread) and thread.ident is not None
        return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    except (AttributeError, AssertionError, OSError):
        return float("nan")


def _writer_figures(cpu_s: float, events: int, wall_s: float) -> dict[str, float]:
    return {
        "writer_cpu_us_per_event": cpu_s / events * 1e6,
        "writer_capacity_per_s": events / cpu_s if cpu_s > 0 else float("nan"),
        "writer_busy_share": cpu_s / wall_s,
    }


def _recorder(folder: Path, name: str) -> tuple[Recorder, str, str]:
    rec = Recorder(folder / f"{name}.db")
    sid = rec.record("session_start", editor="bench")
    task = rec.record("task_start", session_id=sid, instruction="benchmark")
    assert sid and task and rec.flush()
    return rec, sid, task


def run_burst(folder: Path, n: int) -> dict[str, Any]:
    rec, sid, task = _recorder(folder, "burst")
    events = make_events(sid, task, n)
    lat: list[int] = []
    cpu0 = _writer_cpu_s(rec)
    start = time.perf_counter()
    for kind, fields in events:
        t0 = time.perf_counter_ns()
        rec.record(kind, **fields)
        lat.append(time.perf_counter_ns() - t0)
    enqueued = time.perf_counter() - start
    ok = rec.flush()
    elapsed = time.perf_counter() - start
    cpu = _writer_cpu_s(rec) - cpu0
    stats = rec.stats()
    rec.close()
    return {
        "events": n,
        "seconds": elapsed,
        "events_per_s": n / elapsed,
        "enqueue_seconds": enqueued,
        "flushed_ok": ok,
        "written": stats.get("written", 0) - 2,
        **_writer_figures(cpu, n, elapsed),
        **percentiles(lat),
    }


def run_paced(folder: Path, rate: float, seconds: float) -> dict[str, Any]:
    rec, sid, task = _recorder(folder, "paced")
    n = int(rate * seconds)
    events = make_events(sid, task, n)
    lat: list[int] = []
    interval = 1.0 / rate
    sample_every = max(1, int(rate * 0.05))  # the writer's backlog, every 50 ms of events
    backlog: list[int] = []
    base = rec.stats().get("written", 0)
    cpu0 = _writer_cpu_s(rec)
    start = time.perf_counter()
    for i, (kind, fields) in enumerate(events):
        # Sleep until this event is due (no spinning: a spinning caller would hold the GIL the
        # writer needs). Lateness is absorbed because due times are absolute.
        left = start + i * interval - time.perf_counter()
        if left > 0:
            time.sleep(left)
        t0 = time.perf_counter_ns()
        rec.record(kind, **fields)
        lat.append(time.perf_counter_ns() - t0)
        if i % sample_every == sample_every - 1:  # committed so far vs offered so far
            backlog.append(i + 1 - (rec.stats().get("written", 0) - base))
    last = time.perf_counter()
    ok = rec.flush()
    done = time.perf_counter()
    cpu = _writer_cpu_s(rec) - cpu0
    stats = rec.stats()
    rec.close()
    return {
        "events": n,
        "target_rate": rate,
        "offered_rate": n / (last - start),
        # every event durable (flush() returned) over the whole run, from the first record()
        "events_per_s": n / (done - start),
        "max_backlog_events": max(backlog, default=0),  # offered but not yet committed
        "flush_lag_s": done - last,  # the last events' wait for the writer
        "flushed_ok": ok,
        "written": stats.get("written", 0) - base,
        **_writer_figures(cpu, n, done - start),
        **percentiles(lat),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=20_000, help="events per burst/naive run")
    parser.add_argument("--rate", type=float, default=5_000, help="paced events per second")
    parser.add_argument("--seconds", type=float, default=10.0, help="paced run length")
    parser.add_argument("--repeat", type=int, default=3, help="runs per mode; the median is kept")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    args = parser.parse_args(argv)

    load_before = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    runs = run_modes(args)
    result = {
        "machine": machine(cpus=os.cpu_count(), sqlite=sqlite3.sqlite_version),
        "settings": vars(args),
        "median": {mode: median(rows) for mode, rows in runs.items()},
        "runs": runs,
    }
    result["targets"] = targets(result["median"])
    print_results(result, args.repeat)
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    if load is not None and load_before is not None:
        result["machine"]["load_average_before"] = load_before
        result["machine"]["load_average_after"] = list(load)
        print(
            "load average (1, 5, 15 min) before: {:.2f} {:.2f} {:.2f}; after: {:.2f} {:.2f} "
            "{:.2f}".format(*load_before, *load)
        )
    m = result["median"]
    speedup = m["burst"]["events_per_s"] / m["naive"]["events_per_s"]
    print(
        f"burst vs naive: {speedup:.1f}x events/s; "
        f"caller p99 {m['naive']['p99_us'] / max(m['burst']['p99_us'], 1e-9):.0f}x lower"
    )
    for target, met in result["targets"].items():
        print(f"  [{'x' if met else ' '}] {target}")
    if args.json:
        write_json(args.json, result)
    return 0 if all(result["targets"].values()) else 1


def run_modes(args) -> dict[str, list[dict[str, Any]]]:
    """`--repeat` runs of each mode, each in a fresh folder."""
    runs: dict[str, list[dict[str, Any]]] = {"naive": [], "burst": [], "paced": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeat):
            folder = Path(tmp) / f"run{r}"
            folder.mkdir()
            runs["naive"].append(run_naive(folder, min(args.events, 5_000)))
            runs["burst"].append(run_burst(folder, args.events))
            runs["paced"].append(run_paced(folder, args.rate, args.seconds))
    return runs


def median(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each figure over one mode's runs; flags from the first run; all_ok."""
    keys = [k for k, v in rows[0].items() if isinstance(v, int | float) and not isinstance(v, bool)]
    out = {k: statistics.median(r[k] for r in rows) for k in keys}
    out.update({k: v for k, v in rows[0].items() if isinstance(v, bool)})
    out["all_ok"] = all(r.get("flushed_ok", True) for r in rows)
    return out


def targets(m: dict[str, dict[str, Any]]) -> dict[str, bool]:
    paced = m["paced"]
    return {
        # sustained: offered 5,000/s, every event durable at >= 99% of that rate over the whole
        # run (only the last commit's wait is allowed), and the writer never 0.5 s behind
        "5000 events/s sustained (paced: durable/s while offered 5000/s, writer kept up)": (
            paced["target_rate"] >= 5000
            and paced["events_per_s"] >= 5000 * 0.99
            and paced["max_backlog_events"] <= paced["target_rate"] * 0.5
        ),
        "events_per_s >= 5000 (burst)": m["burst"]["events_per_s"] >= 5000,
        "enqueue p99 < 1 ms (paced)": m["paced"]["p99_us"] < 1000,
        "enqueue p99 < 1 ms (burst)": m["burst"]["p99_us"] < 1000,
    }


def print_results(result: dict[str, Any], repeat: int) -> None:
    """The table of modes and the writer's cost per event."""
    m, paced = result["median"], result["median"]["paced"]
    print(
        f"telemetry recorder benchmark: {result['machine']['cpus']} CPUs, "
        f"Python {result['machine']['python']}, SQLite {result['machine']['sqlite']}, "
        f"median of {repeat} runs"
    )
    print(
        f"{'mode':<8} {'events':>8} {'events/s':>10} {'p50 us':>9} {'p99 us':>9} {'max us':>10}  note"
    )
    for mode, note in (
        ("naive", "caller does clean+redact+INSERT+COMMIT per event"),
        ("burst", "record() flat out, then flush()"),
        (
            "paced",
            f"durable/s while record() offered {paced['offered_rate']:.0f}/s; backlog max "
            f"{paced['max_backlog_events']:.0f} events, {paced['flush_lag_s'] * 1000:.0f} ms "
            "at the end",
        ),
    ):
        r = m[mode]
        print(
            f"{mode:<8} {int(r['events']):>8} {r['events_per_s']:>10.0f} {r['p50_us']:>9.1f} "
            f"{r['p99_us']:>9.1f} {r['max_us']:>10.1f}  {note}"
        )
    for mode in ("burst", "paced"):
        r = m[mode]
        print(
            f"writer ({mode}): {r['writer_cpu_us_per_event']:.1f} us CPU per event "
            f"(~{r['writer_capacity_per_s']:.0f} events/s on a free core), "
            f"busy {r['writer_busy_share']:.0%} of the wall time"
        )


if __name__ == "__main__":
    sys.exit(main())
