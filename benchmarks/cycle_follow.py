"""Benchmark: real `flywheel cycle` runs from the default while a real `flywheel lsp` follows the registry.

The cycle, end to end on the real model:

1. A fresh registry gets the shipped default as its promoted version.
2. Sessions: `flywheel run --model default` on synthetic tasks (seed 77, round robin over the
   families), logged with their starting files and test command to one telemetry file.
3. An editor: `flywheel lsp --model registry` over stdio (a pygls client), one inline completion;
   the suggestion's `model_version` (from the server's telemetry) says which version answered.
4. The good cycle: `flywheel cycle` on those sessions plus synthetic tasks, RL stage only (the SFT
   and pretraining thresholds are set out of reach); the gate decides. When it promotes, the
   editor waits for the server's `flywheel/status` naming the new version and asks again.
5. More sessions, then the bad cycle: the same with `--set rl.lr=0.05`, a rate that breaks the
   model; the editor asks again and must still get the version promoted before.

It prints each step and writes the decisions, the gate's reasons and the versions that answered
to `--json`.

    .venv/bin/python benchmarks/cycle_follow.py --work /tmp/cycle-follow \
        --json benchmarks/results/cycle-follow-default.json
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import platform
import shlex
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

CYCLE_ARGS = shlex.split(
    "--base default --min-trajectories 1000 --min-code-chars 100000000 --min-rl-tasks 2 "
    "--rl-synthetic 2 --held-out-percent 0 --bench-projects 2 --bench-tasks 6 "
    "--set rl.steps=1 --set rl.tasks_per_step=2 --set rl.group_size=4 --set rl.max_idle_groups=3"
)
BAD = ["--set", "rl.lr=0.05"]
FILE = "import os\n\n\ndef read_lines(path):\n    "


def session_tasks(count: int) -> list:
    """`count` synthetic tasks (seed 77), taking each family in turn."""
    from training.tasks.generation import generate_tasks

    by_family: dict[str, list] = {}
    for task in generate_tasks(3, seed=77, heldout_fraction=0.0):
        by_family.setdefault(task.family, []).append(task)
    order = [tasks[i] for i in range(3) for _, tasks in sorted(by_family.items()) if len(tasks) > i]
    return order[:count]


def log_sessions(tasks: list, db: Path, root: Path) -> list[dict]:
    """One `flywheel run` session per task, logged to `db`; each task's outcome."""
    done = []
    for task in tasks:
        ws = root / task.id
        for path, text in task.files.items():
            (ws / path).parent.mkdir(parents=True, exist_ok=True)
            (ws / path).write_text(text)
        started = time.perf_counter()
        run = subprocess.run(
            [sys.executable, "-m", "agent.cli", "run", task.instruction, "-w", str(ws)]
            + ["--model", "default", "--telemetry-db", str(db), "--test-command"]
            + [task.test_command, "--max-steps", "10", "--turn-tokens", "256"]
            + ["--approve", "yes", "--quiet"],
            capture_output=True,
            text=True,
            check=False,
        )
        tests = subprocess.run(
            task.test_command, shell=True, cwd=ws, capture_output=True, check=False
        )
        done.append(
            dict(
                task=task.id,
                family=task.family,
                rc=run.returncode,
                tests_pass_after=tests.returncode == 0,
                seconds=round(time.perf_counter() - started, 1),
            )
        )
        print(f"session {len(done)}: {json.dumps(done[-1])}", flush=True)
    return done


