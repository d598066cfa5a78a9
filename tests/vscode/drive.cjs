// Drive code-server in headless Chromium through one Flywheel session (tests/vscode/test_vscode.py).
//
//   node drive.cjs '{"url": ..., "file": "calc.py", "question": ..., "artifacts": DIR}'
//
// Steps: open the workbench and the file, wait for the Flywheel status-bar item with the model
// version, trigger an inline suggestion at the end of the file, see the ghost text
// (.ghost-text-decoration) and accept it with Tab, save; run "Flywheel: Ask": its two hunks are
// drawn in the editor; reject the second from its code lens, accept the rest with "Flywheel:
// Accept All Hunks", save; rate the task from the status bar. A screenshot is taken after each step into
// ARTIFACTS; the last line printed is a JSON summary (workbench.cjs has the shared steps).
"use strict";
const { WAIT, decorations, editorText, ghostText, openFile, runCommand, session } = require("./workbench.cjs");

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
  // The proposal is drawn in the editor (no pop-up): removed lines red and struck through, the new
  // lines in green beside them, and code lenses to accept or reject each hunk.
  const lens = (title) => page.locator(".codelens-decoration a", { hasText: title }).first();
  await lens("accept hunk 1").waitFor(WAIT);
  await lens("accept hunk 2").waitFor(WAIT);
  summary.proposalDrawn = await decorations(page);
  summary.proposalToasts = await page.locator(".notification-toast", { hasText: "Flywheel proposes" }).count();
  summary.proposalShot = await shot(page, "proposal-inline");
  // Reject the second hunk from its lens: its decorations and lenses go at once.
  await page.locator(".codelens-decoration", { hasText: "accept hunk 2" }).first()
    .locator("a", { hasText: "reject" }).click();
  await lens("accept hunk 2").waitFor({ state: "detached", ...WAIT });
  summary.afterReject = await decorations(page);
  summary.rejectShot = await shot(page, "hunk-rejected");
  // Accept All (the palette) applies the rest; then no lens and no decoration is left.
  await runCommand(page, "Flywheel: Accept All Hunks");
  await page.locator(".monaco-editor .view-lines", { hasText: opts.expect }).first().waitFor(WAIT);
  await lens("accept hunk 1").waitFor({ state: "detached", ...WAIT });
  summary.lensesAfterAll = await page.locator(".codelens-decoration a", { hasText: "Flywheel" }).count();
  summary.noticesAfterAll = await page.locator(".statusbar-item", { hasText: "change(s) proposed" }).count();
  summary.afterAll = await decorations(page);
  await page.locator(".monaco-editor textarea").first().focus();
  await page.keyboard.press("Control+S");
  summary.afterTask = await editorText(page);
  summary.acceptedShot = await shot(page, "proposal-accepted");

  // The rating control in the status bar rates the last task.
  const rate = page.locator(".statusbar-item", { hasText: "Rate" }).first();
  await rate.waitFor(WAIT);
  await rate.click();
  await page.locator('.quick-input-widget input[placeholder="Rate the last task"]').first().waitFor(WAIT);
  summary.rateShot = await shot(page, "rate-last-task");
  await page.locator(".quick-input-list .monaco-list-row", { hasText: "good (1)" }).first().click();
  await page.locator(".quick-input-widget", { hasText: "A comment" }).first().waitFor(WAIT);
  await page.keyboard.type("inline review");
  await page.keyboard.press("Enter");
  await page.locator(".quick-input-widget").first().waitFor({ state: "hidden", ...WAIT });
});
