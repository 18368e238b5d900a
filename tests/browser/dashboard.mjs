// Drives Debian's Chromium against memwatch's dashboard: node dashboard.mjs URL SCREENSHOT_PREFIX JOB
// (SCREENSHOT_PREFIX-1280.png and -390.png, each screen's first view, are written last: the test keeps
// them in docs/).
// Prints "charts" once every chart has data (the test then attaches JOB, which the daemon pauses), then
// waits for JOB to show as paused, at a laptop and at a phone width, and checks:
// - the tiles show the numbers /api/v1/snapshot gives, with the levels /api/v1/jobs gives;
// - no element sticks out of its section, and the page is no wider than the screen;
// - at a phone width the paused job is on the first screen;
// - the CUDA OOM its trainer reported shows in the job's entry;
// - one request per endpoint in flight at a time, and history fetched incrementally after the first.
// Any console error, page error or failed request fails it.
//
// node dashboard.mjs URL SCREENSHOT_PREFIX --empty: a daemon on a machine with no swap and no GPU. At
// both widths the swap chart and tile say "no swap on this machine" and the GPU charts, tiles and table
// "no GPU on this machine", with nothing drawn on those charts (no "no data" under the words), while
// RAM and pressure have their charts. Screenshots: SCREENSHOT_PREFIX-empty-WIDTH.png.
import { chromium } from "playwright-core";
import { createInterface } from "node:readline";

const [url, shot, job] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"],
});
const errors = [];
const viewports = [{ width: 1280, height: 900 }, { width: 390, height: 844 }];
async function open(viewport) {
  const page = await browser.newPage({ viewport });
  page.on("console", m => { if (m.type() === "error") errors.push(`console: ${m.text()}`); });
  page.on("pageerror", e => errors.push(`page error: ${e}`));
  page.on("requestfailed", r => errors.push(`request failed: ${r.url()}`));
  return page;
}
function finish() {
  if (errors.length) {
    console.error(errors.join("\n"));
    process.exit(1);
  }
  console.log("ok");
  process.exit(0);
}

if (job === "--empty") {
  const NO_SWAP = "no swap on this machine", NO_GPU = "no GPU on this machine";
  for (const viewport of viewports) {
    const page = await open(viewport);
    await page.goto(url);
    await page.waitForFunction(() => ["c-ram", "c-psi"].every(id => +document.getElementById(id).dataset.points > 0)
      && document.querySelector('[data-tile="gpu"]'), null, { timeout: 15000 });
    const found = await page.evaluate(({ NO_SWAP, NO_GPU }) => {
      const out = [];
      for (const [id, why] of [["swap", NO_SWAP], ["gpumem", NO_GPU], ["gputemp", NO_GPU]]) {
        const c = document.getElementById("c-" + id), e = document.getElementById("e-" + id);
        const px = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
        out.push([`${id} chart points`, c.dataset.points, "-1"], [`${id} chart line`, e.hidden ? "(hidden)" : e.textContent, why],
          [`${id} chart: pixels drawn on its canvas`, px.some(v => v !== 0), false],
          [`${id} section says "no data"`, c.closest("section").innerText.includes("no data"), false]);
      }
      const t = id => document.querySelector(`[data-tile="${id}"]`);
      out.push(["swap tile", t("swap")?.querySelector(".sub").textContent, NO_SWAP],
        ["GPU tile", t("gpu")?.querySelector(".sub").textContent, NO_GPU],
        ["GPU memory tiles", document.querySelectorAll('[data-tile^="gpu-mem-"]').length, 0],
        ["GPU table says", document.querySelector('#gpus tr[data-gpu="none"]')?.textContent.includes(NO_GPU), true]);
      return out;
    }, { NO_SWAP, NO_GPU });
    for (const [what, shown, want] of found) {
      if (shown !== want) errors.push(`${viewport.width}px: ${what}: ${JSON.stringify(shown)}, expected ${JSON.stringify(want)}`);
    }
    await page.screenshot({ path: `${shot}-empty-${viewport.width}.png`, fullPage: true });
    await page.close();
  }
  await browser.close();
  finish();
}

