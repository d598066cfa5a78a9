// The Flywheel status bar item and the small control commands around it.
//
// The item shows the model version and engine state from flywheel/status ({state: loading | idle
// | busy | error | stopped, modelVersion, message}); "error" puts the server's one-line message in
// the text and the tooltip. When the language client stops or the server dies it reads
// "Flywheel stopped", and a click restarts the client (flywheel.client.restart). The tooltip
// names the telemetry consent this editor asks for.
//
// Commands: flywheel.client.toggleInlineCompletion (the flywheel.inlineCompletion.enabled
// setting), flywheel.client.setConsent (off | metrics | code into flywheel.telemetry.consent,
// which the server reads as telemetry.consent), flywheel.client.rateSuggestion (flywheel.rate on
// the last suggestion shown, or the last agent task when that came later).
//
// What it does not do: show dialogs in a loop (extension.ts reports each failure once).

import * as vscode from "vscode";
import { lastShown } from "./wire";

export interface ServerStatus {
  state: string;
  modelVersion?: string;
  completionModelVersion?: string; // the registry's completion lane, when it has its own version
  message?: string;
  progress?: { percentage: number; message?: string }; // a first start preparing the model
}

const ICONS: Record<string, string> = {
  idle: "$(check)",
  busy: "$(sync~spin)",
  loading: "$(sync~spin)",
  error: "$(error)",
  stopped: "$(circle-slash)",
};

function firstLine(text: string | undefined, limit = 60): string {
  const line = (text ?? "").split("\n")[0].trim();
  return line.length > limit ? line.slice(0, limit - 1) + "…" : line;
}

export function consentSetting(): string {
  return vscode.workspace.getConfiguration("flywheel").get<string>("telemetry.consent", "") ?? "";
}

export class StatusItem implements vscode.Disposable {
  readonly item = vscode.window.createStatusBarItem(vscode.StatusBarAlignment.Right, 100);
  private last: ServerStatus = { state: "loading" };

  constructor() {
    this.item.name = "Flywheel";
    this.render();
    this.item.show();
  }

  update(s: ServerStatus): void {
    this.last = s;
    this.render();
  }

  /** The client stopped or the server died. */
  stopped(reason?: string): void {
    this.update({ state: "stopped", modelVersion: this.last.modelVersion, message: reason });
  }

  render(): void {
    const s = this.last;
    const icon = ICONS[s.state] ?? "$(circle-slash)";
    const consent = consentSetting() || "the server's default";
    const inline = vscode.workspace.getConfiguration("flywheel").get<boolean>("inlineCompletion.enabled", true);
    if (s.state === "stopped") {
      this.item.text = `${icon} Flywheel stopped`;
      this.item.command = "flywheel.client.restart";
    } else if (s.state === "error") {
      this.item.text = `${icon} Flywheel: ${firstLine(s.message) || "error"}`;
      this.item.command = "flywheel.client.ask";
    } else {
      this.item.text = `${icon} Flywheel ${s.modelVersion || ""}`.trim();
      this.item.command = "flywheel.client.ask";
    }
    const action = s.state === "stopped" ? "Click to restart." : "Click to ask Flywheel.";
    this.item.tooltip = [
      `Flywheel: ${s.state}${s.modelVersion ? ` (model ${s.modelVersion})` : ""}`,
      ...(s.completionModelVersion
        ? [`Inline completions from model ${s.completionModelVersion}`]
        : []),
      ...(s.message ? [firstLine(s.message, 200)] : []),
      `Telemetry consent: ${consent}`,
      `Inline completion: ${inline ? "on" : "off"}`,
      action,
    ].join("\n");
  }

  dispose(): void {
    this.item.dispose();
  }
}

/** A first start's preparation of the model (the base's conversion, a minute or two) as a
 * notification with its percentage, from the statuses that carry `progress`; it closes with the
 * first status without one (ready, error or stopped). */
export class PreparingNotice implements vscode.Disposable {
  private report?: (step: { message?: string; increment?: number }) => void;
  private close?: () => void;
  private shown = 0; // the percentage drawn so far: VS Code's progress takes increments

