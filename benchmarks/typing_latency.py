"""Benchmark: inline completion as a user types, through a real LSP client and `flywheel lsp`.

A client types a real source file of about `--file-tokens` tokens (the start of a standard-library
module the default never trained on, `typing_text`) as an editor sends it: new text at 5-10 characters a second, one `didChange` per keystroke, an
inline completion request (automatic trigger) at each word boundary, a newer keystroke
superseding the request before it. Half the time the user stops at a boundary to read: they wait
for the answer, take it when it is what the file's author wrote next (the simulated user's rule,
`training/simulated_user.judge`: the rest of the line, or a correct start of at least 8
characters) with `flywheel.acceptCompletion`, and go on after a short pause. Each pass types 12
lines in the next place of the file (from a definition on; the text after them stays in place),
then the document goes back to the file.

The server runs at a user's settings (`--model`, the default debounce, token budget and greedy
sampling). Reported, over the requests the user waited on: p50 and p99 latency (request to
answer), the share answered with text, and the accept rate; per minute as well; and the server's
RSS every 10 s (from /proc), against its value after the first 2 minutes. With `--during-agent`,
agent tasks run one after another on the same server (the demo's task on a copy of its project)
and only requests made and answered while one ran count. With `--first-after-idle N`, N
places are opened first, each in two documents one after the other, left idle for 10 s before
its first request, which is timed alone: in one the cursor is said to rest there after 0.5 s
(flywheel/cursorIdle, as the editors send it: the server prefills the place), in the other not.
While typing, a pause of 0.5 s or more sends the rest as well.

    .venv/bin/python benchmarks/typing_latency.py --model default --minutes 6 \\
        --json benchmarks/results/typing-default.json

Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from lsprotocol import types

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BOUNDARY = " (.=,:\n"  # a request after typing one of these (an editor's word boundary)
LINES_PER_PASS = 12
REST_S = 0.5  # a cursor still this long is said to rest (the VS Code client's REST_MS)


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _position(text: str) -> types.Position:
    """The end of `text` as an LSP position (UTF-16 columns)."""
    line = text.count("\n")
    last = text.rsplit("\n", 1)[-1]
    return types.Position(line=line, character=len(last.encode("utf-16-le")) // 2)


def _rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def passes(text: str) -> list[tuple[str, str, str]]:
    """(head, typed, tail) per place the user types at: before each definition (`def` or
    `class`, at any indentation) after the file's first 20 lines, the next `LINES_PER_PASS`
    lines are typed anew. Places are visited in turn, so that no pass repeats the text of the
    one before (the server's suggestion cache would answer it)."""
    lines = text.splitlines(keepends=True)
    starts = [
        k
        for k, line in enumerate(lines)
        if k >= 20 and line.lstrip().startswith(("def ", "class "))
    ]
    out = []
    for k in starts or [len(lines) // 2]:
        typed = "".join(lines[k : k + LINES_PER_PASS])
        if typed.strip():
            out.append(("".join(lines[:k]), typed, "".join(lines[k + LINES_PER_PASS :])))
    return out


def typing_text(chars: int) -> tuple[str, str]:
    """(module path, its first `chars` characters, whole lines): the first held-out module of the
    starter's stdlib split (the default never trained on it) that has at least 6 definitions to
    type at within them."""
    import sysconfig

    from training.repo_files import RepoFile, split_files
    from training.self_text import stdlib_files

    std = Path(sysconfig.get_paths()["stdlib"])
    kept = [
        RepoFile(p.relative_to(std).as_posix(), p.read_text(errors="replace"))
        for p in stdlib_files()
    ]
    _, held = split_files(kept, 0.1, 0)  # the starter's split (its seed 0)
    for f in sorted(held, key=lambda f: f.path):
        cut = f.text.rfind("\n", 0, chars)
        text = f.text[: cut + 1]
        if len(f.text) >= chars and len(passes(text)) >= 6:
            return f.path, text
    raise SystemExit("no held-out stdlib module has enough definitions to type at")


class Typist:
    """One document typed into through a pygls client; the requests and what became of them."""

    def __init__(self, client, uri: str, rng: random.Random) -> None:
        self.client, self.uri, self.rng = client, uri, rng
        self.version = 0
        self.text = ""
        self.requests: list[dict] = []  # {at, ms, text, waited, accepted, during_agent}
        self.agent_running = False
        self.cursor_idle = True  # say where the cursor rests, as the editors do

    def open(self, text: str) -> None:
        self.version += 1
        self.text = text
        self.client.text_document_did_open(
            types.DidOpenTextDocumentParams(
                text_document=types.TextDocumentItem(
                    uri=self.uri, language_id="python", version=self.version, text=text
                )
            )
        )

    def insert(self, at: int, new: str) -> None:
        """Insert `new` at offset `at` of the document (one keystroke, or an accepted text)."""
        pos = _position(self.text[:at])
        self.text = self.text[:at] + new + self.text[at:]
        rng = types.Range(start=pos, end=pos)
        self._send_change(types.TextDocumentContentChangePartial(range=rng, text=new))

    def insert_all(self, text: str) -> None:
        """The whole document becomes `text` (a new pass)."""
        self.text = text
        self._send_change(types.TextDocumentContentChangeWholeDocument(text=text))

    def _send_change(self, change) -> None:
        self.version += 1
        self.client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(
                    uri=self.uri, version=self.version
                ),
                content_changes=[change],
            )
        )

    def close(self) -> None:
        self.client.text_document_did_close(
            types.DidCloseTextDocumentParams(text_document=types.TextDocumentIdentifier(self.uri))
        )

    def rest(self, at: int) -> None:
        """The cursor rests at offset `at`: what the editors send then (flywheel/cursorIdle)."""
        if self.cursor_idle:
            self.client.protocol.notify(
                "flywheel/cursorIdle",
                {
                    "textDocument": {"uri": self.uri, "version": self.version},
                    "position": _position(self.text[:at]),
                },
            )

    async def pause(self, at: int, seconds: float) -> None:
        """The user stops for `seconds` at `at`; past REST_S the editor says the cursor rests."""
        if seconds < REST_S:
            await asyncio.sleep(seconds)
            return
        await asyncio.sleep(REST_S)
        self.rest(at)
        await asyncio.sleep(seconds - REST_S)

    def ask(self, at: int) -> tuple[asyncio.Future, dict]:
        params = types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=self.uri),
            position=_position(self.text[:at]),
            context=types.InlineCompletionContext(
                trigger_kind=types.InlineCompletionTriggerKind.Automatic
            ),
        )
        row = {"at": time.monotonic(), "ms": None, "text": None, "waited": False}
        row["during_agent"] = self.agent_running
        future = asyncio.ensure_future(self.client.text_document_inline_completion_async(params))

        def done(f: asyncio.Future) -> None:
            if f.cancelled() or f.exception() is not None:
                return
            row["ms"] = (time.monotonic() - row["at"]) * 1000
            result = f.result()
            row["text"] = result.items[0].insert_text if result and result.items else ""
            row["item"] = result.items[0] if result and result.items else None
            row["agent_after"] = self.agent_running

        future.add_done_callback(done)
        self.requests.append(row)
        return future, row

    async def type_pass(self, head: str, typed: str, tail: str, deadline: float) -> None:
        """Type `typed` between `head` and `tail` as described in the module docstring."""
        from training.line_completion import Cursor
        from training.simulated_user import UserConfig, judge

        self.insert_all(head + tail)
        at, i = len(head), 0
        while i < len(typed) and time.monotonic() < deadline:
            ch = typed[i]
            self.insert(at, ch)
            at, i = at + 1, i + 1
            if ch in BOUNDARY and i < len(typed):
                future, row = self.ask(at)
                if self.rng.random() < 0.5:  # the user stops to read: they wait on this one
                    row["waited"] = True
                    with contextlib.suppress(TimeoutError):  # unanswered: not taken
                        await asyncio.wait_for(asyncio.shield(future), 30)
                    rest = typed[i:].split("\n", 1)[0]
                    said = row.get("text") or ""
                    cursor = Cursor("typed.py", self.text[:at], "", rest)
                    take = said and judge(cursor, said, UserConfig()).accepted
                    row["accepted"] = bool(take)
                    if take:
                        self.insert(at, said)
                        at, i = at + len(said), i + len(said)
                        command = row["item"].command
                        await self.client.workspace_execute_command_async(
                            types.ExecuteCommandParams(
                                command=command.command, arguments=command.arguments
                            )
                        )
                    await self.pause(at, self.rng.uniform(0.5, 1.5))
                    continue
            await asyncio.sleep(1 / self.rng.uniform(5, 10))


