"""The wire of the language server: the custom messages' types, and a JSON-RPC envelope in which
every request with an id gets an answer.

Custom messages (all names under `flywheel/`; the clients in lsp/clients use them):
  server -> client notifications
    flywheel/status       {state: loading|idle|busy|error|stopped, modelVersion, message,
                           progress?: {percentage, message}}   progress: while a first start
                          prepares the model (the same reports as the $/progress)
    flywheel/taskStep     {taskId, index, role, text, kind, ...}      each harness step as it
                          happens; kind: instruction | assistant (+calls) | tool (+name,
                          isError) | approval_request (+calls) | approval | compact | stop
    flywheel/proposal     {proposalId, taskId, uri, version, hunks: [{index, range, original,
                           newText, state}]}                         edits awaiting review
  client -> server requests (typed below: `NextEditParams`, `NextEditResult`)
    flywheel/nextEdit     {textDocument: {uri, version}, position?} -> null | {uri, version,
                          range, newText, suggestionId, command}: the edit the user will likely
                          make next, near their last edit (next_edit.py). Refused with
                          ContentModified (-32801) when `version` is not the document's version,
                          before or after the model ran; the client applies it only at `version`
                          and runs `command` (flywheel.acceptCompletion) when it does.
  client -> server notifications (typed below: `CompletionEventParams`, `CursorIdleParams`)
    flywheel/completionShown              {suggestionId}
    flywheel/completionPartiallyAccepted  {suggestionId, acceptedChars}
    flywheel/completionRejected           {suggestionId}
    flywheel/cursorIdle                   {textDocument: {uri, version}, position}: the cursor
                          rests there (the user reads, or opened the file); the server prefills
                          the prompt a completion there would send, so the first keystroke
                          finds it computed (completion.py `CompletionService.warm`)
  test-only requests (`flywheel lsp --manual-clock`)
    flywheel/debug/advanceClock  {seconds} -> {checks, flushed}
    flywheel/debug/flush         {} -> {flushed}
  server -> client requests
    window/showMessageRequest  an agent action needs approval: "Allow" | "Deny" | "Stop the task"
                               (no answer within agent.approvalTimeoutS: denied)

The custom messages' params are attrs classes, structured with lsprotocol's converter like the
standard ones (snake_case fields, camelCase on the wire): `FlywheelProtocol.get_message_type`
returns them for their methods, as lsprotocol's table does for standard methods.

pygls structures each message while `json.loads` parses it (as its object hook) and, when a
message does not fit its type, raises from inside the parser: the id is lost, no answer is sent
and the client waits forever. `FlywheelProtocol` parses first and structures afterwards, once,
for the whole message, so that it can answer per the JSON-RPC 2.0 and LSP specifications:

    broken JSON (or not UTF-8, or nested too deep)     -32700 Parse error, id null
    not an object, no method and no id, a bad id,      -32600 Invalid Request (id null when the
      jsonrpc not "2.0", a request after shutdown             id itself is unusable)
    a method the server does not have                  -32601 Method not found
    params that do not fit the method                  -32602 Invalid params, naming the method

Notifications never get an answer (the specification forbids it); one that does not fit is
dropped and logged once per kind. A reply from the client that does not fit the request the
server sent (`workspace/configuration` answered with `null`) fails that request at once, so
nothing waits for a timeout. Log lines never carry a traceback and repeat once per kind at
most, so a hostile client cannot grow the log or the memory.

Parse errors are answered by `FlywheelProtocol.report_error`, which the server calls when pygls
reports that `json.loads` failed.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import attrs
from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcMethodNotFound
from pygls.protocol import JsonRPCNotification, JsonRPCRequestMessage, LanguageServerProtocol
from pygls.protocol.json_rpc import JsonRPCResponseMessage, ResponseErrorMessage

log = logging.getLogger("flywheel.lsp")

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
CONTENT_MODIFIED = -32801  # LSP's ContentModified: the document changed; the answer is void
REQUEST_FAILED = -32803  # LSP's RequestFailed: the request was valid but could not be done

STATUS = "flywheel/status"
TASK_STEP = "flywheel/taskStep"
PROPOSAL = "flywheel/proposal"
NEXT_EDIT = "flywheel/nextEdit"
COMPLETION_SHOWN = "flywheel/completionShown"
COMPLETION_PARTIALLY_ACCEPTED = "flywheel/completionPartiallyAccepted"
COMPLETION_REJECTED = "flywheel/completionRejected"
CURSOR_IDLE = "flywheel/cursorIdle"
ADVANCE_CLOCK = "flywheel/debug/advanceClock"
FLUSH = "flywheel/debug/flush"


# -- custom message types ------------------------------------------------------------------------


@attrs.define
class NextEditParams:
    text_document: types.OptionalVersionedTextDocumentIdentifier  # version None: any version
    position: types.Position | None = None  # the cursor, a second anchor for the region


@attrs.define
class NextEditResult:
    uri: str
    version: int  # the document version `range` is in; apply it only there
    range: types.Range
    new_text: str
    suggestion_id: str
    command: types.Command  # flywheel.acceptCompletion, to run once applied


@attrs.define
class NextEditRequest:
    id: int | str
    params: NextEditParams
    method: str = NEXT_EDIT
    jsonrpc: str = "2.0"


@attrs.define
class CompletionEventParams:
    suggestion_id: str
    accepted_chars: int | None = None  # flywheel/completionPartiallyAccepted only


@attrs.define
class CompletionEventNotification:
    """The three completion lifecycle notifications; `method` says which."""

    params: CompletionEventParams
    method: str = COMPLETION_SHOWN
    jsonrpc: str = "2.0"


@attrs.define
class CursorIdleParams:
    text_document: types.VersionedTextDocumentIdentifier  # the version the position is in
    position: types.Position


@attrs.define
class CursorIdleNotification:
    params: CursorIdleParams
    method: str = CURSOR_IDLE
    jsonrpc: str = "2.0"


@attrs.define
class AdvanceClockParams:
    seconds: float = attrs.field(default=0.0, validator=attrs.validators.ge(0))


@attrs.define
class AdvanceClockRequest:
    id: int | str
    params: AdvanceClockParams
    method: str = ADVANCE_CLOCK
    jsonrpc: str = "2.0"


MESSAGE_TYPES: dict[str, type] = {
    NEXT_EDIT: NextEditRequest,
    COMPLETION_SHOWN: CompletionEventNotification,
    COMPLETION_PARTIALLY_ACCEPTED: CompletionEventNotification,
    COMPLETION_REJECTED: CompletionEventNotification,
    CURSOR_IDLE: CursorIdleNotification,
    ADVANCE_CLOCK: AdvanceClockRequest,
}


# -- the envelope ---------------------------------------------------------------------------------


def short(value: Any, limit: int = 200) -> str:
    """One line of at most `limit` characters, for logs and error messages."""
    text = " ".join(str(value).split())
    return text if len(text) <= limit else text[:limit] + "…"


def plain(value: Any) -> Any:
    """Params of a method without a type (pygls gives them as namedtuples) as plain dicts."""
    if hasattr(value, "_asdict"):
        return {k: plain(v) for k, v in value._asdict().items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def _usable_id(value: Any) -> bool:
    return type(value) in (int, str)


def _reason(exc: BaseException) -> str:
    """The first line of a structuring error, short (cattrs' messages can be long)."""
    notes = getattr(exc, "exceptions", None)
    if notes:  # cattrs' ClassValidationError: the first field that failed says most
        return _reason(notes[0])
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:200]


