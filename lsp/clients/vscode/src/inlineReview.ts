// An agent's proposed hunks, shown inline in the editor where they apply.
//
// Each pending hunk: its removed lines get a red background (struck through), and its new lines
// are shown in green beside them, new line i after old line i ("→ new text"; new lines beyond the
// old ones after the last, an insertion after the line above it). A hover on a hunk shows the
// whole hunk as a diff. Code lenses above it accept or reject it (and, on the first hunk, accept
// all, reject all or open the diff editor). A hunk that is settled (accepted, rejected, or refused
// as stale) loses its decorations and lenses at once; the hunks after an accepted one move by the
// lines it added or removed.
//
// What it does not do: change the document (the server applies an accepted hunk with a versioned
// workspace/applyEdit) or decide anything; it renders `proposals` (proposals.ts).

import * as vscode from "vscode";
import { Hunk, proposals } from "./proposals";

const removed = vscode.window.createTextEditorDecorationType({
  isWholeLine: true,
  backgroundColor: new vscode.ThemeColor("diffEditor.removedLineBackground"),
  textDecoration: "line-through",
  overviewRulerColor: new vscode.ThemeColor("editorOverviewRuler.deletedForeground"),
  overviewRulerLane: vscode.OverviewRulerLane.Left,
});

const added = vscode.window.createTextEditorDecorationType({
  after: {
    color: new vscode.ThemeColor("gitDecoration.addedResourceForeground"),
    backgroundColor: new vscode.ThemeColor("diffEditor.insertedLineBackground"),
    margin: "0 0 0 2em",
  },
});

function lines(text: string): string[] {
  return text === "" ? [] : text.replace(/\n$/, "").split("\n");
}

function hover(h: Hunk): vscode.MarkdownString {
  const diff = [...lines(h.original).map((l) => `- ${l}`), ...lines(h.newText).map((l) => `+ ${l}`)];
  const md = new vscode.MarkdownString(`**Flywheel hunk ${h.index + 1}**\n\n\`\`\`diff\n${diff.join("\n")}\n\`\`\``);
  return md;
}

/** The decorations of one pending hunk in a document of `lineCount` lines. */
export function hunkDecorations(
  h: Hunk,
  lineCount: number,
): { removed: vscode.DecorationOptions[]; added: vscode.DecorationOptions[] } {
  const first = h.range.start.line;
  // the old lines: to the end line, and that line too when the range ends inside it (a file's
  // last line without a line break)
  const stop = Math.min(h.range.end.line + (h.range.end.character > 0 ? 1 : 0), lineCount);
  const out = { removed: [] as vscode.DecorationOptions[], added: [] as vscode.DecorationOptions[] };
  for (let l = first; l < stop; l++) {
    out.removed.push({ range: new vscode.Range(l, 0, l, Number.MAX_SAFE_INTEGER), hoverMessage: hover(h) });
  }
  const news = lines(h.newText);
  const slots = Math.max(stop - first, 0);
  const show = (line: number, text: string) =>
    out.added.push({
      range: new vscode.Range(line, Number.MAX_SAFE_INTEGER, line, Number.MAX_SAFE_INTEGER),
      hoverMessage: hover(h),
      renderOptions: { after: { contentText: `→ ${text}` } },
    });
  const joined = (parts: string[]) => parts.map((t) => (t.trim() === "" ? "(blank line)" : t)).join("  ⏎  ");
  if (slots === 0) {
    show(Math.max(0, Math.min(first - 1, lineCount - 1)), joined(news)); // an insertion
  } else if (news.length === 0) {
    show(stop - 1, "(removed)");
  } else {
    for (let i = 0; i < Math.min(slots, news.length); i++) {
      // new line i beside old line i; the new lines left over go beside the last old line
      show(first + i, joined(i === slots - 1 ? news.slice(i) : [news[i]]));
    }
  }
  return out;
}

export class InlineReview implements vscode.Disposable {
  private readonly subscriptions: vscode.Disposable[] = [];

  constructor() {
    this.subscriptions.push(
      vscode.window.onDidChangeVisibleTextEditors(() => this.render()),
      vscode.workspace.onDidChangeTextDocument((e) => {
        if (vscode.window.visibleTextEditors.some((ed) => ed.document === e.document)) this.render();
      }),
    );
  }

  /** Draw every pending hunk in every visible editor (and clear settled ones). */
  render(): void {
    for (const editor of vscode.window.visibleTextEditors) {
      const uri = editor.document.uri.toString();
      const r: vscode.DecorationOptions[] = [];
      const a: vscode.DecorationOptions[] = [];
      for (const p of proposals.values()) {
        if (p.uri !== uri) continue;
        for (const h of p.hunks) {
          if (h.state !== "pending") continue;
          const d = hunkDecorations(h, editor.document.lineCount);
          r.push(...d.removed);
          a.push(...d.added);
        }
      }
      editor.setDecorations(removed, r);
      editor.setDecorations(added, a);
    }
  }

  dispose(): void {
    for (const s of this.subscriptions) s.dispose();
  }
}

/** A hunk was accepted: the later pending hunks of its proposal move by the lines it changed. */
export function shiftAfter(hunks: Hunk[], accepted: Hunk): void {
  const delta = lines(accepted.newText).length - (accepted.range.end.line - accepted.range.start.line);
  if (delta === 0) return;
  for (const h of hunks) {
    if (h === accepted || h.state !== "pending" || h.range.start.line < accepted.range.end.line) continue;
    h.range = {
      start: { ...h.range.start, line: h.range.start.line + delta },
      end: { ...h.range.end, line: h.range.end.line + delta },
    };
  }
}
