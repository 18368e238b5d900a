// Drives Debian's Chromium against memwatch's dashboard: node dashboard.mjs URL SCREENSHOT_PREFIX JOB
// Prints "charts" once every chart has data (the test then attaches JOB, which the daemon pauses), then
// waits for JOB to show as paused, at a laptop and at a phone width. Any console error, page error,
// failed request, or a page wider than the screen fails it.
import { chromium } from "playwright-core";
import { createInterface } from "node:readline";

const [url, shot, job] = process.argv.slice(2);
const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"],
});
const errors = [];
const charts = ["c-ram", "c-swap", "c-psi", "c-gpumem", "c-gputemp"];
let first = true;
for (const viewport of [{ width: 1280, height: 900 }, { width: 390, height: 844 }]) {
  const page = await browser.newPage({ viewport });
  page.on("console", m => { if (m.type() === "error") errors.push(`console: ${m.text()}`); });
  page.on("pageerror", e => errors.push(`page error: ${e}`));
  page.on("requestfailed", r => errors.push(`request failed: ${r.url()}`));
  await page.goto(url);
  await page.waitForFunction(ids => ids.every(id => +document.getElementById(id).dataset.points > 0), charts, { timeout: 15000 });
  if (first) {
    console.log("charts");
    await lines.next(); // the test has attached the job
    first = false;
  }
  const t0 = Date.now();
  await page.waitForSelector(`tr[data-job="${job}"] [data-state="paused"]`, { timeout: 10000 });
  console.log(`paused shown after ${Date.now() - t0} ms at ${viewport.width}px`);
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  if (overflow > 1) errors.push(`the page is ${overflow}px wider than a ${viewport.width}px screen`);
  await page.screenshot({ path: `${shot}-${viewport.width}.png`, fullPage: true });
  await page.close();
}
await browser.close();
if (errors.length) {
  console.error(errors.join("\n"));
  process.exit(1);
}
console.log("ok");
process.exit(0);
