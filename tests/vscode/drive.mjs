// Drives a running code-server (real VS Code 1.139 in the browser) with Debian's Chromium through
// playwright-core, and prints one JSON object on stdout for the pytest side to assert on.
//
//   node drive.mjs '{"mode": "exthost", "url": …, "resultFile": …, "timeoutMs": …}'
//   node drive.mjs '{"mode": "ui", "url": …, "mission": "name", "answer": "text", "shots": "dir"}'
//
// exthost: open the workbench with an extensionTestsPath payload and wait for the suite's result file.
// ui: the person's path — open the keel view, see the mission's rows, pause it from the status bar,
// resume it, answer its question through the input box — with a screenshot at every stage.
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { chromium } from "playwright-core";
import { activity, welcome } from "./activity.mjs";

const config = JSON.parse(process.argv[2]);
const CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
  "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"];
const consoleLines = [];
const steps = [];

function sleep(ms) {
  return new Promise((r) => setTimeout(r, ms));
}

async function main() {
  const browser = await chromium.launch({ executablePath: config.chromium ?? "/usr/bin/chromium", headless: true,
    args: CHROMIUM_ARGS });
  try {
    const page = await browser.newPage({ viewport: { width: 1400, height: 860 } });
    page.on("console", (msg) => consoleLines.push(`${msg.type()}: ${msg.text()}`.slice(0, 4000)));
    page.on("pageerror", (err) => consoleLines.push(`pageerror: ${err.message}`));
    await page.goto(config.url, { waitUntil: "domcontentloaded" });
    await page.locator(".monaco-workbench").waitFor({ timeout: 60_000 });
    const helpers = { config, shot, waitUntil, steps, sleep, startFromPalette };
    const modes = { exthost: extensionHost, ui, activity: (p) => activity(p, helpers), welcome: (p) => welcome(p, helpers) };
    return await modes[config.mode](page);
  } finally {
    await browser.close();
  }
}

async function extensionHost() {
  const deadline = Date.now() + (config.timeoutMs ?? 90_000);
  while (!existsSync(config.resultFile)) {
    if (Date.now() > deadline) {
      throw new Error(`no extension-host test result at ${config.resultFile}`);
    }
    await sleep(200);
  }
  await sleep(100); // the suite writes the file in one call; let it close
  return { suite: JSON.parse(readFileSync(config.resultFile, "utf8")) };
}

async function statusText(page) {
  const item = page.locator(".statusbar-item", { hasText: "keel:" }).first();
  return (await item.count()) > 0 ? (await item.innerText()).trim() : "";
}

async function waitUntil(page, what, probe, timeoutMs = 60_000) {
  const deadline = Date.now() + timeoutMs;
  let last;
  for (;;) {
    last = await probe();
    if (last) {
      steps.push({ step: what, ms: Date.now() - started });
      return last;
    }
    if (Date.now() > deadline) {
      const shot = join(config.shots, `failed-${steps.length}.png`);
      await page.screenshot({ path: shot });
      throw new Error(`timed out waiting for ${what} (status bar: ${JSON.stringify(await statusText(page))}; ` +
        `screenshot ${shot})`);
    }
    await sleep(100);
  }
}

async function missionRow(page) {
  const row = page.locator(".monaco-list-row", { hasText: config.mission }).first();
  return (await row.count()) > 0 ? (await row.innerText()).replace(/\s+/g, " ").trim() : "";
}

/** The inline action buttons VS Code renders on a row (package.json menus, by contextValue). */
async function inlineActions(page, text) {
  const row = page.locator(".monaco-list-row", { hasText: text }).first();
  await row.hover();
  await sleep(150);
  return row.locator(".actions .action-label").evaluateAll((els) => els.map((e) => e.getAttribute("aria-label")));
}

/** keel: Start Mission… from the command palette, picking config.missionFile; returns the picked row's text. */
async function startFromPalette(page) {
  await page.keyboard.press("F1");
  const palette = page.locator(".quick-input-widget input").first();
  await palette.waitFor({ state: "visible", timeout: 60_000 });
  await palette.fill(">keel: Start Mission");
  await page.locator(".quick-input-list .monaco-list-row", { hasText: "Start Mission" }).first().waitFor({ timeout: 60_000 });
  await palette.press("Enter");
  const fileRow = page.locator(".quick-input-list .monaco-list-row", { hasText: config.missionFile }).first();
  await fileRow.waitFor({ timeout: 60_000 });
  const picked = (await fileRow.innerText()).trim();
  await palette.press("Enter");
  steps.push({ step: "started from the palette", ms: Date.now() - started });
  return picked;
}

