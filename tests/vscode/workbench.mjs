// The workbench helpers the VS Code UI drivers share (items.mjs, page.mjs): the driver's config and what
// it records, waiting on a condition, the palette, quick picks, dialogs, toasts, tree panes and
// screenshots in the dark and light theme; `runDriver` opens code-server in headless Chromium, runs the
// scene the config names and prints one JSON object on stdout: {ok, seen, shots, steps, console}.
import { join } from "node:path";
import { chromium } from "playwright-core";

export const config = JSON.parse(process.argv[2]);
const CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
  "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"];
const consoleLines = [];
export const steps = [];
export const shots = [];
export const seen = {};
const started = Date.now();
export let page;

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
export const squash = (text) => text.replace(/\s+/g, " ").trim();

export async function waitUntil(what, probe, timeoutMs = 60_000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value) {
      steps.push({ step: what, ms: Date.now() - started });
      return value;
    }
    if (Date.now() > deadline) {
      const file = join(config.shots, `failed-${config.scene}-${steps.length}.png`);
      await page.screenshot({ path: file });
      throw new Error(`timed out waiting for ${what} (screenshot ${file})`);
    }
    await sleep(150);
  }
}

/** Switch the color theme as a person does, with Preferences: Toggle between Light/Dark Themes (no
 * Escape: that would hide the notification toasts being shot). */
export async function theme(kind) {
  const cls = kind === "light" ? "vs" : "vs-dark";
  if (await page.locator(`.monaco-workbench.${cls}`).count()) {
    return;
  }
  await runPalette(">Toggle between Light/Dark", "Light/Dark");
  await waitUntil(`the ${kind} theme`, () => page.locator(`.monaco-workbench.${cls}`).count(), 60_000);
  await sleep(500);
}

export async function runPalette(text, rowText) {
  // on a loaded machine an editor or a notification landing late can close the palette under the driver:
  // then it is opened again (a palette still open that never lists the command is a failure)
  for (let attempt = 1; ; attempt++) {
    await page.keyboard.press("F1");
    const input = page.locator(".quick-input-widget input").first();
    try {
      await input.waitFor({ state: "visible", timeout: 60_000 });
      await input.fill(text, { timeout: 10_000 });
      await page.locator(".quick-input-list .monaco-list-row", { hasText: rowText }).first().waitFor({ timeout: 60_000 });
      await sleep(150);
      await input.press("Enter", { timeout: 10_000 });
      return;
    } catch (error) {
      if (attempt >= 3 || (await input.isVisible())) {
        throw error;
      }
    }
  }
}

/** A screenshot in both themes (`visual`) or the current one, named after the item. */
export async function shot(name, visual = true) {
  for (const kind of visual ? ["dark", "light"] : ["dark"]) {
    if (visual) {
      await theme(kind);
    }
    const file = join(config.shots, `${name}${visual ? `-${kind}` : ""}.png`);
    await page.screenshot({ path: file });
    shots.push(file);
  }
  if (visual) {
    await theme("dark");
  }
}

/** A modal dialog blocks the palette (and so the theme switch): open it once per theme, shoot, cancel.
 * Returns what the dialog said (the first time). */
export async function shotDialog(name, open, { fromRow = false } = {}) {
  let said;
  for (const kind of ["dark", "light"]) {
    await theme(kind);
    await (fromRow ? openFromRow(open) : open());
    said ??= await dialog();
    const file = join(config.shots, `${name}-${kind}.png`);
    await page.screenshot({ path: file });
    shots.push(file);
    await pressDialog("Cancel");
  }
  await theme("dark");
  return said;
}

export async function palette(title) {
  await runPalette(`>keel: ${title}`, title);
}

/** The visible quick pick: its title and rows. */
export async function quickPick() {
  const widget = page.locator(".quick-input-widget").first();
  await widget.waitFor({ state: "visible", timeout: 60_000 });
  await sleep(300);
  const title = squash(await widget.locator(".quick-input-title").first().innerText().catch(() => ""));
  const rows = (await widget.locator(".quick-input-list .monaco-list-row").allInnerTexts()).map(squash);
  return { title, rows };
}

export async function pick(text, timeout = 60_000) {
  const row = page.locator(".quick-input-widget .quick-input-list .monaco-list-row", { hasText: text }).first();
  await row.waitFor({ timeout });
  await row.click();
}

/** A keel command from the palette whose quick picks are answered in turn; returns what each showed. */
export async function paletteWithPicks(title, ...choices) {
  await palette(title);
  const shown = [];
  seen.picking = { title, shown }; // what each pick showed so far, for a scene that fails at one
  for (const choice of choices) {
    shown.push(await quickPick());
    await pick(choice);
  }
  delete seen.picking;
  return shown;
}

/** Open a modal dialog with `open`, a click on a tree row's inline button. A row that re-renders under
 * the pointer (its age label ticks) can lose the row it stood for: VS Code then runs the command with no
 * target and keel asks which mission instead; that picker is closed and the click made again. */
