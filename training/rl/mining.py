"""Verifiable RL tasks mined from logged sessions (a telemetry export's rl_tasks.jsonl).

A logged agent task becomes an RL task only when it can be replayed and checked:

    stored      its starting workspace and a verify command were logged (the harness records
                both for sessions whose consent keeps code: the caller's verify command, else the
                project's own test command)
    answered    the task ended with an answer and a change (the recorded diff)
    fails       the verify command fails on the starting files (there is something to fix)
    passes      it passes on the session's end state: the starting files with the diff applied
                (`git apply`, so a diff that does not fit exactly is dropped, never guessed)

Tasks of held-out sessions stay out (they are the benchmark's). Every task the export holds is
counted, kept or dropped with its reason, in the report (`mining.json` beside `mined.jsonl`).

    flywheel telemetry --db telemetry.db export export/
    python -m training.rl.mining export/ --out mined/        # the cycle runs it itself
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from training.tasks.task import run_tests

REASONS = {
    "held_out": "its session is held out for the benchmark",
    "not_stored": "no starting workspace or no verify command was logged (no consent to keep "
    "code, a workspace too large to snapshot, or a project without tests)",
    "no_change": "the task did not end with an answer and a change",
    "cannot_run": "the verify command cannot run here",
    "passes_at_start": "the verify command already passes on the starting files",
    "diff_does_not_apply": "the recorded change does not apply to the starting files",
    "fails_at_end": "the session ended with the verify command failing",
}
TIMEOUT_S = 60.0


def mine(export: str | Path, out: str | Path, timeout: float = TIMEOUT_S) -> dict[str, Any]:
    """Write OUT/mined.jsonl (rows in rl_tasks.jsonl's shape, each replayed) and OUT/mining.json;
    returns the report: counts kept and dropped per reason, and each task's outcome."""
    export, out = Path(export), Path(out)
    if not (export / "rl_tasks.jsonl").exists():
        raise FileNotFoundError(
            f"{export} is not a telemetry export (no rl_tasks.jsonl): write one with "
            "`flywheel telemetry export DIR`"
        )
    out.mkdir(parents=True, exist_ok=True)
    candidates = _rows(export / "rl_tasks.jsonl")
    outcomes: dict[str, str] = dict.fromkeys(
        (r["id"] for r in _rows(export / "benchmark.jsonl")), "held_out"
    )
    kept = []
    for row in candidates:
        reason = replay(row, timeout)
        outcomes[row["id"]] = reason or "kept"
        if not reason:
            kept.append(row)
    for task_id in _logged_tasks(export / "sessions.jsonl"):
        outcomes.setdefault(task_id, "not_stored")
    part = out / "mined.jsonl.part"
    part.write_text("".join(json.dumps(row) + "\n" for row in kept))
    part.replace(out / "mined.jsonl")
    dropped: dict[str, int] = {}
    for outcome in outcomes.values():
        if outcome != "kept":
            dropped[outcome] = dropped.get(outcome, 0) + 1
    report = {
        "export": str(export),
        "logged_tasks": len(outcomes),
        "kept": len(kept),
        "dropped": dict(sorted(dropped.items())),
        "reasons": {k: REASONS[k] for k in sorted(dropped)},
        "tasks": outcomes,
    }
    (out / "mining.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def replay(row: dict[str, Any], timeout: float = TIMEOUT_S) -> str:
    """ "" when `row` replays (fails at the start, passes after its diff), else the reason."""
    files, command, diff = row.get("workspace"), row.get("verify"), row.get("reference_diff")
    if not isinstance(files, dict) or not command:
        return "not_stored"
    if not diff:
        return "no_change"
    try:
        code, _ = run_tests(files, command, timeout)
        if code in (124, 126, 127):
            return "cannot_run"
        if code == 0:
            return "passes_at_start"
        after = apply_diff(files, diff)
        if after is None:
            return "diff_does_not_apply"
        code, _ = run_tests(after, command, timeout)
    except (OSError, ValueError):  # no such program, a command that does not parse
        return "cannot_run"
    return "" if code == 0 else "fails_at_end"


def apply_diff(files: dict[str, str], diff: str) -> dict[str, str] | None:
    """`files` with the unified diff applied by `git apply` (None when it does not apply)."""
    from agent.harness.scratch import read_files, write_files

    with tempfile.TemporaryDirectory(prefix="flywheel-mine-") as tmp:
        root = Path(tmp)
        write_files(root, files)
        proc = subprocess.run(
            ["git", "apply", "--whitespace=nowarn", "-"],
            cwd=root,
            input=diff,
            capture_output=True,
            text=True,
            check=False,
        )
        return read_files(root) if proc.returncode == 0 else None


def _rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _logged_tasks(sessions: Path) -> list[str]:
    """Ids of every task in the export (sessions.jsonl holds the store's rows, table by table)."""
    return [r["row"]["id"] for r in _rows(sessions) if r.get("table") == "tasks"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.rl.mining", description=__doc__)
    parser.add_argument("export", help="a `flywheel telemetry export` folder")
    parser.add_argument("--out", required=True, help="folder for mined.jsonl and mining.json")
    args = parser.parse_args(argv)
    try:
        report = mine(args.export, args.out)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{report['kept']} of {report['logged_tasks']} logged tasks replay as RL tasks")
    for reason, count in report["dropped"].items():
        print(f"  dropped {count}: {REASONS[reason]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
