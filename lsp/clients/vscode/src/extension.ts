// Flywheel for VS Code: a thin client of `flywheel lsp` (lsp/server.py has the protocol).
//
// What it does: starts the server over stdio with vscode-languageclient 11, which forwards LSP
// 3.18 inline completions (ghost text; accepting runs the item's flywheel.acceptCompletion
// command) and $/progress; reports what became of each ghost text (feedback.ts); asks for and
// shows next edits (nextEdit.ts); tells the server where the cursor rests, so that it prefills
// the prompt before the first keystroke (cursorIdle.ts); shows the model version and state in the status bar, and a
// restart when the server stopped (status.ts); streams flywheel/taskStep into the "Flywheel
// Agent" output; and turns each flywheel/proposal into a review in the editor itself (no pop-up):
// removed lines red, new lines green beside them (inlineReview.ts), code lenses to accept or
// reject each hunk, accept-all / reject-all, and a diff editor on request (proposals.ts). A
// status bar item rates the last suggestion or task. No notification outlives its state: the
// "stopped" one closes when the server runs again, settled hunks lose their lenses. Every decision goes
// back to the server as a workspace/executeCommand, which applies the edit with a versioned
// workspace/applyEdit (a stale proposal is refused there, never guessed here).
//
// Settings the server reads arrive through workspace/configuration (and initializationOptions);
// the client's own (`server.*`, `inlineCompletion.*`, `nextEdit.debounceMs`, empty values that
// mean "the server's default") are taken out first. A change of the others is announced with
// workspace/didChangeConfiguration, after which the server pulls them again.
//
// What it does not do: build prompts or keep telemetry; the only text it changes itself is an
// accepted next edit.
//
// Build: lsp/clients/vscode/build.sh (npm ci, tsc, vsce package -> flywheel.vsix).

import * as vscode from "vscode";
import {
  CloseAction,
  DidChangeConfigurationNotification,
  ErrorAction,
  ExecuteCommandRequest,
  LanguageClient,
  LanguageClientOptions,
  ServerOptions,
  State,
} from "vscode-languageclient/node";
import { CursorIdle } from "./cursorIdle";
import { InlineFeedback } from "./feedback";
import { NextEdits } from "./nextEdit";
import { InlineReview, shiftAfter } from "./inlineReview";
import { latestProposal, pickHunk, Proposal, ProposalLenses, proposals, PROPOSAL_SCHEME, proposedText } from "./proposals";
import { PreparingNotice, RateItem, rateLast, ServerStatus, setConsent, StatusItem, toggleInlineCompletion } from "./status";
import { ACCEPT_COMPLETION, onShown, Wire } from "./wire";

let client: LanguageClient | undefined;
let stopping = false; // this extension is stopping the client: not a failure
const lastTask: { taskId?: string; at: number } = { at: 0 };

function current(): LanguageClient | undefined {
  return client;
}

function command(name: string, ...args: unknown[]): Thenable<any> {
  if (!client?.isRunning()) {
    return Promise.reject(new Error("Flywheel is not running"));
  }
  return client.sendRequest(ExecuteCommandRequest.type, { command: name, arguments: args });
}

// Settings that only this client reads; the server would warn about them as unknown.
function withoutClientSettings(settings: any): any {
  if (!settings || typeof settings !== "object") return settings;
  const { server: _server, inlineCompletion: _inline, ...rest } = settings;
  // An empty model or consent is "unset": null tells the server to go back to its own value
  // (its flags and file), not to keep the last one this editor sent.
  if (rest.model && typeof rest.model === "object" && !rest.model.name) {
    rest.model = { ...rest.model, name: null };
  }
  if (rest.telemetry && typeof rest.telemetry === "object" && !rest.telemetry.consent) {
    rest.telemetry = { ...rest.telemetry, consent: null };
  }
  if (rest.nextEdit && typeof rest.nextEdit === "object") {
    const { debounceMs: _debounce, ...nextEdit } = rest.nextEdit;
    rest.nextEdit = nextEdit;
  }
  return rest;
}

