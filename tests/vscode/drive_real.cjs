// Drive code-server in headless Chromium through a new user's first minutes with a real model
// (tests/vscode/test_vscode.py's real-default test).
//
//   node drive_real.cjs '{"url": ..., "file": "shapes.py", "status": REGEX, "question": ...,
//                         "artifacts": DIR, "readyMs": N, "taskMs": N}'
//
// Steps: open the workbench and watch the first start until the status bar shows the model
// (`status`), keeping what the progress notifications said and a screenshot of the first one
// (an empty cache converts the base first); open the file with the cursor at its end, ask for an
// inline suggestion and accept it with Tab; run "Flywheel: Ask" with `question` and wait for the
// model's proposal to be drawn in the editor (code lenses over its hunks), then "Flywheel: Accept
// All Hunks" and save. What the model writes is the model's: the summary reports it, the test
// checks only that each step happened in the editor. The last line printed is a JSON summary.
"use strict";
const { WAIT, decorations, editorText, ghostText, openFile, runCommand, session } = require("./workbench.cjs");

const opts = JSON.parse(process.argv[2]);

session(opts, async (page, summary, shot) => {
  await page.goto(opts.url);
  await page.locator(".monaco-workbench").waitFor(WAIT);
  const ready = page.getByText(new RegExp(opts.status)).first();
  const deadline = Date.now() + opts.readyMs;
  summary.progress = [];
  while (!(await ready.isVisible())) {
    for (const toast of await page.locator(".notification-toast").allInnerTexts()) {
      const line = toast.replace(/\s+/g, " ").trim();
      if (/Flywheel|%/.test(line) && !summary.progress.includes(line)) {
        summary.progress.push(line);
        if (!summary.progressShot) summary.progressShot = await shot(page, "first-start-progress");
      }
    }
    if (Date.now() > deadline) throw new Error(`no "${opts.status}" in the status bar in time`);
    await page.waitForTimeout(250);
  }
  summary.readyShot = await shot(page, "model-ready");
  summary.errorsShown = await page.locator(".notification-toast", { hasText: /error|failed/i }).count();

  await openFile(page, null, opts.file, new RegExp(opts.status));
  const before = await editorText(page);
  await runCommand(page, "Trigger Inline Suggestion");
  summary.ghost = await ghostText(page, { timeout: opts.taskMs });
  summary.ghostShot = await shot(page, "ghost-text");
  await page.keyboard.press("Tab");
  await page.locator(".ghost-text-decoration").first().waitFor({ state: "detached", ...WAIT });
  await page.keyboard.press("Control+S");
  summary.afterCompletion = await editorText(page);
  summary.completed = summary.afterCompletion !== before;

  await runCommand(page, "Flywheel: Ask");
  await page.locator(".quick-input-widget", { hasText: "Ask Flywheel" }).first().waitFor(WAIT);
  await page.keyboard.type(opts.question);
  await page.keyboard.press("Enter");
  const lens = page.locator(".codelens-decoration a", { hasText: "accept hunk 1" }).first();
  await lens.waitFor({ timeout: opts.taskMs });
  summary.proposalDrawn = await decorations(page);
  summary.proposalToasts = await page.locator(".notification-toast", { hasText: "Flywheel proposes" }).count();
  summary.proposalShot = await shot(page, "proposal-inline");
  await runCommand(page, "Flywheel: Accept All Hunks");
  await lens.waitFor({ state: "detached", ...WAIT });
  await page.locator(".monaco-editor textarea").first().focus();
  await page.keyboard.press("Control+S");
  summary.afterTask = await editorText(page);
  summary.acceptedShot = await shot(page, "proposal-accepted");
});
