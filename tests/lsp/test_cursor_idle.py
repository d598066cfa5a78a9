"""Warming a resting cursor (`flywheel/cursorIdle`, CompletionService.warm) and a newly opened
document's head (`warm_opened`): the prompt a completion there would send is prefilled in the
prefetch lane, once, and gives way to the user's own request."""

from __future__ import annotations

import asyncio
import threading

import pytest

from agent.engine import Completion, RequestMetrics, Result
from lsp.completion import Ask, CompletionService, build_prompt, head_offset
from lsp.settings import CompletionSettings, ModelSettings
from tests.lsp.conftest import inline_params

SETTINGS = CompletionSettings(debounce_ms=0)
URI = "file:///w/shop/app.py"
TEXT = "import os\n\n\ndef area(width, height):\n    return \n"
CURSOR = TEXT.index("return ") + len("return ")


class Engine:
    """Records each request; `hold` keeps a prefetch request running until released."""

    context_length = 4096
    model_version = "scripted-1"

    def __init__(self, hold: bool = False) -> None:
        self.requests, self.hold = [], hold
        self.started, self.release = threading.Event(), threading.Event()

    def generate(self, request) -> Result:
        self.requests.append(request)
        reason = "stop"
        if self.hold and request.priority == "prefetch":
            self.started.set()
            self.release.wait(10)
            reason = "cancelled" if request.cancel.is_set() else "stop"
        done = Completion(
            text="width * height",
            token_ids=[1],
            logprobs=None,
            finish_reason=reason,
            model_version=self.model_version,
        )
        return Result([done], RequestMetrics(prompt_tokens=1, output_tokens=1))


class Host:
    def __init__(self, engine: Engine) -> None:
        self.engine, self.version = engine, engine.model_version
        self.show_min = None

    async def get(self, settings):
        return self.engine

    async def call(self, fn, request):
        return await asyncio.to_thread(fn, request)

    def error_once(self, message: str) -> None:
        raise AssertionError(message)


def _service(engine: Engine) -> tuple[CompletionService, list]:
    rows: list = []
    return CompletionService(Host(engine), lambda what, **f: rows.append(what) or "id"), rows


def _place(uri: str = URI, offset: int = CURSOR) -> Ask:
    return Ask(
        uri=uri,
        version=1,
        text=TEXT,
        offset=offset,
        language="python",
        neighbours=[],
        settings=SETTINGS,
        model=ModelSettings(),
        place=("shop", "app.py"),
    )


def test_a_resting_cursor_prefills_the_completions_prompt_once_and_records_nothing():
    engine = Engine()
    svc, rows = _service(engine)

    async def go():
        assert await svc.warm(_place())
        assert not await svc.warm(_place())  # the same place again: nothing to do
        await svc.complete(_place(), "invoked")

    asyncio.run(go())
    warm, asked = engine.requests
    assert warm.priority == "prefetch" and warm.params.max_tokens == 1
    assert asked.priority == "interactive" and warm.prompt == asked.prompt
    assert "<|repo_name|>shop" in warm.prompt
    assert rows.count("suggestion") == 1  # the user's request only


def test_the_users_request_cancels_a_warm_up_still_running():
    engine = Engine(hold=True)
    svc, _ = _service(engine)

    async def go():
        warming = asyncio.ensure_future(svc.warm(_place()))
        await asyncio.to_thread(engine.started.wait, 10)
        asked = asyncio.ensure_future(svc.complete(_place(), "invoked"))
        await asyncio.sleep(0)  # the request starts: it cancels the warm-up
        engine.release.set()
        return await warming, await asked

    warmed, suggestion = asyncio.run(go())
    assert not warmed and engine.requests[0].cancel.is_set()
    assert suggestion is not None and suggestion.text == "width * height"


def test_a_warm_up_gives_way_to_one_where_the_cursor_rests_now():
    engine = Engine(hold=True)
    svc, _ = _service(engine)

    async def go():
        first = asyncio.ensure_future(svc.warm(_place()))
        await asyncio.to_thread(engine.started.wait, 10)
        again = await svc.warm(_place())  # the same place while it warms: nothing to do
        moved = asyncio.ensure_future(svc.warm(_place(offset=len(TEXT))))
        await asyncio.sleep(0)
        engine.release.set()
        return await first, again, await moved

    first, again, moved = asyncio.run(go())
    assert (first, again, moved) == (False, False, True)
    assert len(engine.requests) == 2 and engine.requests[0].cancel.is_set()


