// Next edit in VS Code: asks the server (flywheel/nextEdit) for the edit the user will likely
// make next, draws it as a diff where it applies, and lets Tab jump to it and apply it.
//
// When it asks: right after an inline completion was accepted (`accepted`; ghost text is held
// back until the answer, and while an edit is drawn), and after an edit pause
// (`flywheel.nextEdit.debounceMs` after the last change of the active document) when no ghost
// text is on screen. One
// request at a time per document: a newer one cancels the older; a version already asked about is
// not asked again. An answer for a version the document has left is dropped unseen, and the
// server's ContentModified error (-32801) is the normal way to say so.
//
// How it shows one: the range's current text struck through on a red background, the new text
// after it on a green one (several lines joined with " ⏎ "), and a hint. The context key
// `flywheel.nextEditVisible` is set while it is on screen, and the server hears
// flywheel/completionShown. Tab (flywheel.client.nextEditTab) jumps to it when the cursor is
// elsewhere, and applies it when the cursor is on its lines (only at the version it was made for;
// then the answer's command tells the server it was accepted). Escape
// (flywheel.client.nextEditDismiss) or any other change of the document clears it and sends
// flywheel/completionRejected. The Neovim client (lsp/clients/nvim) follows the same contract.
//
// What it does not do: choose the edit (the server does) or change text other than by Tab.

import * as vscode from "vscode";
import { COMPLETION_REJECTED, COMPLETION_SHOWN, CONTENT_MODIFIED, markShown, NEXT_EDIT, REQUEST_CANCELLED, Wire } from "./wire";

interface LspRange {
  start: { line: number; character: number };
  end: { line: number; character: number };
}

export interface NextEditAnswer {
  uri: string;
  version: number;
  range: LspRange;
  newText: string;
  suggestionId: string;
  command: { title: string; command: string; arguments?: unknown[] };
}

interface Drawn {
  answer: NextEditAnswer;
  uri: string;
  range: vscode.Range;
  lines: [number, number]; // first and last line the edit touches (Tab applies there)
}

const HINT = "  Tab to jump/accept, Esc to dismiss";

export class NextEdits implements vscode.Disposable {
  private drawn: Drawn | undefined;
  private inFlight = new Map<string, vscode.CancellationTokenSource>(); // uri -> its request
  private afterAccept = new Set<string>(); // uris whose request in flight follows an accept
  private asked = new Map<string, number>(); // uri -> the version last asked about
  private timer: NodeJS.Timeout | undefined;
  private readonly removed = vscode.window.createTextEditorDecorationType({
    backgroundColor: new vscode.ThemeColor("diffEditor.removedTextBackground"),
    textDecoration: "line-through",
  });
  // Two `after` decorations at one position: created and set in this order, VS Code draws the
  // new text first and the hint after it.
  private readonly hint = vscode.window.createTextEditorDecorationType({
    after: { color: new vscode.ThemeColor("editorCodeLens.foreground"), fontStyle: "italic" },
  });
  private readonly inserted = vscode.window.createTextEditorDecorationType({
    after: { backgroundColor: new vscode.ThemeColor("diffEditor.insertedTextBackground"), margin: "0 0 0 1em" },
  });
  private readonly subscriptions: vscode.Disposable[];

  constructor(
    private readonly wire: Wire,
    private readonly ghostShown: (doc: vscode.TextDocument) => boolean, // an edit pause then waits
  ) {
    this.subscriptions = [
      vscode.workspace.onDidChangeTextDocument((e) => this.onChange(e)),
      vscode.workspace.onDidCloseTextDocument((doc) => {
        if (this.drawn?.uri === doc.uri.toString()) this.clear(true);
      }),
      vscode.window.onDidChangeVisibleTextEditors(() => this.redraw()),
    ];
  }

  private settings() {
    const c = vscode.workspace.getConfiguration("flywheel.nextEdit");
    return { enabled: c.get<boolean>("enabled", true), debounceMs: c.get<number>("debounceMs", 800) };
  }