class _WriterAfterExit:
    """The output once `exit` arrived: pygls closes it, and the answers of requests that were
    still running (cancelled now) are dropped instead of failing on the closed stream."""

    def __init__(self, writer: Any) -> None:
        self.writer = writer
        self.closed = False

    def close(self) -> Any:
        self.closed = True
        return self.writer.close()

    def write(self, data: bytes) -> None:
        if not self.closed:
            self.writer.write(data)


class FlywheelProtocol(LanguageServerProtocol):
    """pygls' LSP protocol with the checks above; pass it as `protocol_cls`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sent: set[str] = set()  # ids of requests this server sent and awaits
        self._logged: set[str] = set()

    def log_once(self, kind: str, message: str) -> None:
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning("%s", message)

    def report_error(self, error: Exception, source: Any) -> None:
        """What pygls reports (`LanguageServer.report_server_error`). A message that is not JSON
        (or not UTF-8, or nested too deep to parse): answer JSON-RPC's parse error (id null) and
        log once. Anything else: log it once per kind, without a traceback (the requests
        themselves are answered in `_request`)."""
        parsing = source is JsonRpcException  # pygls' read loop: json.loads failed
        if parsing and isinstance(error, ValueError | RecursionError):  # also UnicodeDecodeError
            self.reply_error(None, PARSE_ERROR, f"Parse error: {short(error)}")
            if "parse" not in self._logged:
                self._logged.add("parse")
                log.error("a message from the client is not valid JSON: %s", short(error))
            return
        self.log_once(type(error).__name__, f"{type(error).__name__}: {short(error)}")

    def _send_handler_result(self, future: Any, *, msg_id: Any) -> None:
        """A handler's answer. An error a handler raised on purpose (JsonRpcException: a refusal
        such as ContentModified when the document moved on) is answered and logged as one line;
        pygls would log it with a traceback, as if the server had failed."""
        exc = None if future.cancelled() else future.exception()
        if not isinstance(exc, JsonRpcException):
            super()._send_handler_result(future, msg_id=msg_id)
            return
        self._request_futures.pop(msg_id, None)
        if exc.code == CONTENT_MODIFIED:  # expected whenever the user types on
            log.info("request %s refused: %s", msg_id, short(exc.message))
        else:
            log.warning("request %s refused: %s", msg_id, short(exc.message))
        self._send_response(msg_id, error=exc.to_response_error())

    def drop_answers_after_exit(self) -> None:
        """`exit` arrived: pygls closes the output next; answers still on their way are dropped."""
        if self.writer is not None and not isinstance(self.writer, _WriterAfterExit):
            self.writer = _WriterAfterExit(self.writer)

    def get_message_type(self, method: str) -> type | None:
        """The type of a method's message: the custom ones above, else lsprotocol's."""
        return MESSAGE_TYPES.get(method) or super().get_message_type(method)

    # -- parsing: structure later, not inside json.loads ---------------------------------------

    def structure_message(self, data: dict[str, Any]) -> Any:
        """json.loads' object hook, called for every object: keep them all as plain dicts."""
        return data

    def _structure(self, data: dict[str, Any]) -> Any:
        """What pygls' structure_message does for a whole message, without logging tracebacks."""
        if "method" not in data:
            cls = ResponseErrorMessage if "error" in data else JsonRPCResponseMessage
            if cls is JsonRPCResponseMessage:
                cls = self._result_types.pop(data["id"], None) or cls
        elif "id" in data:
            cls = self.get_message_type(data["method"]) or JsonRPCRequestMessage
        else:
            cls = self.get_message_type(data["method"]) or JsonRPCNotification
        return self._converter.structure(data, cls)

    def send_request(self, method: str, params: Any = None, callback: Any = None, msg_id=None):
        msg_id = msg_id if msg_id is not None else str(uuid.uuid4())
        self._sent.add(msg_id)
        return super().send_request(method, params, callback, msg_id)

    # -- dispatch ------------------------------------------------------------------------------

    def reply_error(self, msg_id: Any, code: int, message: str) -> None:
        error = {"code": code, "message": message}
        self._send_data({"jsonrpc": "2.0", "id": msg_id, "error": error})

    def handle_message(self, message: Any) -> None:
        if not isinstance(message, dict):
            return self.reply_error(None, INVALID_REQUEST, "a message must be a JSON object")
        if "method" in message:
            if "id" in message:
                return self._request(message)
            return self._notification(message)
        if "id" not in message:
            return self.reply_error(
                None, INVALID_REQUEST, "a message needs a method (request, notification) or an id"
            )
        return self._response(message)

    def _request(self, message: dict[str, Any]) -> None:
        msg_id, method = message["id"], message["method"]
        if not _usable_id(msg_id):
            return self.reply_error(None, INVALID_REQUEST, "id must be an integer or a string")
        if message.get("jsonrpc") != "2.0":
            return self.reply_error(msg_id, INVALID_REQUEST, 'jsonrpc must be "2.0"')
        if not isinstance(method, str):
            return self.reply_error(msg_id, INVALID_REQUEST, "method must be a string")
        if self._shutdown and method != "exit":
            return self.reply_error(msg_id, INVALID_REQUEST, "the server is shutting down")
        try:
            self._get_handler(method)
        except JsonRpcMethodNotFound:
            return self.reply_error(msg_id, METHOD_NOT_FOUND, f"Method Not Found: {method}")
        try:
            structured = self._structure(message)
        except Exception as exc:
            text = f"the params do not fit {method}: {_reason(exc)}"
            return self.reply_error(msg_id, INVALID_PARAMS, text)
        if getattr(structured, "id", None) != msg_id:  # a notification's method, sent with an id
            text = f"{method} is a notification: send it without an id"
            return self.reply_error(msg_id, INVALID_REQUEST, text)
        super().handle_message(structured)

    def _notification(self, message: dict[str, Any]) -> None:
        method = message["method"]
        if message.get("jsonrpc") != "2.0" or not isinstance(method, str):
            return self.log_once("bad-notification", "dropped a malformed notification")
        try:
            structured = self._structure(message)
        except Exception as exc:
            return self.log_once(
                f"unfit:{method}" if len(self._logged) < 64 else "unfit",
                f"dropped a {method} notification whose params do not fit: {_reason(exc)}",
            )
        super().handle_message(structured)

    def _response(self, message: dict[str, Any]) -> None:
        msg_id = message["id"]
        if not (_usable_id(msg_id) and msg_id in self._sent):
            return self.log_once("stray-response", "dropped a response to no request of ours")
        self._sent.discard(msg_id)
        try:
            if message.get("jsonrpc") != "2.0":
                raise ValueError('jsonrpc must be "2.0"')
            structured = self._structure(message)
        except Exception as exc:
            self._result_types.pop(msg_id, None)
            future = self._request_futures.pop(msg_id, None)
            error = JsonRpcException(
                code=INVALID_PARAMS, message=f"the client's reply does not fit: {_reason(exc)}"
            )
            if future is not None and not future.done():
                future.set_exception(error)
            return None
        super().handle_message(structured)