async function shot(page, name) {
  const file = join(config.shots, `${name}.png`);
  await page.screenshot({ path: file });
  return file;
}

const started = Date.now();

async function ui(page) {
  const seen = {};
  const shots = [];
  const keel = page.locator('.activitybar .action-item a[aria-label^="keel"]').first();
  await keel.waitFor({ timeout: 30_000 });
  await keel.click();
  seen.missionFilePick = await startFromPalette(page);
  seen.runningRow = await waitUntil(page, "the mission row shows running",
    async () => { const r = await missionRow(page); return /running/.test(r) ? r : ""; });
  seen.unitRows = await waitUntil(page, "unit rows under the mission", async () => {
    const missionsPane = page.locator(".pane", { has: page.locator(".pane-header", { hasText: "Missions" }) });
    const rows = await missionsPane.locator(".monaco-list-row").allInnerTexts();
    const units = rows.map((r) => r.replace(/\s+/g, " ").trim()).filter((r) => /^u\d/.test(r));
    return units.length >= config.units ? units : undefined;
  });
  seen.runningStatus = await waitUntil(page, "the status bar shows the running mission",
    async () => { const t = await statusText(page); return t.includes(config.mission) ? t : ""; });
  seen.runningActions = await inlineActions(page, config.mission);
  shots.push(await shot(page, "1-running"));

  await page.locator(".statusbar-item", { hasText: "keel:" }).first().click();
  seen.pausedStatus = await waitUntil(page, "the status bar shows paused",
    async () => { const t = await statusText(page); return /paused/.test(t) ? t : ""; });
  seen.pausedRow = await waitUntil(page, "the mission row shows paused",
    async () => { const r = await missionRow(page); return /paused/.test(r) ? r : ""; });
  seen.pausedActions = await inlineActions(page, config.mission);
  seen.pointActions = await inlineActions(page, "p1");
  shots.push(await shot(page, "2-paused"));

  await page.locator(".statusbar-item", { hasText: "keel:" }).first().click();
  seen.resumedRow = await waitUntil(page, "the mission row leaves paused",
    async () => { const r = await missionRow(page); return r && !/paused/.test(r) ? r : ""; });
  seen.questionStatus = await waitUntil(page, "the status bar asks for input",
    async () => { const t = await statusText(page); return /needs input/.test(t) ? t : ""; }, 45_000);
  seen.questionRow = await waitUntil(page, "the mission row shows waiting for input",
    async () => { const r = await missionRow(page); return /waiting for input/.test(r) ? r : ""; });
  seen.questionActions = await inlineActions(page, config.mission);
  shots.push(await shot(page, "3-waiting-input"));

  await page.locator(".statusbar-item", { hasText: "keel:" }).first().click();
  const input = page.locator(".quick-input-widget input").first();
  await input.waitFor({ state: "visible", timeout: 60_000 });
  seen.inputPrompt = (await page.locator(".quick-input-widget").first().innerText()).replace(/\s+/g, " ").trim();
  await input.fill(config.answer);
  shots.push(await shot(page, "4-answer-input"));
  await input.press("Enter");
  steps.push({ step: "answered", ms: Date.now() - started });
  seen.completedRow = await waitUntil(page, "the mission row shows completed",
    async () => { const r = await missionRow(page); return /completed/.test(r) ? r : ""; }, 45_000);
  seen.finalStatus = await statusText(page);
  shots.push(await shot(page, "5-completed"));
  return { seen, shots };
}

try {
  const result = await main();
  process.stdout.write(JSON.stringify({ ok: true, ...result, steps, console: consoleLines.slice(-60) }) + "\n");
} catch (err) {
  process.stdout.write(JSON.stringify({ ok: false, error: String(err?.stack ?? err), steps,
    console: consoleLines.slice(-120) }) + "\n");
  process.exitCode = 1;
}
