// Load the dashboard in headless Chromium and report what a user would see.
//   node load_page.cjs PLAYWRIGHT_CORE_DIR URL SCREENSHOT.png
// Prints one JSON line: {"errors": [console errors and page errors],
//   "panels": [{"id", "hasData", "svgs", "rows", "text"}], "emptyState": text|null}
const [, , playwrightDir, url, screenshot] = process.argv;
const { chromium } = require(playwrightDir);

(async () => {
  const browser = await chromium.launch({
    executablePath: '/usr/bin/chromium',
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  const errors = [];
  try {
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    page.on('console', (msg) => { if (msg.type() === 'error') errors.push(msg.text()); });
    page.on('pageerror', (err) => errors.push(String(err)));
    page.on('requestfailed', (req) => errors.push(`request failed: ${req.url()}`));
    const response = await page.goto(url, { waitUntil: 'load' });
    if (!response.ok()) errors.push(`HTTP ${response.status()}`);
    const panels = await page.$$eval('section.panel', (nodes) => nodes.map((n) => ({
      id: n.id,
      hasData: n.dataset.hasData === 'true',
      svgs: n.querySelectorAll('svg').length,
      rows: n.querySelectorAll('table tr').length,
      text: n.innerText.slice(0, 3000),
    })));
    const banner = await page.$('#empty-state');
    const emptyState = banner ? await banner.innerText() : null;
    await page.screenshot({ path: screenshot, fullPage: true });
    console.log(JSON.stringify({ errors, panels, emptyState }));
  } finally {
    await browser.close();
  }
})().catch((err) => { console.error(String(err)); process.exit(1); });