class Editor:
    """A pygls client on `flywheel lsp --model registry`: inline completions and status notes.
    `folder` is the client's workspace folder (rootUri); the server's telemetry goes to `db`."""

    def __init__(self, registry: Path, folder: Path, db: Path, max_tokens: int = 16) -> None:
        self.registry, self.folder, self.db, self.max_tokens = registry, folder, db, max_tokens
        self.statuses: list[str] = []
        self.versions: dict[str, int] = {}  # open documents: uri -> version

    async def start(self) -> None:
        from lsprotocol import types
        from pygls.lsp.client import LanguageClient

        self.types = types
        self.client = client = LanguageClient("flywheel-cycle-follow", "1")
        client.feature("flywheel/status")(lambda ls, params: self._status(params))
        await client.start_io(
            sys.executable, "-m", "lsp.cli", "--model", "registry", "--registry",
            str(self.registry), "--reload-interval", "2", "--db", str(self.db),
            "--consent", "metrics",
        )  # fmt: skip
        options = {"completion": {"debounceMs": 0, "maxTokens": self.max_tokens}}
        await client.initialize_async(
            types.InitializeParams(
                capabilities=types.ClientCapabilities(),
                root_uri=self.folder.as_uri(),
                initialization_options=options,
            )
        )
        client.initialized(types.InitializedParams())

    def _status(self, params) -> None:
        """Each status's versions: the model's, and the completion lane's when it has one."""
        for key in ("modelVersion", "completionModelVersion"):
            version = getattr(params, key, None)
            if version:
                self.statuses.append(version)

    async def complete(self) -> dict:
        """One inline completion at the end of a small file, a new text each time."""
        self.request = getattr(self, "request", 0) + 1
        text = f"# request {self.request}\n{FILE}"
        return await self.complete_at(self.folder / "lines.py", text, len(text))

    async def complete_at(self, path: Path, text: str, offset: int) -> dict:
        """`path` opened (or changed) to `text`, one inline completion asked at `offset`: the
        version that answered (from the server's telemetry), its text and the latency."""
        types = self.types
        uri = path.as_uri()
        version = self.versions.get(uri, 0) + 1
        self.versions[uri] = version
        if version == 1:
            self.client.text_document_did_open(
                types.DidOpenTextDocumentParams(
                    text_document=types.TextDocumentItem(uri, "python", version, text)
                )
            )
        else:
            self.client.text_document_did_change(
                types.DidChangeTextDocumentParams(
                    text_document=types.VersionedTextDocumentIdentifier(version=version, uri=uri),
                    content_changes=[types.TextDocumentContentChangeWholeDocument(text)],
                )
            )
        line = text.count("\n", 0, offset)
        character = offset - (text.rfind("\n", 0, offset) + 1)
        params = types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri),
            position=types.Position(line, character),
            context=types.InlineCompletionContext(types.InlineCompletionTriggerKind.Invoked),
        )
        started = time.perf_counter()
        result = await self.client.text_document_inline_completion_async(params)
        ms = (time.perf_counter() - started) * 1000
        await self.client.protocol.send_request_async("flywheel/debug/flush", {})
        conn = sqlite3.connect(self.db)
        try:  # this request's row (one at a time), also when it offered nothing (ignored)
            row = conn.execute(
                "SELECT model_version FROM suggestions ORDER BY created_at DESC LIMIT 1"
            ).fetchone()
        finally:
            conn.close()
        answer = ""
        if result and result.items:
            text = result.items[0].insert_text
            answer = text if isinstance(text, str) else text.value
        return dict(model_version=row and row[0], text=answer, latency_ms=round(ms, 1))

    def close(self, path: Path) -> None:
        """`path` closed in the editor (no longer context for the others)."""
        if self.versions.pop(path.as_uri(), None) is not None:
            self.client.text_document_did_close(
                self.types.DidCloseTextDocumentParams(
                    self.types.TextDocumentIdentifier(path.as_uri())
                )
            )

    async def wait_for(self, version: str, since: int, timeout: float = 600) -> float:
        """Seconds until a status notification (the `since`-th or later) names `version`."""
        started = time.perf_counter()
        while version not in self.statuses[since:]:
            if time.perf_counter() - started > timeout:
                raise TimeoutError(f"the server never announced {version}: {self.statuses}")
            await asyncio.sleep(0.5)
        return time.perf_counter() - started

    async def stop(self) -> None:
        await self.client.shutdown_async(None)
        self.client.exit(None)
        await self.client.stop()