  /** A next edit is being asked for or drawn in `doc` (ghost text waits meanwhile). */
  busy(doc: vscode.TextDocument): boolean {
    const uri = doc.uri.toString();
    return this.afterAccept.has(uri) || this.drawn?.uri === uri;
  }

  /** An inline completion was accepted: ask now, at the cursor. */
  accepted(): void {
    const editor = vscode.window.activeTextEditor;
    if (editor) this.ask(editor.document, editor.selection.active, true);
  }

  /** Ask the server for the next edit in `doc` at its current version; `afterAccept`: right
   * after an accepted suggestion (ghost text waits for the answer). */
  async ask(doc: vscode.TextDocument, position: vscode.Position, afterAccept = false): Promise<void> {
    if (!this.settings().enabled) return;
    const uri = doc.uri.toString();
    const version = doc.version;
    if (this.asked.get(uri) === version) return;
    this.asked.set(uri, version);
    this.inFlight.get(uri)?.cancel();
    const cts = new vscode.CancellationTokenSource();
    this.inFlight.set(uri, cts);
    if (afterAccept) this.afterAccept.add(uri);
    else this.afterAccept.delete(uri);
    const params = {
      textDocument: { uri, version },
      position: { line: position.line, character: position.character },
    };
    let answer: NextEditAnswer | null = null;
    try {
      answer = await this.wire.request<NextEditAnswer | null>(NEXT_EDIT, params, cts.token);
    } catch (err: any) {
      const code = err?.code;
      if (!cts.token.isCancellationRequested && code !== CONTENT_MODIFIED && code !== REQUEST_CANCELLED) {
        this.wire.log(`[next edit] ${err?.message ?? err}`);
      }
      return;
    } finally {
      if (this.inFlight.get(uri) === cts) {
        this.inFlight.delete(uri);
        this.afterAccept.delete(uri);
      }
      cts.dispose();
    }
    if (!answer || cts.token.isCancellationRequested) return;
    const now = vscode.workspace.textDocuments.find((d) => d.uri.toString() === answer!.uri);
    if (!now || now.version !== answer.version) return; // never drawn on the wrong text
    this.show(answer);
  }

  private show(answer: NextEditAnswer): void {
    this.clear(true); // a newer edit replaces the one drawn
    const r = answer.range;
    const range = new vscode.Range(r.start.line, r.start.character, r.end.line, r.end.character);
    // A range that ends at a line start (whole lines) ends, for the eye, on the line before.
    const last = range.end.character === 0 && range.end.line > range.start.line ? range.end.line - 1 : range.end.line;
    this.drawn = { answer, uri: answer.uri, range, lines: [range.start.line, last] };
    if (!this.redraw()) {
      this.drawn = undefined; // not on screen: not shown
      return;
    }
    void vscode.commands.executeCommand("setContext", "flywheel.nextEditVisible", true);
    markShown(answer.suggestionId);
    this.wire.notify(COMPLETION_SHOWN, { suggestionId: answer.suggestionId });
  }

  /** Draw the edit in every visible editor of its document; false when there is none. */
  private redraw(): boolean {
    const d = this.drawn;
    if (!d) return false;
    const editors = vscode.window.visibleTextEditors.filter((e) => e.document.uri.toString() === d.uri);
    for (const editor of editors) {
      const doc = editor.document;
      const lineEnd = doc.lineAt(Math.min(d.lines[1], doc.lineCount - 1)).range.end;
      const struck = new vscode.Range(d.range.start, d.range.end.isAfter(lineEnd) ? lineEnd : d.range.end);
      const shown = d.answer.newText.replace(/\n$/, "").split("\n").map((l) => l.trim()).join(" ⏎ ");
      const at = new vscode.Range(lineEnd, lineEnd);
      editor.setDecorations(this.removed, struck.isEmpty ? [] : [struck]);
      editor.setDecorations(this.hint, [{ range: at, renderOptions: { after: { contentText: HINT } } }]);
      editor.setDecorations(this.inserted, shown ? [{ range: at, renderOptions: { after: { contentText: shown } } }] : []);
    }
    return editors.length > 0;
  }

