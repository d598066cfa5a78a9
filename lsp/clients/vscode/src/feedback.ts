// Inline-completion feedback: what the user saw and did with each ghost text, with the stable
// API only. vscode-languageclient provides the ghost text; its middleware lets this file see each
// answer (`provideInlineCompletionItems`), and the document, selection and editor events tell the
// rest. The contract is the Neovim client's (lsp/clients/nvim/lua/flywheel/suggestions.lua):
//
//   shown               the first item of an answer whose request was not cancelled went back
//                       to VS Code (flywheel/completionShown, once per suggestion)
//   accepted            the item's command ran (flywheel.acceptCompletion; the server records it)
//   partially accepted  the user kept a proper prefix of it: Accept Word / Accept Line, or typed
//                       the same characters; reported when its lifetime ends, with the characters
//                       kept in total (flywheel/completionPartiallyAccepted, UTF-16 units)
//   rejected            its lifetime ended with nothing kept: another edit, the cursor left, the
//                       editor changed, Escape, or a new suggestion replaced it
//
// Each suggestion gets at most one of accepted / partially accepted / rejected from here. An end
// is reported after a short grace period, because VS Code applies an accepted item's text before
// it runs the item's command, and that text may not look like a prefix.
//
// While a next edit is asked for or drawn in the document, ghost text is held back (no items), so
// that Tab has one meaning; the Neovim client does the same.
//
// What it does not do: render ghost text (VS Code does) or request completions.

import * as vscode from "vscode";
import {
  COMPLETION_PARTIALLY_ACCEPTED,
  COMPLETION_REJECTED,
  COMPLETION_SHOWN,
  markShown,
  suggestionIdOf,
  Wire,
} from "./wire";

const GRACE_MS = 500; // the accept command follows its edit within this

/** The next word of the ghost text's rest, as Neovim's Accept Word takes it (suggestions.lua
 * `next_word`): blanks, then any punctuation, then a word ("(a, b)" gives "(a"); punctuation
 * alone when no word follows it. */
export function nextWord(rest: string): string {
  const m = rest.match(/^\s*[^\w\s]*\w+/) ?? rest.match(/^\s*[^\w\s]+/) ?? rest.match(/^\s+/);
  return m ? m[0] : rest;
}

interface Shown {
  sid: string;
  uri: string;
  start: number; // document offset where the suggestion's text begins
  text: string;
  kept: number; // characters of `text` the user has kept so far
}

/** The active editor shows `document` with its cursor at `position` (else the ghost text would
 * be for a place the user has left, as after an edit the extension made itself). */
function cursorAt(document: vscode.TextDocument, position: vscode.Position): boolean {
  const editor = vscode.window.activeTextEditor;
  return editor?.document === document && editor.selection.active.isEqual(position);
}

export class InlineFeedback implements vscode.Disposable {
  private current: Shown | undefined;
  private ending = new Map<string, NodeJS.Timeout>(); // sid -> its report, due after the grace
  private done = new Set<string>(); // sids already resolved here (bounded below)
  private readonly subscriptions: vscode.Disposable[];

  constructor(
    private readonly wire: Wire,
    private readonly enabled: () => boolean,
    private readonly heldBack: (document: vscode.TextDocument) => boolean,
  ) {
    this.subscriptions = [
      vscode.workspace.onDidChangeTextDocument((e) => this.onChange(e)),
      vscode.window.onDidChangeTextEditorSelection((e) => this.onSelection(e)),
      vscode.window.onDidChangeActiveTextEditor((e) => {
        if (this.current && e?.document.uri.toString() !== this.current.uri) this.end();
      }),
    ];
  }

  /** vscode-languageclient's middleware.provideInlineCompletionItems. */
  readonly middleware = async (
    document: vscode.TextDocument,
    position: vscode.Position,
    context: vscode.InlineCompletionContext,
    token: vscode.CancellationToken,
    next: (...args: any[]) => vscode.ProviderResult<vscode.InlineCompletionItem[] | vscode.InlineCompletionList>,
  ): Promise<vscode.InlineCompletionItem[] | vscode.InlineCompletionList | null | undefined> => {
    if (!this.enabled() || this.heldBack(document) || !cursorAt(document, position)) return [];
    const result = await next(document, position, context, token);
    if (token.isCancellationRequested) return result;
    if (this.heldBack(document)) return []; // a next edit came first: Tab has one meaning
    if (!cursorAt(document, position)) return []; // the cursor moved on while it was made
    const items = Array.isArray(result) ? result : result?.items ?? [];
    if (items.length > 0) this.shown(document, position, items[0]);
    return result;
  };