const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
const charts = ["c-ram", "c-swap", "c-psi", "c-gpumem", "c-gputemp"];
let first = true;
for (const viewport of viewports) {
  const page = await open(viewport);
  // Requests in flight per endpoint, and the history URLs asked for.
  const inFlight = new Map(), history = [];
  const key = u => new URL(u).pathname;
  page.on("request", r => {
    const k = key(r.url());
    if (k === "/api/v1/history") history.push(new URL(r.url()).search);
    inFlight.set(k, (inFlight.get(k) || 0) + 1);
    if (inFlight.get(k) > 1) errors.push(`two requests to ${k} in flight at once`);
  });
  const done = r => { const k = key(r.url()); inFlight.set(k, (inFlight.get(k) || 1) - 1); };
  page.on("requestfinished", done);
  page.on("requestfailed", done);
  await page.goto(url);
  await page.waitForFunction(ids => ids.every(id => +document.getElementById(id).dataset.points !== 0), charts, { timeout: 15000 });
  if (first) {
    console.log("charts");
    await lines.next(); // the test has attached the job
    first = false;
  }
  const t0 = Date.now();
  await page.waitForSelector(`tr[data-job="${job}"] [data-state="paused"]`, { timeout: 10000 });
  console.log(`paused shown after ${Date.now() - t0} ms at ${viewport.width}px`);
  // The CUDA OOM its trainer reported, in the job's entry.
  const oom = await page.waitForSelector(`tr[data-job="${job}"] [data-cuda-oom="1"]`, { timeout: 10000 }).then(e => e.textContent());
  if (!oom.includes("1 recovered") || !oom.includes("micro-batch 32 → 16 × accumulation 4 at epoch 2"))
    errors.push(`${viewport.width}px: the job's CUDA OOM reads ${JSON.stringify(oom)}`);
  // Tiles against the API, read in the page at the same moment.
  const tiles = await page.evaluate(async () => {
    const snap = await (await fetch("/api/v1/snapshot")).json();
    const jobs = await (await fetch("/api/v1/jobs")).json();
    const t = id => document.querySelector(`[data-tile="${id}"]`);
    const level = k => (jobs.levels.find(l => l.resource === k) || { level: "ok" }).level;
    const out = [];
    const m = snap.host.memory, ram = t("ram");
    out.push(["ram total", +ram.dataset.total, m.total_bytes], ["ram available", +ram.dataset.available, m.available_bytes],
      ["ram text", ram.querySelector("[data-value]").textContent, `${fmtBytes(m.total_bytes - m.available_bytes)} / ${fmtBytes(m.total_bytes)}`],
      ["ram level", ram.dataset.level, level("host_memory")]);
    const swap = t("swap");
    out.push(["swap used", +swap.dataset.used, m.swap_total_bytes - m.swap_free_bytes], ["swap level", swap.dataset.level, level("swap")]);
    for (const g of snap.gpus) {
      const gm = t(`gpu-mem-${g.index}`), gt = t(`gpu-temp-${g.index}`);
      out.push([`gpu ${g.index} used`, +gm.dataset.used, g.memory_used_bytes], [`gpu ${g.index} total`, +gm.dataset.total, g.memory_total_bytes],
        [`gpu ${g.index} memory level`, gm.dataset.level, level(`gpu_memory:${g.index}`)],
        [`gpu ${g.index} celsius`, +gt.dataset.celsius, g.temperature_celsius], [`gpu ${g.index} rows`,
          document.querySelectorAll(`tr[data-gpu="${g.index}"]`).length, 1]);
      for (const p of g.processes || []) out.push([`gpu ${g.index} pid ${p.pid} row`, document.querySelectorAll(`tr.proc[data-pid="${p.pid}"]`).length > 0, true]);
    }
    out.push(["host name", document.getElementById("host").textContent, snap.host.hostname]);
    return out;
  });
  for (const [what, shown, api] of tiles) {
    if (shown !== api) errors.push(`${viewport.width}px: ${what}: the page shows ${shown}, the API says ${api}`);
  }
  // Nothing sticks out of its section.
  const outside = await page.evaluate(() => {
    const bad = [];
    for (const s of document.querySelectorAll("main section")) {
      const box = s.getBoundingClientRect();
      for (const el of s.querySelectorAll("*")) {
        const r = el.getBoundingClientRect();
        if (r.width && (r.right > box.right + 1 || r.left < box.left - 1)) bad.push(`${s.id || s.querySelector("h2").textContent}: <${el.tagName.toLowerCase()}> ${Math.round(r.left)}–${Math.round(r.right)} outside ${Math.round(box.left)}–${Math.round(box.right)}`);
      }
    }
    return bad.slice(0, 5);
  });
  errors.push(...outside.map(b => `${viewport.width}px: ${b}`));
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  if (overflow > 1) errors.push(`the page is ${overflow}px wider than a ${viewport.width}px screen`);
  if (viewport.width < 700) {
    const top = await page.evaluate(j => document.querySelector(`tr[data-job="${j}"]`).getBoundingClientRect().top, job);
    if (top > viewport.height) errors.push(`the paused job is ${Math.round(top)}px down, below the first screen`);
  }
  // Later rounds ask for history incrementally.
  for (const until = Date.now() + 10000; history.length < 3 && Date.now() < until;) await new Promise(r => setTimeout(r, 50));
  if (!history[0]?.startsWith("?seconds=") || history.length < 2 || !history.slice(1).every(q => q.startsWith("?since_ms=")))
    errors.push(`history requests: ${history.join(" ")}`);
  // The first screen only (at 390 px: the paused job first), small enough to keep in docs/.
  await page.screenshot({ path: `${shot}-${viewport.width}.png` });
  await page.close();
}
await browser.close();
finish();
