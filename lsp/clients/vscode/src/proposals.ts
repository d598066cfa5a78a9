// Agent proposals under review: the proposals the server sent (flywheel/proposal), the code
// lenses that accept or reject each pending hunk (and all of them, or open the diff editor),
// and the proposed text shown in a diff editor. inlineReview.ts draws the hunks in the editor.
//
// What it does not do: apply or refuse hunks (the server does, on the commands extension.ts sends)
// or decide whether a proposal is stale.

import * as vscode from "vscode";

export interface Hunk {
  index: number;
  range: { start: { line: number; character: number }; end: { line: number; character: number } };
  original: string;
  newText: string;
  state: string;
}

export interface Proposal {
  proposalId: string;
  taskId: string | null;
  uri: string;
  version: number | null;
  hunks: Hunk[];
}

export const PROPOSAL_SCHEME = "flywheel-proposal";
export const proposals = new Map<string, Proposal>(); // proposal id -> proposal

export function proposedText(p: Proposal, base: string): string {
  // The base document with every pending or accepted hunk applied (line offsets from the end).
  const lines = base.split("\n");
  const hunks = [...p.hunks].filter((h) => h.state !== "rejected").reverse();
  for (const h of hunks) {
    const newLines = h.newText === "" ? [] : h.newText.replace(/\n$/, "").split("\n");
    lines.splice(h.range.start.line, h.range.end.line - h.range.start.line, ...newLines);
  }
  return lines.join("\n");
}

export class ProposalLenses implements vscode.CodeLensProvider {
  readonly changed = new vscode.EventEmitter<void>();
  readonly onDidChangeCodeLenses = this.changed.event;

  provideCodeLenses(doc: vscode.TextDocument): vscode.CodeLens[] {
    const lenses: vscode.CodeLens[] = [];
    for (const p of proposals.values()) {
      if (p.uri !== doc.uri.toString()) continue;
      const pending = p.hunks.filter((h) => h.state === "pending");
      for (const h of pending) {
        const at = new vscode.Range(h.range.start.line, 0, h.range.start.line, 0);
        const lens = (title: string, command: string, ...args: unknown[]) =>
          lenses.push(new vscode.CodeLens(at, { title, command, arguments: args }));
        lens(`$(check) Flywheel: accept hunk ${h.index + 1}`, "flywheel.client.acceptHunk", p.proposalId, h.index);
        lens("$(close) reject", "flywheel.client.rejectHunk", p.proposalId, h.index);
        if (h === pending[0] && pending.length > 1) {
          lens(`accept all ${pending.length}`, "flywheel.client.acceptAll", p.proposalId);
          lens("reject all", "flywheel.client.rejectAll", p.proposalId);
        }
        if (h === pending[0]) lens("diff", "flywheel.client.review", p.proposalId);
      }
    }
    return lenses;
  }
}

export function latestProposal(): Proposal | undefined {
  const open = [...proposals.values()].filter((p) => p.hunks.some((h) => h.state === "pending"));
  return open[open.length - 1];
}

export async function pickHunk(): Promise<[string, number] | undefined> {
  const p = latestProposal();
  if (!p) {
    vscode.window.showInformationMessage("Flywheel: no proposal is waiting for review");
    return undefined;
  }
  const pending = p.hunks.filter((h) => h.state === "pending");
  if (pending.length === 1) return [p.proposalId, pending[0].index];
  const item = await vscode.window.showQuickPick(
    pending.map((h) => ({ label: `hunk ${h.index + 1}: line ${h.range.start.line + 1}`, h })),
  );
  return item ? [p.proposalId, item.h.index] : undefined;
}
