"""Inline completion: from a cursor position to one suggestion, with cancel-previous and a cache.

Vocabulary:
  suggestion    one model output offered at one cursor position (a `suggestions` row, kind
                "inline"); it carries an id that travels in the item's `command` arguments
  superseded    a newer request for the same document arrived: a running generation is
                cancelled (its engine request stops within one decoding step) and recorded
                `cancelled`; an unanswered earlier suggestion is recorded `superseded`
  typed-through the user typed the first characters of the open suggestion: the rest is
                offered at once under the same id, without calling the model, while its model
                still serves. A closed one (rejected, superseded, accepted) is not offered again
                as the user types: it would come back at a place the user has moved past
  repeat        a request for the same document version and cursor while the last suggestion
                there is still open and its model still serves (editors ask twice: on the
                change and on the cursor move) gets that same suggestion: one ghost text, one id
  cached        a model's answer is kept for its exact place (document, cursor offset, text
                around it): asked there again (the user typed a character and deleted it) it is
                offered anew without the model. Never at another position or line, never once
                another model version serves (after a reload or a promotion), and never
                again once the user rejected it (Esc): a rejection removes it from the cache

The prompt is the text before the cursor (at most `max_prefix_chars`, preceded by up to
`max_neighbour_chars` of other open documents of the same language), token-healed at a line
start (`heal`). With `prompt_style = "fim"` (the default: Qwen2.5-Coder is trained on it) it is
Qwen's repository-level fill-in-the-middle (`agent.chat_format.render_repo_fim`): the other
documents as files of the repository, then the current file's text before and after the cursor
(at most `max_suffix_chars`); with "prefix", for a model without those tokens, the other
documents each introduced by a comment naming them, then the text before the cursor
(`flywheel bench infill` measures both). Its
UTF-8 length is kept under the engine's context length minus the output budget: a byte-level
BPE never makes more tokens than bytes. A suggestion spans lines only where a block starts;
elsewhere it ends with its line (`stop_strings`, setting `multiline`).

A model whose folder holds a confidence threshold (agent/confidence.py; completion RL fits it)
shows only suggestions at or above it: the others are recorded, marked `withheld`, and not
offered.

What it does not do: talk LSP (server.py converts to and from lsprotocol types) or write
telemetry itself (it calls `record`, which the server binds to the session).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from agent.chat_format import END, EOS, SPECIAL_TOKENS, heal, render_repo_fim
from agent.confidence import worth_showing
from agent.engine import Cancelled, EngineError, Request, SamplingParams
from lsp.model_host import ModelHost
from lsp.settings import CompletionSettings, ModelSettings, NextEditSettings

log = logging.getLogger("flywheel.lsp")

LINE_COMMENT = {"python": "#", "shellscript": "#", "ruby": "#", "yaml": "#", "toml": "#", "r": "#"}
STOP = ["\n\n\n"]  # a blank gap ends a suggestion; the model's end-of-text token does too
BLOCK_OPENERS = (":", "{", "=>")  # a line ending so opens a block
BLOCK_WORDS = {"do", "then", "else"}  # so does a line whose last word is one of these


def stop_strings(prefix: str, settings: CompletionSettings) -> list[str]:
    """Where a suggestion at the end of `prefix` ends. With `multiline = "auto"`, as editors'
    inline completion does, it spans lines (up to a blank gap) only where a block starts: after
    a block opener on the cursor's line, or on an empty line whose last non-empty line above
    opens one (the body to write), or in an empty file. Anywhere else (the middle of a line,
    an empty line among statements) it ends with the line: that is what the user is writing
    next, and it costs a few tokens instead of the whole budget."""
    if settings.multiline == "always" or _opens_block(prefix):
        return list(STOP)
    return ["\n", *STOP]


def completion_stops(prefix: str, settings: CompletionSettings) -> tuple[list[str], int]:
    """(stop strings, stop_after) of an inline completion at the end of `prefix`: where it ends
    (`stop_strings`), counted only after the healed text its output starts with (`heal`), since a
    line break the prompt left out is not the end."""
    return stop_strings(prefix, settings), len(heal(prefix)[1])


def _opens_block(prefix: str) -> bool:
    """Whether the text before the cursor opens a block at the cursor (see `stop_strings`)."""
    lines = prefix.split("\n")
    if lines[-1].strip():  # the cursor's line has text: it must end with the opener
        words = lines[-1].split()
    else:
        above = [line for line in lines[:-1] if line.strip()]
        if not above:
            return True  # an empty file: whatever comes first
        words = above[-1].split()
    return words[-1].endswith(BLOCK_OPENERS) or words[-1] in BLOCK_WORDS


def suggestion_request(
    prompt: str,
    settings: CompletionSettings | NextEditSettings,
    stop: list[str],
    cancel: threading.Event,
    sid: str,
    priority: str,
    logprobs: bool = False,
    stop_after: int = 0,
) -> Request:
    """The engine request of a suggestion (inline or next edit): the settings' token budget,
    temperature and seed (negative: none), the suggestion's id as its request id; `logprobs` for
    a suggestion the model's confidence threshold judges (agent/confidence.py); `stop_after`:
    the length of the healed text its output starts with, where no stop string counts."""
    return Request(
        prompt=prompt,
        params=SamplingParams(
            max_tokens=settings.max_tokens,
            temperature=settings.temperature,
            seed=settings.seed if settings.seed >= 0 else None,
            stop=stop,
            stop_after=stop_after,
            logprobs=logprobs,
        ),
        cancel=cancel,
        request_id=sid,
        priority=priority,
    )


@dataclass
class Suggestion:
    id: str
    uri: str
    version: int
    offset: int  # cursor offset (code points) the text is inserted at
    prefix: str  # text before the cursor when it was made (for typed-through)
    text: str
    created_at: float
    resolution: str = ""  # accepted | rejected | superseded: the lifecycle has ended
    typed: int = 0  # characters of it the user typed through; `text` is the rest
    model_version: str = ""  # the model that made it (a repeat or a continuation needs the same)
    cache_key: str = ""  # its entry in the cache (dropped when the user rejects it)

    @property
    def resolved(self) -> bool:
        return bool(self.resolution)


@dataclass
class Inflight:
    token: object
    cancel: threading.Event
    suggestion_id: str | None = None
    row: dict[str, Any] | None = None  # what a cancelled row records, once the model runs


@dataclass
class Neighbour:
    uri: str
    text: str
    name: str = ""  # its path as the prompt names it (see `build_prompt`); "" = its file name


@dataclass(frozen=True)
class Ask:
    """A cursor a completion (or a warm-up) is asked at, and what it is asked with."""

    uri: str
    version: int
    text: str
    offset: int  # cursor offset (code points) in `text`
    language: str
    neighbours: list[Neighbour]  # other open documents of its language
    settings: CompletionSettings
    model: ModelSettings
    place: tuple[str, str] = ("", "")  # the names the prompt gives the document (`build_prompt`)

    def prompt(self, max_chars: int) -> str:
        """The prompt a completion here sends, `max_chars` at most (see `build_prompt`)."""
        return build_prompt(
            self.text[: self.offset],
            self.text[self.offset :],
            self.language,
            self.neighbours,
            self.settings,
            max_chars,
            uri=self.uri,
            place=self.place,
        )


PREFIX_STEP = 512  # characters: where a long prefix starts moves in steps of this size


def prompt_prefix(prefix: str, max_chars: int) -> str:
    """The end of `prefix` the prompt holds: at most `max_chars`, starting at a line start.

    The start moves in steps of `PREFIX_STEP` as the user types, not with every keystroke: the
    prompt's first tokens then stay the same from one request to the next, so the engine's
    prefix cache serves them and only the text near the cursor is computed again."""
    over = len(prefix) - max_chars
    if over <= 0:
        return prefix
    if max_chars <= PREFIX_STEP:
        return prefix[over:]
    start = -(-over // PREFIX_STEP) * PREFIX_STEP  # rounded up: at most max_chars remain
    line = prefix.find("\n", start, start + PREFIX_STEP // 2)
    return prefix[line + 1 if line >= 0 else start :]


def head_offset(text: str, max_prefix_chars: int) -> int:
    """Where the warm-up of a newly opened document puts its cursor: the end of `text`, or, when
    the text is longer than the prompt's prefix window, the start of the line that window ends
    in. A completion anywhere before that point sends a prompt whose prefix starts where this
    one's does (`prompt_prefix`), so the engine's prefix cache holds it up to that cursor."""
    if len(text) <= max_prefix_chars:
        return len(text)
    return text.rfind("\n", 0, max_prefix_chars) + 1


def build_prompt(
    prefix: str,
    suffix: str,
    language: str,
    neighbours: list[Neighbour],
    settings: CompletionSettings,
    max_prompt_bytes: int,
    uri: str = "",
    place: tuple[str, str] = ("", ""),
) -> str:
    """The prompt for a cursor between `prefix` and `suffix` in the document `uri` (see the
    module docstring), within `max_prompt_bytes`; the prefix is healed (`heal`): the model's text
    starts with the healed text. `place` is (repository, path) as the prompt names the document:
    the server passes the workspace folder's name and the path inside it, the names `flywheel
    train repo` trains with; empty, the document's folder and file name stand in."""
    prefix = prompt_prefix(prefix, settings.max_prefix_chars)
    prefix = heal(prefix)[0]
    fim = settings.prompt_style == "fim"
    suffix = suffix[: settings.max_suffix_chars] if fim else ""
    comment = LINE_COMMENT.get(language, "//")
    files: list[tuple[str, str]] = []  # other open documents: (name, text), within the budget
    budget = settings.max_neighbour_chars
    for n in neighbours:
        if budget <= 0:
            break
        files.append((n.name or _name(n.uri), n.text[:budget]))
        budget -= len(files[-1][1]) + len(files[-1][0])

    def render() -> str:
        if fim:
            repo, path = place[0] or _repo(uri), place[1] or _name(uri)
            return render_repo_fim(repo, files, path, prefix, suffix)
        return "".join(f"{comment} {name}\n{text}\n\n" for name, text in files) + prefix

    prompt = render()
    while len(prompt.encode("utf-8")) > max_prompt_bytes and (files or prefix or suffix):
        over = len(prompt.encode("utf-8")) - max_prompt_bytes
        cut = max(1, over // 3)  # a character is at most 4 UTF-8 bytes; cut in coarse steps
        if files:  # the first context file loses its start (or goes, once empty)
            name, text = files[0]
            files[0] = (name, text[cut:])
            if not files[0][1]:
                files.pop(0)
        elif prefix:
            prefix = prefix[cut:]
        else:
            suffix = suffix[: max(0, len(suffix) - cut)]
        prompt = render()
    return prompt


def _name(uri: str) -> str:
    """A document's file name, as the repository-level prompt names files."""
    return uri.rsplit("/", 1)[-1] or "untitled"


def _repo(uri: str) -> str:
    """The name of the folder that holds the document, as the prompt's repository name."""
    parts = uri.rstrip("/").split("/")
    return parts[-2] if len(parts) > 1 and parts[-2] else "workspace"


def clean_output(text: str, suffix: str, prefix: str = "") -> str:
    """Cut at end-of-text, remove other special tokens, remove the text healed from `prefix`
    (empty when the model did not write it: the suggestion would not fit the cursor), drop
    trailing blanks, and drop a tail that repeats the suffix."""
    for token in (EOS, END):
        cut = text.find(token)
        if cut >= 0:
            text = text[:cut]
    for token in SPECIAL_TOKENS:
        text = text.replace(token, "")
    healed = heal(prefix)[1]
    if healed:
        text = text[len(healed) :] if text.startswith(healed) else ""
    text = text.rstrip()
    head = suffix.lstrip()[:200]
    for size in range(min(len(text), len(head)), 0, -1):
        if text.endswith(head[:size]) and size >= 4:
            text = text[:-size].rstrip()
            break
    return text


class Cache:
    """A small LRU of (context key -> text) with an age limit."""

    def __init__(self, size: int, ttl_s: float, clock: Callable[[], float]) -> None:
        self.size, self.ttl_s, self.clock = size, ttl_s, clock
        self._items: OrderedDict[str, tuple[str, float]] = OrderedDict()

    @staticmethod
    def key(*parts: str) -> str:
        h = hashlib.sha256()
        for p in parts:
            h.update(p.encode("utf-8", "surrogatepass"))
            h.update(b"\x00")
        return h.hexdigest()

    def get(self, key: str) -> str | None:
        item = self._items.get(key)
        if item is None or self.clock() - item[1] > self.ttl_s:
            self._items.pop(key, None)
            return None
        self._items.move_to_end(key)
        return item[0]

    def drop(self, key: str) -> None:
        self._items.pop(key, None)

    def put(self, key: str, text: str) -> None:
        self._items[key] = (text, self.clock())
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)


@dataclass
class CompletionService:
    host: ModelHost
    record: Callable[..., str | None]  # record(kind, **fields), bound to the session
    clock: Callable[[], float] = time.monotonic
    cache: Cache | None = None
    suggestions: OrderedDict[str, Suggestion] = field(default_factory=OrderedDict)
    _inflight: dict[str, Inflight] = field(default_factory=dict)
    # uri -> (its cancel, (version, offset) warmed)
    _warming: dict[str, tuple[threading.Event, tuple[int, int]]] = field(default_factory=dict)
    _warmed: dict[str, tuple[int, int]] = field(default_factory=dict)  # uri -> (version, offset)
    _last: dict[str, str] = field(default_factory=dict)  # uri -> latest suggestion id
    continued: int = 0  # requests answered with the open suggestion (no row of their own)
    _opened: str | None = None  # the document an open warms last (`warm_opened`)

    async def complete(self, ask: Ask, trigger: str) -> Suggestion | None:
        """One suggestion at `ask`'s cursor, or None (superseded, empty, or engine error)."""
        uri, version, text, offset = ask.uri, ask.version, ask.text, ask.offset
        settings = ask.settings
        if self.cache is None or self.cache.size != settings.cache_size:
            self.cache = Cache(settings.cache_size, settings.cache_ttl_s, self.clock)
        warming = self._warming.pop(uri, None)
        if warming is not None:  # this request's own prefill goes first (see `warm`)
            warming[0].set()
        last = self.suggestions.get(self._last.get(uri, ""))
        same = last is not None and not last.resolved and last.model_version == self.host.version
        if same and (last.version, last.offset) == (version, offset):
            self.continued += 1
            return last  # the editor asked again for the same place: still the one ghost text
        with self._claim(uri) as me:
            prefix, suffix = text[:offset], text[offset:]
            # Typed-through: the user typed the start of the open suggestion, which goes on
            # under its id (one ghost text, kept in part). A closed one is never offered again.
            typed = _typed_into(last, prefix) if same and last is not None else ""
            if typed:
                return self._continue(last, version, offset, prefix, typed)
            self._supersede_last(uri, prefix)
            key = Cache.key(
                self.host.version,  # the model that wrote it: never offered once another serves
                uri,
                str(offset),  # its place: never offered at another position or line
                prefix[-settings.max_prefix_chars :],
                suffix[: settings.max_suffix_chars],
            )
            cached = self.cache.get(key)
            if cached is not None:
                return self._remember(uri, version, offset, prefix, cached, None, key)
            if trigger == "automatic" and settings.debounce_ms:
                await asyncio.sleep(settings.debounce_ms / 1000)
                if me.cancel.is_set():
                    return None
            row = {
                "uri": uri,
                "version": version,
                "language": ask.language,
                "trigger": trigger,
                "prefix": prefix,
                "suffix": suffix,
            }
            output = await self._generate(me, row, ask)
            if output is None:
                return None
            self.cache.put(key, output)
            return self._remember(uri, version, offset, prefix, output, me.suggestion_id, key)

    async def warm(self, ask: Ask) -> bool:
        """Prefill the prompt a completion at `ask`'s cursor would send, in the prefetch lane, and
        nothing more: the engine's prefix cache then holds it, and the user's first request
        there computes only what was typed since (and the text after the cursor). Nothing is
        suggested or recorded. Skipped while a completion for `uri` runs, or when this place was
        warmed last or is being warmed; a warm-up of another place in `uri` gives way to it (the
        cursor moved), and a completion for `uri` cancels a warm-up still running (the engine
        stores a prompt only once it is complete, so the completion's own prefill must go
        first). Returns whether the prompt was prefilled."""
        uri, here = ask.uri, (ask.version, ask.offset)
        running = self._warming.get(uri)
        if uri in self._inflight or here in (self._warmed.get(uri), running and running[1]):
            return False
        if running is not None:
            running[0].set()
        cancel = threading.Event()
        self._warming[uri] = (cancel, here)
        try:
            engine = await self.host.get(ask.model)
            if cancel.is_set():
                return False
            request = Request(
                prompt=ask.prompt(engine.context_length - ask.settings.max_tokens - 8),
                params=SamplingParams(max_tokens=1, temperature=0.0, logprobs=False),
                cancel=cancel,
                priority="prefetch",
            )
            result = await self.host.call(engine.generate, request)
        except EngineError as exc:  # the model failed to load (said once) or to run
            log.info("warming %s failed: %s", uri, exc)
            return False
        finally:
            if self._warming.get(uri, (None,))[0] is cancel:
                del self._warming[uri]
        done = result.completions[0].finish_reason != "cancelled" and not cancel.is_set()
        if done:
            if len(self._warmed) >= 256:  # documents warmed long ago: forget them
                self._warmed.clear()
            self._warmed[uri] = here
        return done

    async def warm_opened(self, ask: Ask) -> bool:
        """A document was opened: `warm` its head (`ask` at `head_offset`). One such warm-up at
        a time: an open cancels the warm-up of the document opened before it, if still running
        (an editor restoring a session opens many files at once; the last is the one in
        front)."""
        before = self._warming.get(self._opened or "")
        if before is not None and self._opened != ask.uri:
            before[0].set()
        self._opened = ask.uri
        return await self.warm(ask)

    async def _generate(self, me: Inflight, row: dict[str, Any], ask: Ask) -> str | None:
        """The model's text for the place `row` describes, recorded as a `suggestion` row; None
        when there is nothing to offer: the model failed, wrote nothing usable (recorded
        `ignored`), or a newer request superseded this one (recorded `cancelled`)."""
        try:
            engine = await self.host.get(ask.model)
        except EngineError:
            return None  # the host has logged it and sent the status once
        sid = uuid.uuid4().hex
        if me.cancel.is_set():  # superseded while the model loaded: still one row per request
            self._record_cancelled(sid=sid, **row)
            return None
        me.suggestion_id = sid
        me.row = {"sid": sid, **row}
        prefix, suffix, settings = row["prefix"], row["suffix"], ask.settings
        prompt = ask.prompt(engine.context_length - settings.max_tokens - 8)
        stop, stop_after = completion_stops(prefix, settings)
        # ahead of a running agent turn's next step
        show_min = self.host.show_min
        request = suggestion_request(
            prompt,
            settings,
            stop,
            me.cancel,
            sid,
            "interactive",
            show_min is not None,
            stop_after=stop_after,
        )
        started = time.perf_counter()
        try:
            result = await self.host.call(engine.generate, request)
        except (Cancelled, asyncio.CancelledError) as exc:
            self._record_cancelled(**me.row)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return None
        except EngineError as exc:
            log.error("inline completion failed: %s", exc)
            self.host.error_once(str(exc))
            return None
        latency_ms = (time.perf_counter() - started) * 1000
        sample = result.completions[0]
        if sample.finish_reason == "cancelled" or me.cancel.is_set():
            self._record_cancelled(**me.row)
            return None
        output = clean_output(sample.text, suffix, prefix)
        m = result.metrics
        self.record(
            "suggestion",
            **self._suggestion_fields(**me.row, neighbours=ask.neighbours),
            output=output,
            latency_ms=latency_ms,
            ttft_ms=m.ttft_s * 1000,
            prompt_tokens=m.prompt_tokens,
            output_tokens=m.output_tokens,
            drafts_proposed=m.drafts_proposed,
            drafts_accepted=m.drafts_accepted,
            mean_acceptance_length=m.mean_acceptance_length,
            model_version=sample.model_version or engine.model_version,
        )
        if not output:
            self.record("suggestion_event", suggestion_id=sid, event="ignored")
            return None
        if not worth_showing(sample.logprobs, show_min):
            self.record("suggestion_event", suggestion_id=sid, event="withheld")
            return None
        return output

    @contextlib.contextmanager
    def _claim(self, uri: str) -> Iterator[Inflight]:
        """The in-flight slot of `uri`: a newer request for the same document cancels this one."""
        previous = self._inflight.pop(uri, None)
        if previous is not None:
            previous.cancel.set()
        me = Inflight(token=object(), cancel=threading.Event())
        self._inflight[uri] = me
        try:
            yield me
        finally:
            if self._inflight.get(uri) is me:
                del self._inflight[uri]

    def _remember(
        self,
        uri: str,
        version: int,
        offset: int,
        prefix: str,
        text: str,
        sid: str | None,
        cache_key: str = "",
    ) -> Suggestion:
        if sid is None:  # a cached or typed-through repeat: the same text, a new offer
            sid = uuid.uuid4().hex
            self.record(
                "suggestion",
                id=sid,
                kind="inline",
                trigger="cache",
                document_uri=uri,
                document_version=version,
                output=text,
                latency_ms=0.0,
            )
        s = Suggestion(
            sid,
            uri,
            version,
            offset,
            prefix,
            text,
            self.clock(),
            model_version=self.host.version,
            cache_key=cache_key,
        )
        self.suggestions[sid] = s
        self._last[uri] = sid
        while len(self.suggestions) > 256:
            self.suggestions.popitem(last=False)
        return s

    def _continue(
        self, last: Suggestion, version: int, offset: int, prefix: str, typed: str
    ) -> Suggestion:
        """The rest of the open suggestion `last`, after the user typed `typed` of it."""
        self.continued += 1
        s = replace(
            last,
            version=version,
            offset=offset,
            prefix=prefix,
            text=last.text[len(typed) :],
            typed=last.typed + len(typed),
        )
        self.suggestions[s.id] = s
        return s

    def offer(self, suggestion: Suggestion) -> None:
        """Register a suggestion made elsewhere (next edit) for the client's lifecycle events."""
        self.suggestions[suggestion.id] = suggestion
        while len(self.suggestions) > 256:
            self.suggestions.popitem(last=False)

    def abandon(self) -> None:
        """The server is going away: cancel every running generation and record it cancelled."""
        for uri, me in list(self._inflight.items()):
            me.cancel.set()
            if me.row is not None:
                self._record_cancelled(**me.row)
            del self._inflight[uri]

    def _supersede_last(self, uri: str, prefix: str) -> None:
        last = self.suggestions.get(self._last.get(uri, ""))
        if last is not None and not last.resolved:
            last.resolution = "superseded"
            self.record("suggestion_event", suggestion_id=last.id, event="superseded")

    @staticmethod
    def _suggestion_fields(
        sid: str,
        uri: str,
        version: int,
        language: str,
        trigger: str,
        prefix: str,
        suffix: str,
        neighbours: list[Neighbour],
    ) -> dict[str, Any]:
        """The fields of a `suggestion` row that are known before the model answers."""
        return {
            "id": sid,
            "kind": "inline",
            "trigger": trigger,
            "document_uri": uri,
            "document_version": version,
            "language": language,
            "context": _context(prefix, suffix, neighbours),
        }

    def _record_cancelled(self, **row: Any) -> None:
        self.record("suggestion", **self._suggestion_fields(**row, neighbours=[]))
        self.record("suggestion_event", suggestion_id=row["sid"], event="cancelled")

    def resolve(self, sid: str, event: str, accepted_chars: int | None = None) -> Suggestion | None:
        """Record a lifecycle event from the client; None for an unknown suggestion."""
        s = self.suggestions.get(sid)
        if s is None:
            return None
        if event in ("accepted", "rejected"):
            # A rejection the client sends after the server superseded the suggestion (the
            # next request overtook it) is the user's explicit "no": recorded, once.
            if event == "rejected" and s.resolution not in ("", "superseded"):
                return s
            s.resolution = event
            if event == "rejected" and s.cache_key and self.cache is not None:
                self.cache.drop(s.cache_key)  # the user said no: never offered again
        fields: dict[str, Any] = {}
        whole = s.typed + len(s.text)  # the suggestion as first shown
        if event == "accepted":
            fields["accepted_chars"] = whole
        elif accepted_chars is not None:
            fields["accepted_chars"] = max(0, min(int(accepted_chars), whole))
        self.record("suggestion_event", suggestion_id=sid, event=event, **fields)
        return s


def _typed_into(last: Suggestion, prefix: str) -> str:
    """What the user typed of the open suggestion `last` since it was offered: "" unless the
    text before the cursor goes on from where it was made into a start of it."""
    if not prefix.startswith(last.prefix) or len(prefix) <= len(last.prefix):
        return ""
    typed = prefix[len(last.prefix) :]
    return typed if last.text.startswith(typed) and len(typed) < len(last.text) else ""


def _context(prefix: str, suffix: str, neighbours: list[Neighbour]) -> dict[str, Any]:
    return {
        "prefix": prefix[-2000:],
        "suffix": suffix[:500],
        "neighbours": [n.uri for n in neighbours],
    }