async def cycle(args: argparse.Namespace, db: Path, options: list[str]) -> dict:
    """One `flywheel cycle` with `options`, its output streamed; its summary.json."""
    work = Path(args.work) / "cycles"
    before = set(work.glob("*/summary.json")) if work.exists() else set()
    command = [sys.executable, "-m", "agent.cli", "cycle", "--registry", str(args.registry)]
    command += ["--telemetry-db", str(db), "--work", str(work), *options]
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    async for line in proc.stdout:
        print("  cycle | " + line.decode(errors="replace").rstrip(), flush=True)
    rc = await proc.wait()
    new = set(work.glob("*/summary.json")) - before
    if len(new) != 1:  # killed (out of memory, say): a cycle writes its summary otherwise
        raise SystemExit(f"flywheel cycle exited with {rc} and wrote no summary (see above)")
    summary = json.loads(new.pop().read_text())
    return dict(
        command="flywheel " + " ".join(command[3:]),
        rc=rc,
        minutes=round((time.perf_counter() - started) / 60, 1),
        summary=summary,
    )


async def run(args: argparse.Namespace) -> dict:
    from agent.model import resolve_model
    from agent.registry import Registry

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=False)
    args.registry = work / "registry"
    registry = Registry(args.registry)
    v1 = registry.add(resolve_model("default"), note="the shipped default")
    registry.promote(v1, forced=True, reason="the baseline of this benchmark")
    db = work / "telemetry.db"
    tasks = session_tasks(args.sessions + args.more_sessions)
    sessions = log_sessions(tasks[: args.sessions], db, work / "sessions")
    (work / "editor").mkdir()
    editor = Editor(args.registry, work / "editor", work / "editor" / "editor.db")
    await editor.start()
    report: dict = dict(baseline=v1, sessions=sessions, cycles=[])
    try:
        report["editor_before"] = await editor.complete()
        for name, extra in (("good", []), ("bad", BAD)):
            if name == "bad":
                more = log_sessions(tasks[args.sessions :], db, work / "sessions")
                report["sessions"] += more
            served = registry.promoted()
            since = len(editor.statuses)
            result = await cycle(args, db, [*CYCLE_ARGS, *extra])
            result["case"] = name
            promoted = registry.promoted()
            result["promoted_after"] = promoted
            if promoted != served:
                result["seconds_to_status"] = round(await editor.wait_for(promoted, since), 1)
            result["editor_after"] = await editor.complete()
            result["editor_follows"] = result["editor_after"]["model_version"] == promoted
            report["cycles"].append(result)
            print(
                f"{name} cycle: {result['summary']['status']}, promoted {promoted}, the editor's "
                f"next completion came from {result['editor_after']['model_version']}",
                flush=True,
            )
    finally:
        await editor.stop()
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", required=True, help="a new folder for everything the run makes")
    parser.add_argument("--sessions", type=int, default=7, help="sessions before the good cycle")
    parser.add_argument("--more-sessions", type=int, default=1, help="before the bad cycle")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    report = asyncio.run(run(args))
    report = dict(
        benchmark="cycle-follow",
        command="python benchmarks/cycle_follow.py " + " ".join(argv or sys.argv[1:]),
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        machine=f"{platform.machine()}, {platform.processor() or platform.system()}",
        **report,
    )
    print("\n| cycle | decision | promoted | editor answered with | follows |")
    print("| --- | --- | --- | --- | --- |")
    for c in report["cycles"]:
        after = c["editor_after"]["model_version"]
        print(f"| {c['case']} | {c['summary']['status']} | {c['promoted_after']} | {after} | "
              f"{c['editor_follows']} |")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str) + "\n")
    return 0 if all(c["editor_follows"] for c in report["cycles"]) else 1


if __name__ == "__main__":
    sys.exit(main())