async def _start(args: argparse.Namespace, folder: Path):
    from pygls.lsp.client import LanguageClient

    from benchmarks.lsp_latency import start_server

    client = LanguageClient("flywheel-bench-typing", "1")
    client.feature("flywheel/status")(lambda ls, params: None)
    client.feature("flywheel/taskStep")(lambda ls, params: None)
    client.feature("flywheel/proposal")(lambda ls, params: None)
    options = {"agent": {"approval": "never", "maxSteps": 12}}  # completions: the user's defaults
    await start_server(client, args.model, folder, options)
    return client


async def _agent_loop(client, typist: Typist, stop: asyncio.Event) -> int:
    from agent.demo import INSTRUCTION

    tasks = 0
    while not stop.is_set():
        typist.agent_running = True
        try:
            await client.workspace_execute_command_async(
                types.ExecuteCommandParams(
                    command="flywheel.ask", arguments=[{"question": INSTRUCTION}]
                )
            )
        finally:
            typist.agent_running = False
        tasks += 1
    return tasks


async def _run(args: argparse.Namespace) -> dict:
    from agent.demo import SAMPLE

    folder = Path(tempfile.mkdtemp(prefix="flywheel-bench-typing-"))
    shutil.copytree(SAMPLE, folder, dirs_exist_ok=True)
    module, text = typing_text(int(args.file_tokens * 3.5))
    places = passes(text)
    rng = random.Random(args.seed)
    client = await _start(args, folder)
    pid = client._server.pid
    try:
        first_after_idle: dict[str, list[float]] = {"warmed": [], "unwarmed": []}
        for k in range(args.first_after_idle):
            head, typed, tail = places[k % len(places)]
            line = typed.split("\n", 1)[0]
            cut = next((j + 1 for j, c in enumerate(line) if c in BOUNDARY), len(line))
            for how in ("unwarmed", "warmed"):  # the same place, with and without the rest
                idle = Typist(client, (folder / f"idle_{k}_{how}.py").as_uri(), rng)
                idle.cursor_idle = how == "warmed"
                idle.open(head + typed[:cut] + "\n" + tail)
                await idle.pause(len(head) + cut, 10)
                future, row = idle.ask(len(head) + cut)
                await asyncio.wait_for(future, 120)
                first_after_idle[how].append(row["ms"])
                idle.close()  # not context for the next one
        typist = Typist(client, (folder / "typed.py").as_uri(), rng)
        typist.open(text)
        warm, _ = typist.ask(len(text))  # the model is loaded before the clock starts
        await asyncio.wait_for(warm, 600)
        typist.requests.clear()
        stop = asyncio.Event()
        agent = (
            asyncio.ensure_future(_agent_loop(client, typist, stop)) if args.during_agent else None
        )
        started = time.monotonic()
        deadline = started + args.minutes * 60
        rss: list[tuple[float, float | None]] = []

        async def sample_rss() -> None:
            while True:
                rss.append((time.monotonic() - started, _rss_mb(pid)))
                await asyncio.sleep(10)

        sampler = asyncio.ensure_future(sample_rss())
        n = 0
        while time.monotonic() < deadline:
            head, typed, tail = places[n % len(places)]
            await typist.type_pass(head, typed, tail, deadline)
            n += 1
        sampler.cancel()
        rss.append((time.monotonic() - started, _rss_mb(pid)))
        tasks = 0
        if agent is not None:
            stop.set()
            tasks = await asyncio.wait_for(agent, 900)
    finally:
        try:
            await asyncio.wait_for(client.shutdown_async(None), 60)
            client.exit(None)
        finally:
            await client.stop()
            shutil.rmtree(folder, ignore_errors=True)
    report = _report(args, typist.requests, started, rss, first_after_idle, tasks, n)
    return {**report, "file": module, "places": len(places)}