  /** Ghost text from this file is on screen in `doc`. */
  showing(doc: vscode.TextDocument): boolean {
    return this.current?.uri === doc.uri.toString();
  }

  /** The item's command ran (flywheel.acceptCompletion): the server records it as accepted. */
  accepted(sid: string): void {
    if (this.current?.sid === sid) this.current = undefined;
    const due = this.ending.get(sid);
    if (due) clearTimeout(due);
    this.ending.delete(sid);
    this.remember(sid);
  }

  /** Accept Word (flywheel.client.acceptWord, Ctrl+Right): insert the ghost text's next word
   * (`nextWord`); VS Code's own takes only "(" of "(a, b)". The insertion counts as kept, and
   * VS Code keeps showing the rest. Without a suggestion of ours, VS Code's own command runs. */
  async acceptWord(): Promise<void> {
    const s = this.current;
    const editor = vscode.window.activeTextEditor;
    if (!s || !editor || editor.document.uri.toString() !== s.uri) {
      await vscode.commands.executeCommand("editor.action.inlineSuggest.acceptNextWord");
      return;
    }
    const word = nextWord(s.text.slice(s.kept));
    if (!word) return;
    await editor.edit((b) => b.insert(editor.document.positionAt(s.start + s.kept), word));
  }

  /** Escape (flywheel.client.inlineDismiss): hide the ghost text; its lifetime ends. */
  async dismiss(): Promise<void> {
    await vscode.commands.executeCommand("editor.action.inlineSuggest.hide");
    this.end();
  }

  dispose(): void {
    this.end();
    for (const s of this.subscriptions) s.dispose();
  }

  private shown(document: vscode.TextDocument, position: vscode.Position, item: vscode.InlineCompletionItem): void {
    const sid = suggestionIdOf(item);
    if (!sid || sid === this.current?.sid || this.done.has(sid) || this.ending.has(sid)) return;
    let text = typeof item.insertText === "string" ? item.insertText : item.insertText.value;
    // An item whose range starts before the cursor repeats what is already there.
    const typed = item.range ? document.getText(new vscode.Range(item.range.start, position)) : "";
    if (typed && text.startsWith(typed)) text = text.slice(typed.length);
    this.end(); // a new suggestion replaces the one shown
    this.current = { sid, uri: document.uri.toString(), start: document.offsetAt(position), text, kept: 0 };
    markShown(sid);
    this.wire.notify(COMPLETION_SHOWN, { suggestionId: sid });
  }

  private onChange(e: vscode.TextDocumentChangeEvent): void {
    const s = this.current;
    if (!s || e.document.uri.toString() !== s.uri || e.contentChanges.length === 0) return;
    const [c] = e.contentChanges;
    const rest = s.text.slice(s.kept);
    const keeps =
      e.contentChanges.length === 1 &&
      c.rangeLength === 0 &&
      c.rangeOffset === s.start + s.kept &&
      c.text.length > 0 &&
      rest.startsWith(c.text);
    if (keeps) s.kept += c.text.length;
    else this.end();
  }

  private onSelection(e: vscode.TextEditorSelectionChangeEvent): void {
    const s = this.current;
    if (!s || e.textEditor.document.uri.toString() !== s.uri) return;
    const sel = e.selections[0];
    if (!sel || !sel.isEmpty || e.textEditor.document.offsetAt(sel.active) !== s.start + s.kept) this.end();
  }

  /** The shown suggestion's lifetime ends: report what the user kept of it, after the grace. */
  private end(): void {
    const s = this.current;
    this.current = undefined;
    if (!s) return;
    const report = () => {
      this.ending.delete(s.sid);
      this.remember(s.sid);
      if (s.kept > 0) {
        this.wire.notify(COMPLETION_PARTIALLY_ACCEPTED, { suggestionId: s.sid, acceptedChars: s.kept });
      } else {
        this.wire.notify(COMPLETION_REJECTED, { suggestionId: s.sid });
      }
    };
    this.ending.set(s.sid, setTimeout(report, GRACE_MS));
  }

  private remember(sid: string): void {
    this.done.add(sid);
    if (this.done.size > 256) this.done.delete(this.done.values().next().value as string);
  }
}