  update(s: ServerStatus): void {
    if (!s.progress) {
      this.dispose();
      return;
    }
    if (!this.report) {
      void vscode.window.withProgress(
        { location: vscode.ProgressLocation.Notification, title: "Flywheel: preparing the model" },
        (progress) =>
          new Promise<void>((resolve) => {
            this.report = (step) => progress.report(step);
            this.close = resolve;
          }),
      );
    }
    const percentage = Math.max(this.shown, Math.min(100, s.progress.percentage));
    this.report?.({ message: `${percentage}% ${s.progress.message ?? ""}`.trim(), increment: percentage - this.shown });
    this.shown = percentage;
  }

  dispose(): void {
    this.close?.();
    this.report = this.close = undefined;
    this.shown = 0;
  }
}

/** A visible control that rates the last suggestion or task: "👍 👎 Rate", shown once there is
 * something to rate; a click runs flywheel.client.rateSuggestion (rateLast below). */
export class RateItem implements vscode.Disposable {
  readonly item = vscode.window.createStatusBarItem(vscode.StatusBarAlignment.Right, 99);

  constructor() {
    this.item.name = "Flywheel rating";
    this.item.command = "flywheel.client.rateSuggestion";
    this.item.text = "$(thumbsup) $(thumbsdown) Rate";
  }

  offer(what: string): void {
    this.item.tooltip = `Flywheel: rate ${what}`;
    this.item.show();
  }

  dispose(): void {
    this.item.dispose();
  }
}

export async function toggleInlineCompletion(): Promise<void> {
  const config = vscode.workspace.getConfiguration("flywheel");
  const on = !config.get<boolean>("inlineCompletion.enabled", true);
  await config.update("inlineCompletion.enabled", on, vscode.ConfigurationTarget.Global);
  vscode.window.setStatusBarMessage(`Flywheel: inline completion ${on ? "on" : "off"}`, 3000);
}

export async function setConsent(): Promise<void> {
  const now = consentSetting();
  const levels = [
    { label: "off", detail: "Record nothing." },
    { label: "metrics", detail: "Record what happened to suggestions and tasks, without code." },
    { label: "code", detail: "Record everything, code included (for training)." },
  ].map((l) => ({ ...l, description: l.label === now ? "(current)" : undefined }));
  const pick = await vscode.window.showQuickPick(levels, { placeHolder: "Flywheel telemetry consent" });
  if (!pick) return;
  await vscode.workspace
    .getConfiguration("flywheel")
    .update("telemetry.consent", pick.label, vscode.ConfigurationTarget.Global);
}

/** flywheel.rate on the last suggestion shown, or on the last task when that came later. */
export async function rateLast(
  command: (name: string, ...args: unknown[]) => Thenable<any>,
  lastTask: { taskId?: string; at: number },
): Promise<void> {
  const target =
    lastShown.suggestionId && lastShown.at >= lastTask.at
      ? { suggestionId: lastShown.suggestionId, what: "the last suggestion" }
      : lastTask.taskId
        ? { taskId: lastTask.taskId, what: "the last task" }
        : undefined;
  if (!target) {
    vscode.window.showInformationMessage("Flywheel: nothing to rate yet");
    return;
  }
  const { what, ...ids } = target;
  const pick = await vscode.window.showQuickPick(["👍 good (1)", "😐 neutral (0)", "👎 bad (-1)"], {
    placeHolder: `Rate ${what}`,
  });
  if (!pick) return;
  const rating = pick.includes("(1)") ? 1 : pick.includes("(0)") ? 0 : -1;
  const comment = await vscode.window.showInputBox({ prompt: "A comment (optional)" });
  const result = await command("flywheel.rate", { ...ids, rating, comment: comment || undefined });
  if (result && result.recorded === false) {
    vscode.window.setStatusBarMessage("Flywheel: the rating was not recorded (telemetry is off)", 5000);
  }
}