def _report(args, requests, started, rss, first_after_idle, tasks, passes_typed) -> dict:
    counted = [
        r
        for r in requests
        if r["waited"] and (not args.during_agent or (r["during_agent"] and r.get("agent_after")))
    ]
    answered = [r for r in counted if r["ms"] is not None]
    ms = [r["ms"] for r in answered]
    minutes = []
    for m in range(int(args.minutes)):
        window = [r["ms"] for r in answered if m * 60 <= r["at"] - started < (m + 1) * 60]
        minutes.append(
            {
                "minute": m + 1,
                "n": len(window),
                "p50_ms": _percentile(window, 0.5),
                "p99_ms": _percentile(window, 0.99),
            }
        )
    after_2 = [v for t, v in rss if t >= 120 and v is not None]
    rss_growth = (rss[-1][1] / after_2[0] - 1) if after_2 and rss[-1][1] else None
    return {
        "benchmark": "typing_latency",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "model": args.model,
        "minutes": args.minutes,
        "during_agent": args.during_agent,
        "agent_tasks": tasks,
        "passes": passes_typed,
        "requests": len(requests),
        "waited_on": len(counted),
        "answered": len(answered),
        "answered_with_text": sum(bool(r["text"]) for r in answered),
        "accepted": sum(bool(r.get("accepted")) for r in counted),
        "p50_ms": _percentile(ms, 0.5),
        "p99_ms": _percentile(ms, 0.99),
        "mean_ms": statistics.fmean(ms) if ms else None,
        "first_after_idle_ms": first_after_idle["warmed"],
        "first_after_idle_p50_ms": _percentile(first_after_idle["warmed"], 0.5),
        "first_after_idle_unwarmed_ms": first_after_idle["unwarmed"],
        "first_after_idle_unwarmed_p50_ms": _percentile(first_after_idle["unwarmed"], 0.5),
        "per_minute": minutes,
        "waited_requests": [  # [seconds from the start, ms or null, characters answered]
            [round(r["at"] - started, 2), r["ms"], len(r["text"] or "")] for r in counted
        ],
        "rss_mb": rss,
        "rss_growth_after_2_min": rss_growth,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_average_1_5_15": os.getloadavg(),
        },
    }


