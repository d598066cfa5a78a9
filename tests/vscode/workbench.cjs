// Shared steps for the code-server drivers (drive*.cjs): start headless
// Chromium, open the workbench and a file, run a palette command, take numbered screenshots,
// read the editor's text and what decorations draw. Every wait is for an element or a text, with
// a timeout as a hang guard. PLAYWRIGHT_CORE is the playwright-core package folder.
//
// `session(opts, steps)` runs `steps(page, summary)` and prints the summary as the last line of
// stdout (JSON; `ok` when every step passed, `error` otherwise, with a "failure" screenshot).
"use strict";
const { chromium } = require(process.env.PLAYWRIGHT_CORE);
const path = require("path");

const WAIT = { timeout: 60_000 };

function shooter(opts, summary) {
  return async (page, name) => {
    const file = path.join(opts.artifacts, `${String(summary.steps.length + 1).padStart(2, "0")}-${name}.png`);
    await page.screenshot({ path: file });
    summary.steps.push(name);
    return file;
  };
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

/** The cursor is on `line` (1-based), as the status bar says. */
function cursorOnLine(page, line) {
  return page.locator(".statusbar-item", { hasText: new RegExp(`Ln ${line}, Col`) }).first().waitFor(WAIT);
}

/** Open the workbench, wait for Flywheel's status item (`status`: the model's version in it), open
 * `file` with the cursor at its end; `url` null: the workbench is already open. */
async function openFile(page, url, file, status = /Flywheel replay-1/) {
  if (url) await page.goto(url);
  await page.locator(".monaco-workbench").waitFor(WAIT);
  await page.getByText(status).first().waitFor(WAIT);
  await page.keyboard.press("Control+P");
  await page.locator(".quick-input-widget input").waitFor(WAIT);
  await page.keyboard.type(file);
  await page.locator(".quick-input-list .monaco-list-row", { hasText: file }).first().waitFor(WAIT);
  await page.keyboard.press("Enter");
  await page.locator(".monaco-editor .view-lines").first().waitFor(WAIT);
  await page.locator(".monaco-editor .view-line").last().click();
  await page.keyboard.press("Control+End");
}

// Ghost text: spans on the cursor's line (one per token), and lines below it in a view zone.
const GHOST = ".ghost-text-decoration, .ghost-text";

/** The ghost text on screen, once there is one. */
async function ghostText(page, wait = WAIT) {
  await page.locator(GHOST).first().waitFor(wait);
  const inline = await page.locator(".ghost-text-decoration").allInnerTexts();
  const below = await page.locator(".ghost-text").allInnerTexts();
  return [inline.join(""), below.join("")].filter(Boolean).join("\n").replace(/\u00a0/g, " ");
}

function ghostGone(page) {
  return page.locator(GHOST).first().waitFor({ state: "detached", ...WAIT });
}

/** What decorations draw in the editor: ::before/::after contents and struck-through text. */
function decorations(page) {
  return page.evaluate(() => {
    const out = { injected: [], struck: [] };
    for (const el of document.querySelectorAll(".monaco-editor .view-lines span")) {
      for (const pseudo of ["::before", "::after"]) {
        const c = getComputedStyle(el, pseudo).content;
        if (c && c !== "none" && c !== "normal") out.injected.push(c.replace(/^"|"$/g, ""));
      }
      if (el.children.length === 0 && getComputedStyle(el).textDecorationLine.includes("line-through")) {
        out.struck.push(el.textContent.replace(/\u00a0/g, " "));
      }
    }
    return out;
  });
}

async function session(opts, steps) {
  const summary = { steps: [] };
  const browser = await chromium.launch({
    executablePath: "/usr/bin/chromium",
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  const context = await browser.newContext({ viewport: { width: 1400, height: 900 } });
  await context.grantPermissions(["clipboard-read", "clipboard-write"], { origin: new URL(opts.url).origin });
  const page = await context.newPage();
  const shot = shooter(opts, summary);
  try {
    await steps(page, summary, shot);
    summary.ok = true;
  } catch (err) {
    summary.error = String((err && err.stack) || err);
    await shot(page, "failure").catch(() => {});
  } finally {
    await browser.close();
  }
  console.log(JSON.stringify(summary));
}

module.exports = { WAIT, cursorOnLine, decorations, editorText, ghostGone, ghostText, openFile, runCommand, session };