async function openFromRow(open) {
  const box = page.locator(".monaco-dialog-box").first();
  const picker = page.locator(".quick-input-widget").first();
  for (let attempt = 1; ; attempt++) {
    await open();
    const shown = await waitUntil("a dialog (or a picker instead)", async () =>
      (await box.isVisible()) ? "dialog" : (await picker.isVisible()) ? "picker" : "");
    if (shown === "dialog" || attempt === 3) {
      return;
    }
    await page.keyboard.press("Escape");
    await picker.waitFor({ state: "hidden", timeout: 60_000 });
  }
}

export async function dialog() {
  const box = page.locator(".monaco-dialog-box").first();
  await box.waitFor({ state: "visible", timeout: 60_000 });
  await sleep(300);
  const buttons = (await box.locator(".monaco-button").allInnerTexts()).map(squash).filter((b) => b !== "");
  // the default button is the one the dialog focuses (Enter presses it)
  const primary = squash(await page.evaluate(() => document.activeElement?.textContent ?? ""));
  return { text: squash(await box.innerText()), buttons, primary };
}

export async function pressDialog(label) {
  await page.locator(".monaco-dialog-box .monaco-button", { hasText: label }).first().click();
  await page.locator(".monaco-dialog-box").first().waitFor({ state: "hidden", timeout: 60_000 });
}

export async function toast(text, timeoutMs = 60_000) {
  const item = page.locator(".notification-toast", { hasText: text }).first();
  await waitUntil(`a toast saying ${text}`, () => item.isVisible(), timeoutMs);
  return item;
}

export async function toastTexts() {
  return (await page.locator(".notification-toast").allInnerTexts()).map(squash);
}

export function pane(name) {
  return page.locator(".pane", { has: page.locator(".pane-header", { hasText: name }) }).first();
}

export async function rows(name) {
  return (await pane(name).locator(".monaco-list-row").allInnerTexts()).map(squash);
}

export async function row(paneName, text) {
  const r = await rows(paneName);
  return r.find((t) => t.includes(text)) ?? "";
}

export async function expand(name) {
  const header = pane(name).locator(".pane-header").first();
  if ((await header.getAttribute("aria-expanded")) !== "true") {
    await header.click();
  }
}

export async function clickRow(paneName, text) {
  await pane(paneName).locator(".monaco-list-row", { hasText: text }).first().click();
}

export async function inline(paneName, text) {
  const r = pane(paneName).locator(".monaco-list-row", { hasText: text }).first();
  await r.hover();
  await sleep(200);
  return r.locator(".actions .action-label");
}

export async function ariaLabels(paneName) {
  return pane(paneName).locator(".monaco-list-row").evaluateAll((els) => els.map((e) => e.getAttribute("aria-label")));
}

export async function statusItem() {
  const item = page.locator(".statusbar-item", { hasText: "keel:" }).first();
  if ((await item.count()) === 0) {
    return { text: "", aria: "" };
  }
  const aria = await item.locator("a").first().getAttribute("aria-label").catch(() => "");
  return { text: squash(await item.innerText()), aria: aria ?? "" };
}

export async function closeToasts() {
  await page.keyboard.press("Escape");
  for (const close of await page.locator(".notification-toast .codicon-notifications-clear").all()) {
    await close.click().catch(() => undefined);
  }
}

/** Open the keel container in the activity bar; wait until the Missions pane lists `missions` (names). */
export async function openKeel(missions = []) {
  const keel = page.locator('.activitybar .action-item a[aria-label^="keel"]').first();
  await keel.waitFor({ timeout: 30_000 });
  await keel.click();
  await waitUntil("the Missions pane", () => pane("Missions").count());
  await waitUntil("the missions listed", async () => {
    const text = await pane("Missions").innerText();
    return missions.every((name) => text.includes(name));
  }, 60_000);
}

export async function runDriver(scenes) {
  const browser = await chromium.launch({ executablePath: config.chromium ?? "/usr/bin/chromium", headless: true,
    args: CHROMIUM_ARGS });
  try {
    page = await browser.newPage({ viewport: config.viewport ?? { width: 1400, height: 900 } });
    page.on("console", (msg) => consoleLines.push(`${msg.type()}: ${msg.text()}`.slice(0, 2000)));
    page.on("pageerror", (err) => consoleLines.push(`pageerror: ${err.message}`));
    await page.goto(config.url, { waitUntil: "domcontentloaded", timeout: 90_000 });
    await page.locator(".monaco-workbench").waitFor({ timeout: 60_000 });
    const scene = scenes[config.scene];
    if (scene === undefined) {
      throw new Error(`no scene ${config.scene}`);
    }
    await scene();
    process.stdout.write(JSON.stringify({ ok: true, seen, shots, steps, console: consoleLines.slice(-40) }) + "\n");
  } catch (err) {
    process.stdout.write(JSON.stringify({ ok: false, error: String(err?.stack ?? err), seen, shots, steps,
      console: consoleLines.slice(-80) }) + "\n");
    process.exitCode = 1;
  } finally {
    await browser.close();
  }
}