function serverSettings(): any {
  const config = vscode.workspace.getConfiguration("flywheel");
  return withoutClientSettings({
    model: { name: config.get<string>("model.name") },
    telemetry: { consent: config.get<string>("telemetry.consent") },
  });
}

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  const output = vscode.window.createOutputChannel("Flywheel Agent");
  const status = new StatusItem();
  const preparing = new PreparingNotice();
  const lenses = new ProposalLenses();
  const review = new InlineReview();
  const rateItem = new RateItem();
  let closeStopped: (() => void) | undefined; // closes the "stopped" notification
  onShown((what) => rateItem.offer(what));
  const bases = new Map<string, string>(); // proposal id -> document text when it arrived
  const notices = new Map<string, vscode.Disposable>(); // proposal id -> its status bar message
  const wire: Wire = {
    notify: (method, params) => {
      if (client?.isRunning()) client.sendNotification(method, params).catch(() => undefined);
    },
    request: (method, params, token) =>
      client?.isRunning()
        ? client.sendRequest(method, params, token)
        : Promise.reject(new Error("Flywheel is not running")),
    command,
    log: (line) => output.appendLine(line),
  };
  const inlineEnabled = () =>
    vscode.workspace.getConfiguration("flywheel").get<boolean>("inlineCompletion.enabled", true);
  const nextEdits: NextEdits = new NextEdits(wire, (doc) => feedback.showing(doc));
  const feedback: InlineFeedback = new InlineFeedback(wire, inlineEnabled, (doc) => nextEdits.busy(doc));
  const cursorIdle = new CursorIdle(wire, inlineEnabled);

  const makeClient = (): LanguageClient => {
    const [program, ...args] = vscode.workspace.getConfiguration("flywheel").get<string[]>("server.command") ?? [
      "flywheel",
      "lsp",
    ];
    const serverOptions: ServerOptions = { command: program, args };
    const clientOptions: LanguageClientOptions = {
      documentSelector: [{ scheme: "file" }, { scheme: "untitled" }],
      initializationOptions: serverSettings(),
      // One message per failure (the state change below), and no automatic restart loop.
      errorHandler: {
        error: (_error, _message, count) => ({
          action: count && count <= 3 ? ErrorAction.Continue : ErrorAction.Shutdown,
          handled: true,
        }),
        closed: () => ({ action: CloseAction.DoNotRestart, handled: true }),
      },
      middleware: {
        provideInlineCompletionItems: feedback.middleware,
        executeCommand: (name: string, args: any[], next: any) => {
          const result = next(name, args); // sent first: the server records the acceptance first
          if (name === ACCEPT_COMPLETION && typeof args?.[0] === "string") {
            feedback.accepted(args[0]);
            nextEdits.accepted();
          }
          return result;
        },
        workspace: {
          // The server reads only its own settings.
          configuration: async (params: any, token: any, next: any) => {
            const result = await next(params, token);
            return Array.isArray(result) ? result.map(withoutClientSettings) : result;
          },
        },
      },
    };
    const c = new LanguageClient("flywheel", "Flywheel", serverOptions, clientOptions);
    c.onNotification("flywheel/status", (s: ServerStatus) => {
      status.update(s);
      preparing.update(s);
      if (s.state !== "stopped") closeStopped?.(); // running again: the old notice is void
    });
    c.onNotification("flywheel/taskStep", (step: { taskId: string; index: number; role: string; text: string }) => {
      lastTask.taskId = step.taskId;
      lastTask.at = Date.now();
      rateItem.offer("the last task");
      output.appendLine(`[${step.taskId.slice(0, 8)} #${step.index} ${step.role}] ${step.text}`);
    });
    c.onNotification("flywheel/proposal", onProposal);
    c.onDidChangeState((e) => {
      if (e.newState !== State.Stopped) return;
      nextEdits.reset();
      status.stopped();
      preparing.dispose();
      if (!stopping && e.oldState === State.Running) showStopped();
    });
    return c;
  };

  const start = async () => {
    client = makeClient();
    try {
      await client.start();
    } catch (err) {
      // vscode-languageclient has shown the error once; the status bar offers the restart.
      status.stopped((err as Error)?.message ?? String(err));
    }
  };

  // A notification that lasts as long as its state: it closes when the server runs again (a
  // restart from the status item, or the command); an error message could not be taken back.
  const showStopped = () => {
    closeStopped?.();
    void vscode.window.withProgress(
      {
        location: vscode.ProgressLocation.Notification,
        title: "Flywheel stopped: the server exited (its log is in the Flywheel output). " +
          "Click the Flywheel status item to restart it.",
        cancellable: true,
      },
      (_progress, token) =>
        new Promise<void>((resolve) => {
          closeStopped = () => {
            closeStopped = undefined;
            resolve();
          };
          token.onCancellationRequested(() => closeStopped?.());
        }),
    );
  };

  const restart = async () => {
    closeStopped?.();
    const old = client;
    client = undefined;
    stopping = true;
    try {
      await old?.dispose(5000);
    } catch {
      // it was not running
    } finally {
      stopping = false;
    }
    nextEdits.reset();
    status.update({ state: "loading" });
    await start();
  };

  async function onProposal(p: Proposal) {
    proposals.set(p.proposalId, p);
    const uri = vscode.Uri.parse(p.uri);
    try {
      bases.set(p.proposalId, (await vscode.workspace.openTextDocument(uri)).getText());
    } catch {
      bases.set(p.proposalId, "");
    }
    lenses.changed.fire();
    // Shown where it applies, not in a pop-up: open the file beside the current one if needed.
    if (!vscode.window.visibleTextEditors.some((e) => e.document.uri.toString() === p.uri)) {
      await vscode.window.showTextDocument(uri, { preview: false, preserveFocus: true });
    }
    review.render();
    const name = uri.path.split("/").pop();
    notices.get(p.proposalId)?.dispose();
    notices.set(
      p.proposalId,
      vscode.window.setStatusBarMessage(`Flywheel: ${p.hunks.length} change(s) proposed in ${name}`, 5000),
    );
  }

  const settle = (id: string, index: number | null, state: string) => {
    const p = proposals.get(id);
    if (!p) return;
    for (const h of p.hunks) {
      if (index === null ? h.state !== "pending" : h.index !== index) continue;
      h.state = state;
      if (state === "accepted" && index !== null) shiftAfter(p.hunks, h);
    }
    if (!p.hunks.some((h) => h.state === "pending")) {
      proposals.delete(id); // nothing left to show, nor to announce
      notices.get(id)?.dispose();
      notices.delete(id);
    }
    lenses.changed.fire();
    review.render();
  };
  const report = (err: unknown) => vscode.window.showErrorMessage(`Flywheel: ${(err as Error).message ?? err}`);

  context.subscriptions.push(
    output,
    status,
    preparing,
    review,
    rateItem,
    { dispose: () => closeStopped?.() },
    feedback,
    nextEdits,
    cursorIdle,
    vscode.workspace.onDidChangeConfiguration((e) => {
      if (!e.affectsConfiguration("flywheel")) return;
      status.render();
      const clientOnly = ["flywheel.server", "flywheel.inlineCompletion", "flywheel.nextEdit.debounceMs"];
      const forServer = ["flywheel.model", "flywheel.telemetry", "flywheel.nextEdit.enabled"];
      const affects = (sections: string[]) => sections.some((s) => e.affectsConfiguration(s));
      if (affects(clientOnly) && !affects(forServer)) return;
      // The server pulls the section again (workspace/configuration, filtered above).
      wire.notify(DidChangeConfigurationNotification.method, { settings: null });
    }),
    vscode.languages.registerCodeLensProvider({ scheme: "file" }, lenses),
    vscode.workspace.registerTextDocumentContentProvider(PROPOSAL_SCHEME, {
      provideTextDocumentContent(uri: vscode.Uri): string {
        const p = proposals.get(uri.query);
        return p ? proposedText(p, bases.get(p.proposalId) ?? "") : "";
      },
    }),
    vscode.commands.registerCommand("flywheel.client.restart", restart),
    vscode.commands.registerCommand("flywheel.client.toggleInlineCompletion", toggleInlineCompletion),
    vscode.commands.registerCommand("flywheel.client.setConsent", setConsent),
    vscode.commands.registerCommand("flywheel.client.rateSuggestion", () =>
      rateLast(command, lastTask).then(undefined, report),
    ),
    vscode.commands.registerCommand("flywheel.client.nextEditTab", () => nextEdits.tab()),
    vscode.commands.registerCommand("flywheel.client.nextEditDismiss", () => nextEdits.dismiss()),
    vscode.commands.registerCommand("flywheel.client.inlineDismiss", () => feedback.dismiss()),
    vscode.commands.registerCommand("flywheel.client.acceptWord", () => feedback.acceptWord()),
    vscode.commands.registerCommand("flywheel.client.ask", async () => {
      const editor = vscode.window.activeTextEditor;
      const question = await vscode.window.showInputBox({ prompt: "Ask Flywheel", ignoreFocusOut: true });
      if (!question) return;
      const arg: Record<string, unknown> = { question };
      if (editor) {
        arg.uri = editor.document.uri.toString();
        if (!editor.selection.isEmpty) arg.range = current()!.code2ProtocolConverter.asRange(editor.selection);
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
      if (lastTask.taskId) await command("flywheel.cancelTask", lastTask.taskId).then(undefined, report);
    }),
    vscode.commands.registerCommand("flywheel.client.rate", async () => {
      if (!lastTask.taskId) return;
      const pick = await vscode.window.showQuickPick(["👍 good (1)", "😐 neutral (0)", "👎 bad (-1)"]);
      if (!pick) return;
      const rating = pick.includes("(1)") ? 1 : pick.includes("(0)") ? 0 : -1;
      const comment = await vscode.window.showInputBox({ prompt: "A comment (optional)" });
      await command("flywheel.rate", { taskId: lastTask.taskId, rating, comment: comment || undefined }).then(
        undefined,
        report,
      );
    }),
  );
  await start();
}

export async function deactivate(): Promise<void> {
  stopping = true;
  await client?.stop();
}