def main() -> None:
    from agent.model import add_model_argument

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_argument(p, role="the model `flywheel lsp --model` gets")
    p.add_argument("--minutes", type=float, default=6, help="how long the user types (default 6)")
    p.add_argument("--file-tokens", type=int, default=1500, help="size of the typed file")
    p.add_argument("--during-agent", action="store_true", help="agent tasks run meanwhile")
    p.add_argument("--first-after-idle", type=int, default=0, help="documents opened, 10 s idle")
    p.add_argument("--seed", type=int, default=0, help="the typing rhythm and pauses")
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args()
    report = asyncio.run(_run(args))
    r = report
    share = r["answered_with_text"] / r["answered"] if r["answered"] else 0.0
    print(
        f"model {args.model}, {args.minutes} min, {r['requests']} requests, {r['waited_on']} waited on"
    )

    def ms(v):
        return "-" if v is None else f"{v:.0f} ms"

    def pct(v):
        return "-" if v is None else f"{v:.1%}"

    rows = [
        ("p50 (requests waited on)", ms(r["p50_ms"])),
        ("p99 (requests waited on)", ms(r["p99_ms"])),
        ("answered with text", pct(share)),
        ("accepted", pct(r["accepted"] / r["waited_on"] if r["waited_on"] else None)),
        ("first request after 10 s idle, p50", ms(r["first_after_idle_p50_ms"])),
        ("  the same, no cursorIdle sent, p50", ms(r["first_after_idle_unwarmed_p50_ms"])),
        ("server RSS growth after minute 2", pct(r["rss_growth_after_2_min"])),
    ]
    for name, value in rows:
        print(f"{name:38} {value:>10}")
    for m in r["per_minute"]:
        print(f"  minute {m['minute']:>2}: n={m['n']:>3} p50={m['p50_ms']} p99={m['p99_ms']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
