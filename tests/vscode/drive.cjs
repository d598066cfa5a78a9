// Drive code-server in headless Chromium through one Flywheel session (tests/vscode/test_vscode.py).
//
//   node drive.cjs '{"url": ..., "file": "calc.py", "question": ..., "artifacts": DIR}'
//
// Steps: open the workbench and the file, wait for the Flywheel status-bar item with the model
// version, trigger an inline suggestion at the end of the file, see the ghost text
// (.ghost-text-decoration) and accept it with Tab, save; run "Flywheel: Ask", accept the proposal
// from its notification ("Accept All"), save. A screenshot is taken after each step into
// ARTIFACTS; the last line printed is a JSON summary. Every wait is for an element or a text,
// with a timeout as a hang guard. PLAYWRIGHT_CORE is the playwright-core package folder.
"use strict";
const { chromium } = require(process.env.PLAYWRIGHT_CORE);
const path = require("path");

const opts = JSON.parse(process.argv[2]);
const WAIT = { timeout: 60_000 };
const summary = { steps: [] };

async function shot(page, name) {
  const file = path.join(opts.artifacts, `${String(summary.steps.length + 1).padStart(2, "0")}-${name}.png`);
  await page.screenshot({ path: file });
  summary.steps.push(name);
}

async function editorText(page) {
  const text = await page.locator(".monaco-editor .view-lines").first().innerText();
  return text.replace(/\u00a0/g, " ");
}

async function runCommand(page, title) {
  await page.keyboard.press("F1");
  const input = page.locator(".quick-input-widget input");
  await input.waitFor(WAIT);
  await input.fill(">" + title);
  await page.locator(".quick-input-list .monaco-list-row", { hasText: title }).first().waitFor(WAIT);
  await page.keyboard.press("Enter");
}

(async () => {
  const browser = await chromium.launch({
    executablePath: "/usr/bin/chromium",
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
  try {
    await page.goto(opts.url);
    await page.locator(".monaco-workbench").waitFor(WAIT);
    await page.getByText(/Flywheel replay-1/).first().waitFor(WAIT);
    await shot(page, "workbench");

    await page.keyboard.press("Control+P");
    await page.locator(".quick-input-widget input").waitFor(WAIT);
    await page.keyboard.type(opts.file);
    await page.locator(".quick-input-list .monaco-list-row", { hasText: opts.file }).first().waitFor(WAIT);
    await page.keyboard.press("Enter");
    await page.locator(".monaco-editor .view-lines").first().waitFor(WAIT);
    await page.locator(".monaco-editor .view-line").last().click();
    await page.keyboard.press("Control+End");
    await page.locator(".editor-status-selection", { hasText: "Ln 6" }).first().waitFor(WAIT).catch(() => {});
    await shot(page, "file-open");

    await runCommand(page, "Trigger Inline Suggestion");
    const ghost = page.locator(".ghost-text-decoration").first();
    await ghost.waitFor(WAIT);
    // Monaco splits the ghost text into one span per token.
    const parts = await page.locator(".ghost-text-decoration").allInnerTexts();
    summary.ghost = parts.join("").replace(/\u00a0/g, " ");
    await shot(page, "ghost-text");
    await page.keyboard.press("Tab");
    await page.locator(".ghost-text-decoration").first().waitFor({ state: "detached", ...WAIT });
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
    summary.ok = true;
  } catch (err) {
    summary.error = String(err && err.stack || err);
    await shot(page, "failure").catch(() => {});
  } finally {
    await browser.close();
  }
  console.log(JSON.stringify(summary));
})();
