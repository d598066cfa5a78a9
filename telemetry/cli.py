"""`flywheel telemetry`: look at, export, import and forget the local session log.

    flywheel telemetry path                         where the database is
    flywheel telemetry stats [--json]               rows per table, sessions, rewards, size
    flywheel telemetry export OUT [--min-reward X]  training files + manifest (exports.py)
    flywheel telemetry import FOLDER...             merge other users' exports, idempotently
    flywheel telemetry forget --session ID | --workspace PATH|ID | --all --yes
    flywheel telemetry rewards [--recompute] [--function NAME[@V]]

The database is `--db PATH`, else $FLYWHEEL_DB, else $XDG_DATA_HOME (or ~/.local/share)
/flywheel/telemetry.db. This is the only place that reads those variables.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from telemetry import exports, folders, privacy, rewards, store


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--db",
        default=argparse.SUPPRESS,
        metavar="PATH",
        help="the telemetry database (default: $FLYWHEEL_DB, else "
        "$XDG_DATA_HOME/flywheel/telemetry.db)",
    )
    parser = argparse.ArgumentParser(
        prog="flywheel telemetry",
        description="The local session log: every editor session as task and reward data. "
        "Nothing leaves this machine unless you export it.",
        parents=[common],
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sub.add_parser(
        "path",
        parents=[common],
        help="print the database path",
        description="Print the path "
        "of the telemetry database this command would use, and whether it exists.",
    )

    p = sub.add_parser(
        "stats",
        parents=[common],
        help="rows per table, sessions, rewards, file size",
        description="Summarize the database: schema version, size, rows per table, sessions by "
        "consent and editor, mean stored reward per function version, dropped events.",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")

    p = sub.add_parser(
        "export",
        parents=[common],
        help="write training files (pretrain, SFT, RL tasks, benchmark) and a manifest",
        description="Write sessions.jsonl, pretrain.jsonl, sft.jsonl, rl_tasks.jsonl, "
        "benchmark.jsonl and manifest.json into OUT. Held-out sessions (by hash) go only to "
        "benchmark.jsonl; every string is redacted again on the way out.",
    )
    p.add_argument("out", metavar="OUT", help="folder to write (created if missing)")
    p.add_argument("--reward", default="total", help="reward function[@version] (default: total)")
    p.add_argument(
        "--min-reward", type=float, default=0.5, help="SFT keeps tasks at or above this reward"
    )
    p.add_argument(
        "--held-out-percent",
        type=float,
        default=10.0,
        help="share of sessions held out for the benchmark, by hash (default: 10)",
    )
    p.add_argument("--salt", default=exports.DEFAULT_SALT, help="salt of the held-out hash")

    p = sub.add_parser(
        "import",
        parents=[common],
        help="merge export folders from other machines (idempotent)",
        description="Check each folder's manifest and hashes, then merge its sessions.jsonl "
        "into the database. Rows already present are skipped, so importing twice changes "
        "nothing.",
    )
    p.add_argument("folders", nargs="+", metavar="FOLDER", help="export folders")

    p = sub.add_parser(
        "forget",
        parents=[common],
        help="delete a session, a workspace or everything, leaving no trace in the file",
        description="Delete the rows and code snapshots of a session, a workspace or "
        "everything, then VACUUM and truncate the WAL so the bytes are gone from the file.",
    )
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--session", metavar="ID", help="one session id")
    which.add_argument("--workspace", metavar="PATH|ID", help="a workspace folder or its ws_ id")
    which.add_argument("--all", action="store_true", help="every session (needs --yes)")
    p.add_argument("--yes", action="store_true", help="confirm --all")

    p = sub.add_parser(
        "rewards",
        parents=[common],
        help="list reward functions; --recompute them over all history",
        description="List the reward functions (name, version, what they reward) with the "
        "count and mean of stored values. --recompute computes them for every task and "
        "suggestion; rows of other versions are kept.",
    )
    p.add_argument("--recompute", action="store_true", help="recompute over all history")
    p.add_argument(
        "--function",
        action="append",
        metavar="NAME[@V]",
        help="only these functions (repeatable; default: every version of every function)",
    )
    return parser


def db_error(exc: sqlite3.Error, path: Path, flag: str | None, environ: Mapping[str, str]) -> str:
    """One line: what is wrong with the database file, and a fix that fits where its path came
    from (the user who passed --db is not told to pass --db)."""
    if flag:
        check = "check the path given to --db"
    elif environ.get("FLYWHEEL_DB"):
        check = "check $FLYWHEEL_DB, or pass --db FILE"
    else:
        check = "pass --db FILE to use another database"
    text = str(exc)
    low = text.lower()
    if path.is_dir():
        return f"is a folder, not a database file; {check}"
    if "not a database" in low or "malformed" in low:
        return f"is not a flywheel telemetry database (SQLite says: {text}); {check}"
    if "readonly" in low or "read-only" in low:
        return f"{text} (the file or its folder is read-only; fix its permissions, or {check})"
    if "unable to open" in low:
        return f"{text} (its folder does not exist or is not writable; {check})"
    return privacy.sqlite_error_text(exc)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    flag = getattr(args, "db", None)
    path = folders.db_path(flag)
    try:
        return _COMMANDS[args.command](args, path)
    except (
        exports.ExportError,
        store.SchemaError,
        FileNotFoundError,
        KeyError,
        ValueError,
    ) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"flywheel telemetry: error: {message}", file=sys.stderr)
        return 1
    except sqlite3.Error as exc:
        print(
            f"flywheel telemetry: error: {path}: {db_error(exc, path, flag, os.environ)}",
            file=sys.stderr,
        )
        return 1


def _path(args: argparse.Namespace, path: Path) -> int:
    print(path)
    if not path.exists():
        print("(does not exist yet: the first recorded session creates it)", file=sys.stderr)
    return 0


def collect_stats(path: Path) -> dict[str, Any]:
    db = store.open_db(path, create=False)
    conn = db.conn
    try:
        tables = {
            name: conn.execute(f"SELECT COUNT(*) FROM [{name}]").fetchone()[0]
            for name in db.table_names()
            if not name.startswith("_")
        }
        consent = dict(conn.execute("SELECT consent, COUNT(*) FROM sessions GROUP BY consent"))
        editors = dict(
            conn.execute("SELECT COALESCE(editor, '?'), COUNT(*) FROM sessions GROUP BY 1")
        )
        reward_rows = conn.execute(
            "SELECT function || '@' || version, COUNT(*), COUNT(value), AVG(value) FROM rewards "
            "GROUP BY function, version ORDER BY function, version"
        ).fetchall()
        dropped = dict(conn.execute("SELECT reason, COUNT(*) FROM dropped GROUP BY reason"))
        stops = dict(
            conn.execute(
                "SELECT COALESCE(stop_reason, '?'), COUNT(*) FROM tasks "
                "WHERE ended_at IS NOT NULL GROUP BY 1 ORDER BY 2 DESC"
            )
        )
        (open_tasks,) = conn.execute("SELECT COUNT(*) FROM tasks WHERE ended_at IS NULL").fetchone()
        version = store.schema_version(conn)
    finally:
        conn.close()
    size = sum(
        Path(str(path) + s).stat().st_size for s in ("", "-wal") if Path(str(path) + s).exists()
    )
    return {
        "path": str(path),
        "schema_version": version,
        "bytes": size,
        "tables": tables,
        "sessions_by_consent": consent,
        "sessions_by_editor": editors,
        "tasks_by_stop_reason": stops,
        "tasks_not_ended": open_tasks,
        "rewards": {k: {"rows": n, "valued": nv, "mean": m} for k, n, nv, m in reward_rows},
        "dropped": dropped,
    }


def _stats(args: argparse.Namespace, path: Path) -> int:
    stats = collect_stats(path)
    if args.json:
        print(json.dumps(stats, indent=2, sort_keys=True))
        return 0
    print(f"{stats['path']}  schema v{stats['schema_version']}  {stats['bytes'] / 1e6:.2f} MB")
    print("\nrows")
    for name, count in stats["tables"].items():
        print(f"  {name:<20} {count:>10}")
    print("\nsessions by consent: " + _pairs(stats["sessions_by_consent"]))
    print("sessions by editor:  " + _pairs(stats["sessions_by_editor"]))
    print("tasks by stop reason: " + _pairs(stats["tasks_by_stop_reason"]))
    if stats["tasks_not_ended"]:
        print(
            f"tasks not ended: {stats['tasks_not_ended']} (running now, or their process was "
            "killed; their steps are kept)"
        )
    if stats["rewards"]:
        print("\nrewards (stored)          rows   valued     mean")
        for key, r in stats["rewards"].items():
            mean = "-" if r["mean"] is None else f"{r['mean']:.3f}"
            print(f"  {key:<22} {r['rows']:>6} {r['valued']:>8} {mean:>8}")
    if stats["dropped"]:
        print("\ndropped events: " + _pairs(stats["dropped"]))
    return 0


def _pairs(d: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in d.items()) or "none"


def _export(args: argparse.Namespace, path: Path) -> int:
    report = exports.export(
        path,
        args.out,
        reward=args.reward,
        min_reward=args.min_reward,
        held_out_percent=args.held_out_percent,
        salt=args.salt,
    )
    reward = report.manifest["reward"]
    print(
        f"exported to {report.out_dir} (reward {reward['function']}@{reward['version']} "
        f">= {reward['min']})"
    )
    for name, count in report.counts().items():
        print(f"  {name:<18} {count:>8}")
    return 0


def _import(args: argparse.Namespace, path: Path) -> int:
    for folder in args.folders:
        report = exports.import_export(path, folder)
        print(
            f"{folder}: {report.total_inserted} rows new, {report.skipped} already present, "
            f"{report.rejected} rejected"
        )
    return 0


def _forget(args: argparse.Namespace, path: Path) -> int:
    if args.all and not args.yes:
        print(
            "flywheel telemetry: error: forget --all deletes every session; add --yes",
            file=sys.stderr,
        )
        return 2
    report = privacy.forget(
        path, session_id=args.session, workspace=args.workspace, everything=args.all
    )
    print(f"forgot {report.sessions} session(s): {report.rows} rows, {report.blobs} blobs")
    if not report.wal_truncated:
        print(
            "note: another process holds the database open, so the WAL could not be truncated;"
            " run forget again after closing the editor to remove its old pages",
            file=sys.stderr,
        )
    return 0


def _rewards(args: argparse.Namespace, path: Path) -> int:
    functions = (
        [rewards.get(name) for name in args.function]
        if args.function
        else list(rewards.REWARDS.values())
    )
    if args.recompute:
        db = store.open_db(path, create=False)
        try:
            report = rewards.recompute(db.conn, functions)
        finally:
            db.conn.close()
        print(
            f"recomputed {len(functions)} function(s) over {report.subjects} subjects: "
            f"{report.rows} rows"
        )
    stored = collect_stats(path)["rewards"] if path.exists() else {}
    print(f"{'function':<26} {'rows':>7} {'mean':>8}  rewards")
    for f in functions:
        r = stored.get(f.key, {})
        mean = "-" if r.get("mean") is None else f"{r['mean']:.3f}"
        print(f"{f.key:<26} {r.get('rows', 0):>7} {mean:>8}  {f.doc}")
    return 0


_COMMANDS = {
    "path": _path,
    "stats": _stats,
    "export": _export,
    "import": _import,
    "forget": _forget,
    "rewards": _rewards,
}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