def test_an_open_cancels_the_warm_up_of_the_document_opened_before():
    engine = Engine(hold=True)
    svc, rows = _service(engine)
    other = URI.replace("app.py", "models.py")

    async def go():
        first = asyncio.ensure_future(svc.warm_opened(_place()))
        await asyncio.to_thread(engine.started.wait, 10)
        second = asyncio.ensure_future(svc.warm_opened(_place(other)))
        await asyncio.sleep(0)  # the second open starts: it cancels the first warm-up
        engine.release.set()
        return await first, await second

    first, second = asyncio.run(go())
    assert not first and engine.requests[0].cancel.is_set()
    assert second and not engine.requests[1].cancel.is_set()
    assert [r.priority for r in engine.requests] == ["prefetch", "prefetch"] and not rows


def test_the_head_of_a_long_document_ends_at_a_line_start_within_the_prefix_window():
    lines = [f"value_{i} = {i}\n" for i in range(400)]
    text = "".join(lines)
    at = head_offset(text, 4000)
    assert 4000 - len(lines[-1]) < at <= 4000 and text[at - 1] == "\n"
    assert head_offset(TEXT, 4000) == len(TEXT)
    # a completion anywhere before the head sends a prompt that starts as the head's does
    settings = CompletionSettings(max_prefix_chars=4000)
    head = build_prompt(text[:at], text[at:], "python", [], settings, 1 << 20, URI)
    for cursor in (len(lines[0]) * 3, at // 2, at):
        asked = build_prompt(text[:cursor], text[cursor:], "python", [], settings, 1 << 20, URI)
        shared = len(asked.split("<|fim_suffix|>")[0]) - len("value_1 = 1\n")
        assert asked[:shared] == head[:shared]


async def _warm_ups(ed, after: int = 0) -> list[dict]:
    seen = (await ed.request("flywheel/test/requests", {}))["requests"][after:]
    return [r for r in seen if r["maxTokens"] == 1]


async def _until(found) -> list[dict]:
    for _ in range(600):  # until the server has handled it (notifications have no answer)
        got = await found()
        if got:
            return got
        await asyncio.sleep(0.05)
    return []


@pytest.mark.asyncio(loop_scope="module")
async def test_the_server_warms_the_head_of_a_document_when_it_opens(replay_editor):
    """Through the real server: opening a document prefills, in the prefetch lane, the prompt of
    a completion at its end (a short file: all of it is the prefix)."""
    ed = replay_editor
    uri = (ed.root / "geometry" / "volume.py").as_uri()
    before = len((await ed.request("flywheel/test/requests", {}))["requests"])
    ed.open(uri, TEXT)
    warm = await _until(lambda: _warm_ups(ed, before))
    assert [r["priority"] for r in warm] == ["prefetch"]
    assert "<|file_sep|>geometry/volume.py\n<|fim_prefix|>import os\n" in warm[0]["prompt"]
    assert warm[0]["prompt"].endswith("<|fim_suffix|><|fim_middle|>")


@pytest.mark.asyncio(loop_scope="module")
async def test_the_server_warms_where_the_client_says_the_cursor_rests(replay_editor):
    """Through the real server: `flywheel/cursorIdle` at the document's version gives one
    prefill of the very prompt the completion there then sends; one for an old version, none."""
    ed = replay_editor
    path = ed.root / "geometry" / "area.py"
    uri = path.as_uri()
    start = len((await ed.request("flywheel/test/requests", {}))["requests"])
    ed.open(uri, TEXT)
    line = TEXT[:CURSOR].count("\n")
    at = {"line": line, "character": CURSOR - TEXT.rfind("\n", 0, CURSOR) - 1}

    def rest(version: int) -> None:
        ed.client.protocol.notify(
            "flywheel/cursorIdle",
            {"textDocument": {"uri": uri, "version": version}, "position": at},
        )

    async def seen() -> list[dict]:
        return (await ed.request("flywheel/test/requests", {}))["requests"]

    assert await _until(lambda: _warm_ups(ed, start)), "the open warms the document's head first"
    before = len(await seen())
    rest(0)  # a version the document has left: nothing to warm
    rest(1)
    warm = await _until(lambda: _warm_ups(ed, before))
    assert [r["priority"] for r in warm] == ["prefetch"]
    assert f"<|repo_name|>{ed.root.name}\n" in warm[0]["prompt"]
    assert "<|file_sep|>geometry/area.py\n" in warm[0]["prompt"]
    assert (await ed.request("flywheel/test/replay", {"turns": ["width * height"]}))["loaded"]
    result = await ed.client.text_document_inline_completion_async(
        inline_params(uri, at["line"], at["character"])
    )
    assert result.items[0].insert_text == "width * height"
    asked = (await seen())[-1]
    assert asked["priority"] == "interactive" and asked["prompt"] == warm[0]["prompt"]
