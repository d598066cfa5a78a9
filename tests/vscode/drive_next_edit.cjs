// Drive code-server through ghost text, a next edit and a dismissed ghost text
// (tests/vscode/test_vscode.py::test_next_edit_and_feedback_in_code_server).
//
//   node drive_next_edit.cjs '{"url": ..., "file": "calc.py", "expect": "a + b", "artifacts": DIR}'
//
// Steps, the session tests/lsp/nvim/next_edit.lua plays in Neovim: trigger an inline suggestion
// at the end of the file and accept it with Tab; the next edit the server predicts is drawn (old
// text struck through, new text after it): read what the decorations draw ("next-edit"
// screenshot); Tab jumps to it (the cursor goes to its line), Tab applies it. A ghost text on a
// new function body is kept in part (Accept Word) and the rest dismissed; another is dismissed
// with Escape; save. Then the server is stopped (SIGTERM): the
// status bar reads "Flywheel stopped", one error message says so, and a click on the item starts
// a new server. The last line printed is a JSON summary
// (workbench.cjs has the shared steps).
"use strict";
const { WAIT, cursorOnLine, decorations, editorText, ghostGone, ghostText, openFile, runCommand, session } = require("./workbench.cjs");

const opts = JSON.parse(process.argv[2]);

async function waitForDecorations(page, test, what) {
  const deadline = Date.now() + WAIT.timeout;
  for (;;) {
    const d = await decorations(page);
    if (test(d)) return d;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}: ${JSON.stringify(d)}`);
    await page.waitForTimeout(200);
  }
}

/** Put `text` at the end of the file in one edit (typing would be auto-indented, and each key
 * would ask for ghost text). */
async function paste(page, text) {
  await page.keyboard.press("Control+End");
  await page.evaluate((t) => navigator.clipboard.writeText(t), text);
  await page.keyboard.press("Control+V");
}

const drawn = (d) => d.injected.some((c) => c.includes(opts.expect));

session(opts, async (page, summary, shot) => {
  await openFile(page, opts.url, opts.file);

  // 1. ghost text at the end of the file, accepted with Tab
  await runCommand(page, "Trigger Inline Suggestion");
  summary.ghost = await ghostText(page);
  await shot(page, "ghost-text");
  await page.keyboard.press("Tab");

  // 2. the next edit it brings, drawn where it applies; Tab jumps to it, Tab applies it
  summary.nextEdit = await waitForDecorations(page, drawn, "the next edit");
  summary.nextEditShot = await shot(page, "next-edit");
  await page.keyboard.press("Tab"); // jump: the cursor goes to the edit's line
  await cursorOnLine(page, opts.editLine);
  summary.afterJump = await decorations(page);
  await shot(page, "next-edit-jumped");
  await page.keyboard.press("Tab"); // apply
  await waitForDecorations(page, (d) => !drawn(d) && d.struck.length === 0, "the next edit to be applied");
  await shot(page, "next-edit-accepted");

  // 3. ghost text on a new function body, its first word kept (Accept Word), the rest dismissed
  await paste(page, "\n\ndef sub(a, b):\n    "); // one edit, as Neovim's script makes it
  summary.partGhost = await ghostText(page); // asked for by VS Code itself after the paste
  await page.keyboard.press("Control+ArrowRight"); // editor.action.inlineSuggest.acceptNextWord
  await page.locator(".monaco-editor .view-lines", { hasText: "    return" }).first().waitFor(WAIT);
  await shot(page, "ghost-text-word-accepted");
  await page.keyboard.press("Escape");
  await ghostGone(page);

  // 4. ghost text on another new function body, dismissed with Escape
  await paste(page, "\n\ndef div(a, b):\n    ");
  await ghostText(page);
  await page.keyboard.press("Escape");
  await ghostGone(page);
  await page.keyboard.press("Control+S");
  await page.waitForTimeout(1500); // the end of a lifetime is reported after a grace period
  summary.final = await editorText(page);

  // The server goes away: the status bar says so, one error message, and a click restarts it.
  const fs = require("fs");
  const firstPid = Number(fs.readFileSync(opts.lspPidFile, "utf8"));
  process.kill(firstPid, "SIGTERM");
  const stopped = page.locator(".statusbar-item", { hasText: "Flywheel stopped" }).first();
  await stopped.waitFor(WAIT);
  await page.locator(".notification-toast", { hasText: "Flywheel stopped" }).first().waitFor(WAIT);
  await page.waitForTimeout(1000);
  summary.stoppedMessages = await page.locator(".notification-toast", { hasText: "Flywheel stopped" }).count();
  await shot(page, "server-stopped");
  await stopped.click();
  await page.locator(".statusbar-item", { hasText: "Flywheel replay-1" }).first().waitFor(WAIT);
  summary.restartedPid = Number(fs.readFileSync(opts.lspPidFile, "utf8"));
  // The "stopped" notification does not outlive the stop.
  await page.locator(".notification-toast", { hasText: "Flywheel stopped" }).first()
    .waitFor({ state: "detached", ...WAIT });
  summary.stoppedMessagesAfterRestart = await page
    .locator(".notification-toast", { hasText: "Flywheel stopped" }).count();
  summary.firstPid = firstPid;
  await shot(page, "server-restarted");
});