  /** Forget the drawn edit; `rejected`: tell the server the user did not take it. */
  private clear(rejected: boolean): void {
    const d = this.drawn;
    this.drawn = undefined;
    if (!d) return;
    for (const editor of vscode.window.visibleTextEditors) {
      for (const type of [this.removed, this.inserted, this.hint]) editor.setDecorations(type, []);
    }
    void vscode.commands.executeCommand("setContext", "flywheel.nextEditVisible", false);
    if (rejected) this.wire.notify(COMPLETION_REJECTED, { suggestionId: d.answer.suggestionId });
  }

  /** Escape: dismiss the drawn edit. */
  dismiss(): void {
    this.clear(true);
  }

  /** Tab: jump to the drawn edit, or apply it when the cursor is already on its lines. */
  async tab(): Promise<void> {
    const d = this.drawn;
    if (!d) return;
    let editor = vscode.window.activeTextEditor;
    if (!editor || editor.document.uri.toString() !== d.uri) {
      editor = await vscode.window.showTextDocument(vscode.Uri.parse(d.uri));
    }
    const line = editor.selection.active.line;
    if (line < d.lines[0] || line > d.lines[1]) {
      editor.selection = new vscode.Selection(d.range.start, d.range.start);
      editor.revealRange(d.range, vscode.TextEditorRevealType.InCenterIfOutsideViewport);
      return;
    }
    const doc = editor.document;
    if (doc.version !== d.answer.version) {
      this.clear(true); // the text moved on (a change would have cleared it already)
      return;
    }
    this.clear(false); // before our own edit, so that it does not count as typed over
    this.afterAccept.add(d.uri); // ghost text waits until the next one has been asked for
    try {
      const applied = await editor.edit((b) => b.replace(d.range, d.answer.newText));
      if (!applied) {
        this.wire.notify(COMPLETION_REJECTED, { suggestionId: d.answer.suggestionId });
        return;
      }
      const end = doc.positionAt(doc.offsetAt(d.range.start) + d.answer.newText.replace(/\n$/, "").length);
      editor.selection = new vscode.Selection(end, end);
      const cmd = d.answer.command;
      await this.wire.command(cmd.command, ...(cmd.arguments ?? [])).then(undefined, (err: any) =>
        this.wire.log(`[next edit] ${cmd.command}: ${err?.message ?? err}`),
      );
      await this.ask(doc, end, true); // an accepted next edit may bring another
    } finally {
      if (!this.inFlight.has(d.uri)) this.afterAccept.delete(d.uri);
    }
  }

  private onChange(e: vscode.TextDocumentChangeEvent): void {
    if (e.contentChanges.length === 0) return;
    const uri = e.document.uri.toString();
    if (this.drawn?.uri === uri) this.clear(true); // typed over
    this.inFlight.get(uri)?.cancel();
    if (this.timer) clearTimeout(this.timer);
    const { enabled, debounceMs } = this.settings();
    if (!enabled || vscode.window.activeTextEditor?.document !== e.document) return;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      const editor = vscode.window.activeTextEditor;
      if (editor?.document === e.document && !this.ghostShown(e.document)) {
        void this.ask(editor.document, editor.selection.active);
      }
    }, debounceMs);
  }

  /** The server stopped: nothing drawn can be applied or reported any more. */
  reset(): void {
    this.clear(false);
    for (const cts of this.inFlight.values()) cts.cancel();
    this.inFlight.clear();
    this.asked.clear();
  }

  dispose(): void {
    if (this.timer) clearTimeout(this.timer);
    this.reset();
    for (const s of [...this.subscriptions, this.removed, this.inserted, this.hint]) s.dispose();
  }
}
