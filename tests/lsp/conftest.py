"""A real client for `flywheel lsp` running as a subprocess over stdio (pytest-lsp).

`Editor` plays the editor's part: it keeps its own copy of each open document, applies the
server's `workspace/applyEdit` requests to it and sends the matching `didChange` (as VS Code and
Neovim do), and collects the server's custom notifications. Tests wait on notifications and
responses, never on sleeps. The server runs with `--manual-clock`, so survival checks happen when a
test advances time (`flywheel/debug/advanceClock`).
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from lsprotocol import types
from pygls import uris
from pytest_lsp import ClientServerConfig, LanguageClient

from lsp.documents import offset_at
from lsp.protocol import plain


def server_command(*args: str) -> list[str]:
    """`flywheel lsp ARGS` once agent/cli.py knows the command; `python -m lsp.cli` until then."""
    from agent.cli import COMMANDS

    if "lsp" in COMMANDS:
        return [sys.executable, "-m", "agent.cli", "lsp", *args]
    return [sys.executable, "-m", "lsp.cli", *args]


def replay_command(*args: str) -> list[str]:
    """`flywheel lsp ARGS` with a replay engine as the model (tests/lsp/replay_server.py)."""
    return [sys.executable, "-m", "tests.lsp.replay_server", *args]


# Sampling (not greedy): a random tiny model's greedy output is only special tokens.
SAMPLING_OPTIONS = {
    "completion": {"debounceMs": 0, "maxTokens": 8, "temperature": 1.0, "seed": 0},
    "agent": {"maxTokens": 24},
}


class Editor:
    def __init__(self, client: LanguageClient, db: Path) -> None:
        self.client = client
        self.db = db
        self.texts: dict[str, str] = {}
        self.versions: dict[str, int] = {}
        self.notes: dict[str, list[Any]] = defaultdict(list)
        self._waiters: dict[str, list[asyncio.Future]] = defaultdict(list)
        self.apply_edit_ok = True
        self.approval_answer: str | None = "Allow"  # the button pressed on showMessageRequest
        self.approval_asks: list[str] = []
        for method in ("flywheel/status", "flywheel/taskStep", "flywheel/proposal"):
            client.feature(method)(self._collector(method))

        def apply_edit(ls: LanguageClient, params: types.ApplyWorkspaceEditParams):
            return self._apply_edit(params)

        client.feature(types.WORKSPACE_APPLY_EDIT)(apply_edit)

        def show_request(ls: LanguageClient, params: types.ShowMessageRequestParams):
            self.approval_asks.append(params.message)
            answer = self.approval_answer
            return None if answer is None else types.MessageActionItem(title=answer)

        client.feature(types.WINDOW_SHOW_MESSAGE_REQUEST)(show_request)

    def _collector(self, method: str):
        def collect(ls: LanguageClient, params: Any) -> None:
            params = plain(params)
            self.notes[method].append(params)
            for fut in self._waiters.pop(method, []):
                if not fut.done():
                    fut.set_result(params)

        return collect

    async def next(self, method: str, timeout: float = 60) -> Any:
        """The next notification `method` from now on."""
        fut = asyncio.get_running_loop().create_future()
        self._waiters[method].append(fut)
        return await asyncio.wait_for(fut, timeout)

    def _apply_edit(self, params: types.ApplyWorkspaceEditParams) -> types.ApplyWorkspaceEditResult:
        if not self.apply_edit_ok:
            return types.ApplyWorkspaceEditResult(applied=False, failure_reason="user said no")
        for change in params.edit.document_changes or []:
            if isinstance(change, types.CreateFile):
                self.open(change.uri, "")
                continue
            uri = change.text_document.uri
            if change.text_document.version is None:  # the file as it is: open it, as editors do
                if uri not in self.texts:
                    self.open(uri, Path(uris.to_fs_path(uri)).read_text())
            elif change.text_document.version != self.versions[uri]:
                return types.ApplyWorkspaceEditResult(applied=False, failure_reason="version")
            for edit in change.edits:
                self.change(uri, edit.range, edit.new_text)
        return types.ApplyWorkspaceEditResult(applied=True)

    def open(self, uri: str, text: str, language: str = "python") -> None:
        self.texts[uri], self.versions[uri] = text, 1
        self.client.text_document_did_open(
            types.DidOpenTextDocumentParams(
                text_document=types.TextDocumentItem(
                    uri=uri, language_id=language, version=1, text=text
                )
            )
        )

    def change(self, uri: str, rng: types.Range, new_text: str) -> None:
        text = self.texts[uri]
        start, end = offset_at(text, rng.start), offset_at(text, rng.end)
        self.texts[uri] = text[:start] + new_text + text[end:]
        self.versions[uri] += 1
        self.client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(
                    uri=uri, version=self.versions[uri]
                ),
                content_changes=[types.TextDocumentContentChangePartial(range=rng, text=new_text)],
            )
        )

    async def command(self, name: str, *args: Any) -> Any:
        return await self.client.workspace_execute_command_async(
            types.ExecuteCommandParams(command=name, arguments=list(args))
        )

    async def request(self, method: str, params: Any) -> Any:
        return plain(await self.client.protocol.send_request_async(method, params))

    async def rows(self, table: str, **where: Any) -> list[dict[str, Any]]:
        """Rows of a telemetry table, after the server made everything durable."""
        await self.request("flywheel/debug/flush", {})
        if not self.db.exists():
            return []
        conn = sqlite3.connect(self.db)
        conn.row_factory = sqlite3.Row
        try:
            sql = f"SELECT * FROM {table}"
            if where:
                sql += " WHERE " + " AND ".join(f"{k} = ?" for k in where)
            return [dict(r) for r in conn.execute(sql, tuple(where.values()))]
        finally:
            conn.close()


def inline_params(uri: str, line: int, character: int, automatic: bool = False):
    """textDocument/inlineCompletion at (line, character): invoked, or automatic (typing)."""
    kind = types.InlineCompletionTriggerKind
    return types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri),
        position=types.Position(line=line, character=character),
        context=types.InlineCompletionContext(
            trigger_kind=kind.Automatic if automatic else kind.Invoked
        ),
    )


def capabilities(progress: bool = True) -> types.ClientCapabilities:
    return types.ClientCapabilities(
        workspace=types.WorkspaceClientCapabilities(
            apply_edit=True,
            configuration=True,
            workspace_edit=types.WorkspaceEditClientCapabilities(
                document_changes=True, resource_operations=[types.ResourceOperationKind.Create]
            ),
        ),
        window=types.WindowClientCapabilities(work_done_progress=progress),
        text_document=types.TextDocumentClientCapabilities(
            inline_completion=types.InlineCompletionClientCapabilities(),
            code_action=types.CodeActionClientCapabilities(
                code_action_literal_support=types.ClientCodeActionLiteralOptions(
                    code_action_kind=types.ClientCodeActionKindOptions(
                        value_set=[types.CodeActionKind.QuickFix, types.CodeActionKind.Empty]
                    )
                )
            ),
        ),
    )


async def start_editor(
    tmp_path: Path,
    model: str,
    options: dict[str, Any] | None = None,
    extra_args: tuple[str, ...] = (),
    root: Path | None = None,
    folders: tuple[Path, ...] = (),
) -> Editor:
    """Start a server (`model` "replay": the replay launcher) and initialize it for `root` (and
    the workspace `folders` of a multi-root workspace)."""
    db = tmp_path / "telemetry.db"
    command = replay_command if model == "replay" else server_command
    config = ClientServerConfig(
        server_command=command("--model", model, "--db", str(db), "--manual-clock", *extra_args)
    )
    client = await config.start()
    editor = Editor(client, db)
    await client.initialize_session(
        types.InitializeParams(
            capabilities=capabilities(),
            client_info=types.ClientInfo(name="pytest-editor"),
            root_uri=(root or tmp_path).as_uri(),
            workspace_folders=[types.WorkspaceFolder(uri=f.as_uri(), name=f.name) for f in folders]
            or None,
            initialization_options=options or {"completion": {"debounceMs": 0, "maxTokens": 12}},
        )
    )
    return editor


async def stop_editor(editor: Editor) -> None:
    try:
        await asyncio.wait_for(editor.client.shutdown_session(), timeout=30)
    finally:
        await editor.client.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def editor(tmp_path_factory, tiny_checkpoint: Path):
    """One server per test module (start-up costs seconds); tests use their own documents.

    Modules that use it set `pytestmark = pytest.mark.asyncio(loop_scope="module")`: the fixture's
    and the tests' loop scopes must be equal, or pytest-asyncio hangs.
    """
    ed = await start_editor(tmp_path_factory.mktemp("lsp"), str(tiny_checkpoint), SAMPLING_OPTIONS)
    yield ed
    await stop_editor(ed)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def replay_editor(tmp_path_factory):
    """One replay-model server per test module (tests/lsp/replay_server.py), its workspace root
    in `.root`; the same loop-scope rule as `editor`."""
    tmp = tmp_path_factory.mktemp("replay")
    ed = await start_editor(tmp, "replay", root=tmp)
    ed.root = tmp
    yield ed
    await stop_editor(ed)


@pytest.fixture
def doc_uri(tmp_path: Path) -> str:
    return (tmp_path / "main.py").as_uri()
