"""Typing flood: 100 `didChange` per second, each followed by an inline
completion request, against `flywheel lsp` with a tiny checkpoint as the model.

Checked: every request is answered and logged (a row of its own, or the continuation of one the
user typed through); every suggestion but the newest ends superseded, cancelled (its generation
was stopped) or ignored, as telemetry's lifecycle rows show; the server process's memory (RSS
from /proc) stops growing; and the server still answers at once afterwards.

Two sizes: a few seconds in the default tier, and the full 30 s under `-m slow`:
    .venv/bin/pytest tests/lsp/test_soak.py -m slow -s     (prints the figures)
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from lsprotocol import types

from tests.lsp.conftest import SAMPLING_OPTIONS, start_editor, stop_editor

RATE_HZ = 100  # didChange + inlineCompletion pairs per second
TERMINAL = {"superseded", "cancelled", "ignored"}


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def _request(ed, uri: str) -> asyncio.Future:
    text = ed.texts[uri]
    line = text.count("\n")
    col = len(text.rsplit("\n", 1)[-1].encode("utf-16-le")) // 2
    return asyncio.ensure_future(
        ed.client.text_document_inline_completion_async(
            types.InlineCompletionParams(
                text_document=types.TextDocumentIdentifier(uri=uri),
                position=types.Position(line=line, character=col),
                context=types.InlineCompletionContext(
                    trigger_kind=types.InlineCompletionTriggerKind.Invoked
                ),
            )
        )
    )


async def _flood(tmp_path, checkpoint: Path, seconds: float) -> dict:
    ed = await start_editor(tmp_path, str(checkpoint), SAMPLING_OPTIONS)
    try:
        pid = ed.client._server.pid
        uri = (tmp_path / "typing.py").as_uri()
        ed.open(uri, "def total(items):\n    s = 0\n    for x in items:\n        s += ")
        await _request(ed, uri)  # the model is loaded before the clock starts
        typed = "x * 2  # 中文😀\n        s += "
        pending: list[asyncio.Future] = []
        rss: list[tuple[float, float]] = []
        start = time.monotonic()
        n = int(seconds * RATE_HZ)
        for i in range(n):
            due = start + i / RATE_HZ
            await asyncio.sleep(max(0.0, due - time.monotonic()))  # pacing the typist
            end = ed.texts[uri]
            pos = _end_position(end)
            ed.change(uri, types.Range(start=pos, end=pos), typed[i % len(typed)])
            pending.append(_request(ed, uri))
            if i % RATE_HZ == 0:
                rss.append((time.monotonic() - start, _rss_mb(pid)))
        sent_s = time.monotonic() - start
        answers = await asyncio.wait_for(asyncio.gather(*pending), timeout=120)
        drained_s = time.monotonic() - start
        rss.append((drained_s, _rss_mb(pid)))
        t0 = time.monotonic()
        status = await ed.command("flywheel.status")
        last = await _request(ed, uri)
        after_ms = (time.monotonic() - t0) * 1000
        rows = await ed.rows("suggestions", document_uri=uri)
        events = await ed.rows("suggestion_events")
        return {
            "n": n,
            "answers": answers,
            "rows": rows,
            "events": events,
            "rss": rss,
            "status": status,
            "last": last,
            "after_ms": after_ms,
            "sent_s": sent_s,
            "drained_s": drained_s,
        }
    finally:
        await stop_editor(ed)


def _end_position(text: str) -> types.Position:
    line = text.count("\n")
    return types.Position(
        line=line, character=len(text.rsplit("\n", 1)[-1].encode("utf-16-le")) // 2
    )


def _check(result: dict) -> dict:
    n = result["n"]
    assert len(result["answers"]) == n, "every request was answered"
    rows = sorted(result["rows"], key=lambda r: r["created_at"])
    # A request typed through the open suggestion continues it under its id (one ghost text),
    # counted by the server (an answer the user has typed past comes back empty, so the client
    # cannot count them); every other request made a row: generated, cached or cancelled.
    ids = [a.items[0].command.arguments[0] for a in result["answers"] if a and a.items]
    continued = result["status"]["continuedRequests"]
    assert set(ids) <= {r["id"] for r in rows}, "every answer is a logged suggestion"
    assert len(rows) + continued >= n, "each request made a suggestion row or continued one"
    ends: dict[str, set[str]] = {}
    for e in result["events"]:
        ends.setdefault(e["suggestion_id"], set()).add(e["event"])
    unresolved = [r["id"] for r in rows if not ends.get(r["id"], set()) & TERMINAL]
    assert len(unresolved) <= 2, (  # the newest of the flood, and the one asked after it
        f"{len(unresolved)} suggestions were neither superseded nor cancelled"
    )
    cancelled = sum("cancelled" in ends.get(r["id"], set()) for r in rows)
    assert cancelled > 0, "superseded generations are cancelled, not run to the end"
    assert result["status"]["state"] in ("idle", "busy")
    assert result["last"] is None or result["last"].items
    return {
        "requests": n,
        "rows": len(rows),
        "cancelled": cancelled,
        "superseded": sum("superseded" in ends.get(r["id"], set()) for r in rows),
        "answered_after_ms": round(result["after_ms"], 1),
        "sent_s": round(result["sent_s"], 1),  # when the last request was sent
        "drained_s": round(result["drained_s"], 1),  # when the last answer arrived
        "rss_mb": [(round(t, 1), round(m, 1)) for t, m in result["rss"]],
    }


async def test_typing_flood_short(tmp_path, tiny_checkpoint):
    summary = _check(await _flood(tmp_path, tiny_checkpoint, seconds=3))
    print(summary)


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_typing_flood_30s(tmp_path, tiny_checkpoint):
    summary = _check(await _flood(tmp_path, tiny_checkpoint, seconds=30))
    print(summary)
    rss = [m for _, m in summary["rss_mb"]]
    third = max(1, len(rss) // 3)
    growth = max(rss[-third:]) - max(rss[:third])
    assert growth < 64, f"the server's memory kept growing: {summary['rss_mb']}"
    assert summary["answered_after_ms"] < 5000, "the server is still responsive after the flood"
