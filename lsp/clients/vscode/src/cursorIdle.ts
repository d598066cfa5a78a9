// Where the cursor rests (flywheel/cursorIdle): when the cursor has stayed put for REST_MS in
// the active editor (a file opened, a click, a pause in typing), the server is told, and it
// prefills the prompt a completion there would send. The first keystroke then finds it computed.
//
// What it does not do: ask for a suggestion (nothing is drawn), or send while the user types
// (every change or move restarts the wait).

import * as vscode from "vscode";
import { CURSOR_IDLE, Wire } from "./wire";

export const REST_MS = 500;

export class CursorIdle implements vscode.Disposable {
  private timer: NodeJS.Timeout | undefined;
  private readonly subscriptions: vscode.Disposable[];

  constructor(
    private readonly wire: Wire,
    private readonly enabled: () => boolean,
  ) {
    this.subscriptions = [
      vscode.window.onDidChangeTextEditorSelection((e) => this.moved(e.textEditor)),
      vscode.window.onDidChangeActiveTextEditor((e) => e && this.moved(e)),
    ];
    if (vscode.window.activeTextEditor) this.moved(vscode.window.activeTextEditor);
  }

  private moved(editor: vscode.TextEditor): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = setTimeout(() => this.rest(editor), REST_MS);
  }

  private rest(editor: vscode.TextEditor): void {
    this.timer = undefined;
    const doc = editor.document;
    if (!this.enabled() || editor !== vscode.window.activeTextEditor) return;
    if (doc.uri.scheme !== "file" && doc.uri.scheme !== "untitled") return; // not synced
    const at = editor.selection.active;
    this.wire.notify(CURSOR_IDLE, {
      textDocument: { uri: doc.uri.toString(), version: doc.version },
      position: { line: at.line, character: at.character },
    });
  }

  dispose(): void {
    if (this.timer) clearTimeout(this.timer);
    for (const s of this.subscriptions) s.dispose();
  }
}
