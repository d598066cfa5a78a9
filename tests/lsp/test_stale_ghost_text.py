"""Stale ghost text: a suggestion the user rejected or moved past is never offered again.

CompletionService (lsp/completion.py) is driven directly with a scripted engine that answers
each prompt with the next text of a list and counts its calls, so each test shows whether an
answer came from the model, the cache or typed-through.
"""

from __future__ import annotations

import asyncio

import pytest
from lsprotocol import types

from agent.engine import Completion, RequestMetrics, Result
from lsp.completion import Ask, CompletionService
from lsp.settings import CompletionSettings, ModelSettings
from tests.lsp.conftest import inline_params

SETTINGS = CompletionSettings(debounce_ms=0)
URI = "file:///w/main.py"


class ScriptedEngine:
    context_length = 4096
    model_version = "scripted-1"

    def __init__(self, answers: list[str]) -> None:
        self.answers, self.calls, self.requests = list(answers), 0, []

    def generate(self, request) -> Result:
        """The next answer, cut at the request's first stop string (from `stop_after` on)."""
        self.calls += 1
        self.requests.append(request)
        text = self.answers.pop(0) if self.answers else ""
        p = request.params
        cuts = [i for s in p.stop if (i := text.find(s, p.stop_after)) >= 0]
        text = text[: min(cuts)] if cuts else text
        done = Completion(
            text=text,
            token_ids=[1],
            logprobs=None,
            finish_reason="stop",
            model_version=self.model_version,
        )
        return Result([done], RequestMetrics(prompt_tokens=1, output_tokens=1))


class Host:
    """The part of ModelHost the service uses, without threads."""

    def __init__(self, engine: ScriptedEngine) -> None:
        self.engine = engine
        self.version = engine.model_version
        self.show_min = None

    async def get(self, settings):
        return self.engine

    async def call(self, fn, request):
        return fn(request)

    def error_once(self, message: str) -> None:
        raise AssertionError(message)


def service(*answers: str) -> tuple[CompletionService, ScriptedEngine, list]:
    engine, rows = ScriptedEngine(list(answers)), []

    def record(what: str, /, **fields) -> str:
        rows.append((what, fields))
        return "id"

    return CompletionService(Host(engine), record), engine, rows


def complete(svc: CompletionService, text: str, offset: int, version: int = 1):
    return asyncio.run(
        svc.complete(
            Ask(
                uri=URI,
                version=version,
                text=text,
                offset=offset,
                language="python",
                neighbours=[],
                settings=SETTINGS,
                model=ModelSettings(),
            ),
            "invoked",
        )
    )


def test_typing_through_an_open_suggestion_continues_it_without_the_model():
    svc, engine, _ = service("range(10):")
    first = complete(svc, "for i in ", 9)
    typed = complete(svc, "for i in ra", 11, version=2)
    assert (typed.id, typed.text, engine.calls) == (first.id, "nge(10):", 1)


def test_a_rejected_suggestion_is_not_offered_again_as_the_user_types_it():
    svc, engine, _ = service("range(10):", "enumerate(xs):")
    first = complete(svc, "for i in ", 9)
    svc.resolve(first.id, "rejected")  # Esc
    again = complete(svc, "for i in r", 10, version=2)
    assert engine.calls == 2 and again.text == "enumerate(xs):"  # the model, not the old text


def test_a_rejected_suggestion_is_dropped_from_the_cache():
    svc, engine, _ = service("range(10):", "zip(a, b):")
    first = complete(svc, "for i in ", 9)
    svc.resolve(first.id, "rejected")
    again = complete(svc, "for i in ", 9, version=2)
    assert engine.calls == 2 and again.text == "zip(a, b):"


def test_a_cached_answer_is_not_offered_once_another_model_version_serves():
    """After a reload or a promotion the new model answers, even at a place the old one was
    asked: a cached answer is never shown, nor logged, as the new version's."""
    svc, engine, _ = service("range(10):", "x + 1", "enumerate(xs):")
    text = "for i in \nz = \n"
    complete(svc, text, 9)
    complete(svc, text, 14, version=1)  # elsewhere: the first is superseded, still cached
    svc.host.version = engine.model_version = "scripted-2"  # the server swapped the model
    back = complete(svc, text, 9, version=1)
    assert engine.calls == 3 and back.text == "enumerate(xs):"
    assert back.model_version == "scripted-2"


def test_a_superseded_suggestion_comes_back_only_at_its_own_place():
    svc, engine, _ = service("range(10):", "x + 1", "y + 2")
    text = "for i in \nz = \n"
    first = complete(svc, text, 9)  # line 0
    elsewhere = complete(svc, text, 14, version=1)  # line 1 supersedes it
    assert elsewhere.text == "x + 1" and engine.calls == 2
    back = complete(svc, text, 9, version=1)  # back at its place: the cache, the same text
    assert back.text == first.text and back.id != first.id and engine.calls == 2
    # the same text before the cursor at another offset (a line duplicated above) is no hit
    moved = "z = 0\n" + text
    other = complete(svc, moved, 9 + 6, version=2)
    assert engine.calls == 3 and other.text == "y + 2"


@pytest.mark.asyncio(loop_scope="module")
async def test_an_answer_for_text_the_user_has_typed_past_is_not_offered(replay_editor):
    """Through the real server: the model answers after the document changed. The answer would
    be drawn at the old cursor (Neovim draws late answers), so none is given; the suggestion
    still goes on, typed through, for the request the new text brings."""
    ed = replay_editor
    uri = (ed.root / "typed.py").as_uri()
    ed.open(uri, "def area(width, height):\n    return ")
    turn = {"waitForRelease": True, "text": "width * height"}
    assert (await ed.request("flywheel/test/replay", {"turns": [turn]}))["loaded"]
    asking = asyncio.ensure_future(
        ed.client.text_document_inline_completion_async(inline_params(uri, 1, 11))
    )
    assert (await ed.request("flywheel/test/held", {}))["held"]  # the model is running
    ed.change(uri, types.Range(start=types.Position(1, 11), end=types.Position(1, 11)), "w")
    await ed.request("flywheel/test/release", {})
    assert await asking is None
    again = await ed.client.text_document_inline_completion_async(inline_params(uri, 1, 12))
    assert again is not None and again.items[0].insert_text == "idth * height"


def test_a_suggestion_on_an_empty_line_among_statements_is_the_next_line():
    """The cursor at a line start is token-healed: the model writes the line break and the
    indentation the prompt left out before the line, so the line's own end is the stop."""
    svc, engine, _ = service("\n    return total\n\nprint(total)")
    text = "def f(items):\n    total = sum(items)\n    "
    assert complete(svc, text, len(text)).text == "return total"
    (request,) = engine.requests
    assert request.params.stop[0] == "\n" and request.params.stop_after == len("\n    ")
