// Flywheel for VS Code: a thin client of `flywheel lsp` (lsp/server.py has the protocol).
//
// What it does: starts the server over stdio with vscode-languageclient 11, which forwards LSP
// 3.18 inline completions (ghost text; accepting runs the item's flywheel.acceptCompletion
// command) and $/progress; shows the model version and state from flywheel/status in the status
// bar; streams flywheel/taskStep into the "Flywheel Agent" output; and turns each
// flywheel/proposal into a review: a diff editor (current text vs. proposed), code lenses to
// accept or reject each hunk, and accept-all / reject-all. Every decision goes back to the server
// as a workspace/executeCommand, which applies the edit with a versioned workspace/applyEdit (a
// stale proposal is refused there, never guessed here).
//
// What it does not do: build prompts, keep telemetry or change text itself.
//
// Build: lsp/clients/vscode/build.sh (npm ci, tsc, vsce package -> flywheel.vsix).

import * as vscode from "vscode";
import {
  ExecuteCommandRequest,
  LanguageClient,
  LanguageClientOptions,
  ServerOptions,
} from "vscode-languageclient/node";

interface Hunk {
  index: number;
  range: { start: { line: number; character: number }; end: { line: number; character: number } };
  original: string;
  newText: string;
  state: string;
}

interface Proposal {
  proposalId: string;
  taskId: string | null;
  uri: string;
  version: number | null;
  hunks: Hunk[];
}

const PROPOSAL_SCHEME = "flywheel-proposal";
let client: LanguageClient | undefined;
const proposals = new Map<string, Proposal>(); // proposal id -> proposal
let lastTaskId: string | undefined;

function command(name: string, ...args: unknown[]): Thenable<any> {
  if (!client) {
    return Promise.reject(new Error("Flywheel is not running"));
  }
  return client.sendRequest(ExecuteCommandRequest.type, { command: name, arguments: args });
}

function proposedText(p: Proposal, base: string): string {
  // The base document with every pending or accepted hunk applied (line offsets from the end).
  const lines = base.split("\n");
  const hunks = [...p.hunks].filter((h) => h.state !== "rejected").reverse();
  for (const h of hunks) {
    const newLines = h.newText === "" ? [] : h.newText.replace(/\n$/, "").split("\n");
    lines.splice(h.range.start.line, h.range.end.line - h.range.start.line, ...newLines);
  }
  return lines.join("\n");
}

class ProposalLenses implements vscode.CodeLensProvider {
  readonly changed = new vscode.EventEmitter<void>();
  readonly onDidChangeCodeLenses = this.changed.event;

  provideCodeLenses(doc: vscode.TextDocument): vscode.CodeLens[] {
    const lenses: vscode.CodeLens[] = [];
    for (const p of proposals.values()) {
      if (p.uri !== doc.uri.toString()) continue;
      for (const h of p.hunks) {
        if (h.state !== "pending") continue;
        const at = new vscode.Range(h.range.start.line, 0, h.range.start.line, 0);
        lenses.push(
          new vscode.CodeLens(at, {
            title: `Flywheel: accept hunk ${h.index + 1}`,
            command: "flywheel.client.acceptHunk",
            arguments: [p.proposalId, h.index],
          }),
          new vscode.CodeLens(at, {
            title: "reject",
            command: "flywheel.client.rejectHunk",
            arguments: [p.proposalId, h.index],
          }),
        );
      }
    }
    return lenses;
  }
}

function latestProposal(): Proposal | undefined {
  const open = [...proposals.values()].filter((p) => p.hunks.some((h) => h.state === "pending"));
  return open[open.length - 1];
}

