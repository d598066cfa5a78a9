// The Flywheel messages this extension sends (lsp/protocol.py has the wire), and the small
// interface the feature modules use to send them, so that they need not hold the client.
//
// What it does not do: start or own the language client (extension.ts does).

import type * as vscode from "vscode";

export const NEXT_EDIT = "flywheel/nextEdit";
export const COMPLETION_SHOWN = "flywheel/completionShown";
export const COMPLETION_PARTIALLY_ACCEPTED = "flywheel/completionPartiallyAccepted";
export const COMPLETION_REJECTED = "flywheel/completionRejected";
export const CURSOR_IDLE = "flywheel/cursorIdle";
export const ACCEPT_COMPLETION = "flywheel.acceptCompletion"; // the server's command

export const REQUEST_CANCELLED = -32800; // LSP's RequestCancelled: we cancelled it
export const CONTENT_MODIFIED = -32801; // LSP's ContentModified: the document moved on

export interface Wire {
  /** A notification to the server; dropped when the server is not running. */
  notify(method: string, params: object): void;
  /** A request to the server (rejects when it is not running). */
  request<T>(method: string, params: object, token?: vscode.CancellationToken): Promise<T>;
  /** workspace/executeCommand on the server. */
  command(name: string, ...args: unknown[]): Thenable<any>;
  /** A line in the "Flywheel Agent" output (for quiet failures). */
  log(line: string): void;
}

/** The suggestion id an item's command carries (flywheel.acceptCompletion [sid]). */
export function suggestionIdOf(item: { command?: { arguments?: unknown[] } } | undefined): string | undefined {
  const sid = item?.command?.arguments?.[0];
  return typeof sid === "string" ? sid : undefined;
}

/** The last suggestion shown (inline or next edit), for "Flywheel: Rate the Last Suggestion". */
export const lastShown: { suggestionId?: string; at: number } = { at: 0 };

const shownListeners: ((what: string) => void)[] = [];

/** Call `listener` whenever a suggestion is shown (the rating item offers itself). */
export function onShown(listener: (what: string) => void): void {
  shownListeners.push(listener);
}

export function markShown(suggestionId: string): void {
  lastShown.suggestionId = suggestionId;
  lastShown.at = Date.now();
  for (const l of shownListeners) l("the last suggestion");
}
