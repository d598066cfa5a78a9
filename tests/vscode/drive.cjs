// Drive code-server in headless Chromium through one Flywheel session (tests/vscode/test_vscode.py).
//
//   node drive.cjs '{"url": ..., "file": "calc.py", "question": ..., "artifacts": DIR}'
//
// Steps: open the workbench and the file, wait for the Flywheel status-bar item with the model
// version, trigger an inline suggestion at the end of the file, see the ghost text
// (.ghost-text-decoration) and accept it with Tab, save; run "Flywheel: Ask", accept the proposal
// from its notification ("Accept All"), save. A screenshot is taken after each step into
// ARTIFACTS; the last line printed is a JSON summary (workbench.cjs has the shared steps).
"use strict";
const { WAIT, editorText, ghostText, openFile, runCommand, session } = require("./workbench.cjs");

const opts = JSON.parse(process.argv[2]);

session(opts, async (page, summary, shot) => {
  await openFile(page, opts.url, opts.file);
  await shot(page, "file-open");

  await runCommand(page, "Trigger Inline Suggestion");
  summary.ghost = await ghostText(page);
  await shot(page, "ghost-text");
  await page.keyboard.press("Tab");
  await page.locator(".ghost-text-decoration").first().waitFor({ state: "detached", ...WAIT }); // accepted
  await page.keyboard.press("Control+S");
  summary.afterCompletion = await editorText(page);
  await shot(page, "ghost-text-accepted");

  await runCommand(page, "Flywheel: Ask");
  await page.locator(".quick-input-widget", { hasText: "Ask Flywheel" }).first().waitFor(WAIT);
  await page.keyboard.type(opts.question);
  await page.keyboard.press("Enter");
  const toast = page.locator(".notification-toast", { hasText: "Flywheel proposes" }).first();
  await toast.waitFor(WAIT);
  await shot(page, "proposal");
  await toast.getByRole("button", { name: "Accept All" }).click();
  await page.locator(".monaco-editor .view-lines", { hasText: opts.expect }).first().waitFor(WAIT);
  await page.locator(".monaco-editor textarea").first().focus();
  await page.keyboard.press("Control+S");
  summary.afterTask = await editorText(page);
  await shot(page, "proposal-accepted");
});