async function pickHunk(): Promise<[string, number] | undefined> {
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

// The server reads only its own settings: `server.*` is this client's, and an empty model name
// means "what the server was started with".
function withoutClientSettings(settings: any): any {
  if (!settings || typeof settings !== "object") return settings;
  const { server: _client, ...rest } = settings;
  if (rest.model && typeof rest.model === "object" && !rest.model.name) {
    const { name: _empty, ...model } = rest.model;
    rest.model = model;
  }
  return rest;
}

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  const config = vscode.workspace.getConfiguration("flywheel");
  const [program, ...args] = config.get<string[]>("server.command") ?? ["flywheel", "lsp"];
  const serverOptions: ServerOptions = { command: program, args };
  const output = vscode.window.createOutputChannel("Flywheel Agent");
  const status = vscode.window.createStatusBarItem(vscode.StatusBarAlignment.Right, 100);
  status.name = "Flywheel";
  status.text = "$(sync~spin) Flywheel";
  status.command = "flywheel.client.ask";
  status.show();
  const lenses = new ProposalLenses();
  const bases = new Map<string, string>(); // proposal id -> document text when it arrived

  const clientOptions: LanguageClientOptions = {
    documentSelector: [{ scheme: "file" }, { scheme: "untitled" }],
    initializationOptions: withoutClientSettings({ model: { name: config.get<string>("model.name") } }),
    middleware: {
      workspace: {
        // The server reads only its own settings; `server.*` is for this client.
        configuration: async (params: any, token: any, next: any) => {
          const result = await next(params, token);
          return Array.isArray(result) ? result.map(withoutClientSettings) : result;
        },
      },
    },
  };
  client = new LanguageClient("flywheel", "Flywheel", serverOptions, clientOptions);

  client.onNotification("flywheel/status", (s: { state: string; modelVersion: string; message: string }) => {
    const icon = { idle: "$(check)", busy: "$(sync~spin)", loading: "$(sync~spin)", error: "$(error)" }[s.state] ?? "$(circle-slash)";
    status.text = `${icon} Flywheel ${s.modelVersion || ""}`.trim();
    status.tooltip = s.message || `Flywheel: ${s.state}`;
  });
  client.onNotification("flywheel/taskStep", (step: { taskId: string; index: number; role: string; text: string }) => {
    lastTaskId = step.taskId;
    output.appendLine(`[${step.taskId.slice(0, 8)} #${step.index} ${step.role}] ${step.text}`);
  });
  client.onNotification("flywheel/proposal", async (p: Proposal) => {
    proposals.set(p.proposalId, p);
    const uri = vscode.Uri.parse(p.uri);
    try {
      bases.set(p.proposalId, (await vscode.workspace.openTextDocument(uri)).getText());
    } catch {
      bases.set(p.proposalId, "");
    }
    lenses.changed.fire();
    const name = uri.path.split("/").pop();
    const choice = await vscode.window.showInformationMessage(
      `Flywheel proposes ${p.hunks.length} change(s) to ${name}`,
      "Review",
      "Accept All",
      "Reject All",
    );
    if (choice === "Review") await vscode.commands.executeCommand("flywheel.client.review", p.proposalId);
    if (choice === "Accept All") await vscode.commands.executeCommand("flywheel.client.acceptAll", p.proposalId);
    if (choice === "Reject All") await vscode.commands.executeCommand("flywheel.client.rejectAll", p.proposalId);
  });

  const settle = (id: string, index: number | null, state: string) => {
    const p = proposals.get(id);
    if (!p) return;
    for (const h of p.hunks) if (index === null ? h.state === "pending" : h.index === index) h.state = state;
    lenses.changed.fire();
  };
  const report = (err: unknown) => vscode.window.showErrorMessage(`Flywheel: ${(err as Error).message ?? err}`);

  context.subscriptions.push(
    output,
    status,
    vscode.languages.registerCodeLensProvider({ scheme: "file" }, lenses),
    vscode.workspace.registerTextDocumentContentProvider(PROPOSAL_SCHEME, {
      provideTextDocumentContent(uri: vscode.Uri): string {
        const p = proposals.get(uri.query);
        return p ? proposedText(p, bases.get(p.proposalId) ?? "") : "";
      },
    }),
    vscode.commands.registerCommand("flywheel.client.ask", async () => {
      const editor = vscode.window.activeTextEditor;
      const question = await vscode.window.showInputBox({ prompt: "Ask Flywheel", ignoreFocusOut: true });
      if (!question) return;
      const arg: Record<string, unknown> = { question };
      if (editor) {
        arg.uri = editor.document.uri.toString();
        if (!editor.selection.isEmpty) arg.range = client!.code2ProtocolConverter.asRange(editor.selection);
      }
      try {
        const result = await command("flywheel.ask", arg);
        if (result?.answer) output.appendLine(`[answer] ${result.answer}`);
        output.show(true);
      } catch (err) {
        report(err);
      }
    }),
    vscode.commands.registerCommand("flywheel.client.review", async (id?: string) => {
      const p = id ? proposals.get(id) : latestProposal();
      if (!p) return;
      const right = vscode.Uri.parse(p.uri).with({ scheme: PROPOSAL_SCHEME, query: p.proposalId });
      await vscode.commands.executeCommand("vscode.diff", vscode.Uri.parse(p.uri), right, "Flywheel proposal");
    }),
    vscode.commands.registerCommand("flywheel.client.acceptHunk", async (id?: string, index?: number) => {
      const target = id !== undefined && index !== undefined ? ([id, index] as [string, number]) : await pickHunk();
      if (!target) return;
      try {
        await command("flywheel.acceptHunk", ...target);
        settle(target[0], target[1], "accepted");
      } catch (err) {
        report(err);
      }
    }),
    vscode.commands.registerCommand("flywheel.client.rejectHunk", async (id?: string, index?: number) => {
      const target = id !== undefined && index !== undefined ? ([id, index] as [string, number]) : await pickHunk();
      if (!target) return;
      await command("flywheel.rejectHunk", ...target).then(() => settle(target[0], target[1], "rejected"), report);
    }),
    vscode.commands.registerCommand("flywheel.client.acceptAll", async (id?: string) => {
      const p = id ? proposals.get(id) : latestProposal();
      if (!p) return;
      await command("flywheel.acceptAll", p.proposalId).then(() => settle(p.proposalId, null, "accepted"), report);
    }),
    vscode.commands.registerCommand("flywheel.client.rejectAll", async (id?: string) => {
      const p = id ? proposals.get(id) : latestProposal();
      if (!p) return;
      await command("flywheel.rejectAll", p.proposalId).then(() => settle(p.proposalId, null, "rejected"), report);
    }),
    vscode.commands.registerCommand("flywheel.client.cancelTask", async () => {
      if (lastTaskId) await command("flywheel.cancelTask", lastTaskId).then(undefined, report);
    }),
    vscode.commands.registerCommand("flywheel.client.rate", async () => {
      if (!lastTaskId) return;
      const pick = await vscode.window.showQuickPick(["👍 good (1)", "😐 neutral (0)", "👎 bad (-1)"]);
      if (!pick) return;
      const rating = pick.includes("(1)") ? 1 : pick.includes("(0)") ? 0 : -1;
      const comment = await vscode.window.showInputBox({ prompt: "A comment (optional)" });
      await command("flywheel.rate", { taskId: lastTaskId, rating, comment: comment || undefined }).then(undefined, report);
    }),
  );
  await client.start();
}

export async function deactivate(): Promise<void> {
  await client?.stop();
}
