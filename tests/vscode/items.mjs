// Drives a running code-server through the items of the VS Code review (tests/vscode/test_ui_items.py):
// each scene acts as a person would (palette, tree rows, inline actions, dialogs, toasts), records what
// it saw in `seen`, and takes screenshots named after the item, in the dark and the light theme.
//
//   node items.mjs '{"scene": "main" | "firstRun", "url": …, "shots": dir, "userSettings": file, …}'
//
// Prints one JSON object on stdout: {ok, seen, shots, steps, console}.
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import {
  config, shots, seen, page, sleep, squash, waitUntil, theme, shot, shotDialog, palette, quickPick, pick,
  paletteWithPicks, dialog, pressDialog, toast, toastTexts, pane, rows, row, expand, clickRow, inline, ariaLabels,
  statusItem, closeToasts, openKeel, runDriver,
} from "./workbench.mjs";

// -- the main scene -----------------------------------------------------------------------------------
async function layoutAndLabels() {
  const size = async (name) => (await pane(name).boundingBox())?.height ?? 0;
  seen.layout = { missions: await size("Missions"), points: await size("Restore Points"),
    subagents: await size("Subagents"), providers: await size("Providers") };
  // The title bar's toolbar re-renders as context keys settle; read it once its icons are drawn.
  const titleActions = () => page.locator(".pane-header", { hasText: "Missions" }).first()
    .locator(".action-label").evaluateAll((els) => els.map((e) => [e.getAttribute("aria-label"), e.className]));
  seen.titleActions = await waitUntil("the Missions title actions with their icons", async () => {
    const actions = await titleActions();
    return actions.length > 0 && actions.every(([, cls]) => /codicon-/.test(cls)) ? actions : undefined;
  }, 10_000).catch(() => titleActions());
  await shot("vscode-layout");
}

async function liveUnits() {
  const name = config.running;
  seen.liveMission = await waitUntil("the running mission names its current unit",
    async () => { const r = await row("Missions", name); return /running/.test(r) && / u2 /.test(` ${r} `) ? r : ""; });
  seen.liveUnits = await waitUntil("live unit states", async () => {
    const r = await rows("Missions");
    const u1 = r.find((t) => t.startsWith("u1 Write")), u2 = r.find((t) => t.startsWith("u2 Review"));
    return u1 && /succeeded/.test(u1) && u2 && /running/.test(u2) ? [u1, u2] : undefined;
  });
  seen.liveStatus = await statusItem();
  await shot("vscode-live-units");
}

async function pauseAndJargon() {
  const actions = await inline("Missions", config.running);
  await actions.first().click(); // Pause Mission
  seen.pausedRow = await waitUntil("the mission paused",
    async () => { const r = await row("Missions", config.running); return /paused/.test(r) ? r : ""; }, 45_000);
  seen.pausedUnits = await waitUntil("units read paused", async () => {
    const r = await rows("Missions");
    const u2 = r.find((t) => t.startsWith("u2 Review"));
    return u2 && /paused/.test(u2) ? r.filter((t) => /^u\d/.test(t)) : undefined;
  });
  await expand("Subagents");
  seen.pausedSubagents = await waitUntil("subagents after the pause", async () => {
    const r = await rows("Subagents");
    return r.some((t) => t.startsWith("u2")) && !r.some((t) => /orphaned/.test(t)) && r.some((t) => /paused/.test(t))
      ? r : undefined;
  });
  seen.pausedAria = await ariaLabels("Missions");
  seen.pausedStatus = await statusItem();
  await shot("vscode-jargon-paused");
}

async function applyConfirm() {
  seen.applyDialog = await shotDialog("vscode-apply-confirm", async () => {
    [seen.applyPick] = await paletteWithPicks("Apply Mission Result", config.running);
  });
}

async function paletteDiff() {
  [seen.diffMissionPick, seen.diffPointPick, seen.diffFilePick] =
    await paletteWithPicks("Diff Point with Sandbox", config.running, "p1", "docs.txt");
  seen.diffTab = await waitUntil("the diff editor", async () => {
    const tab = page.locator(".tabs-container .tab.active").first();
    return (await tab.count()) ? squash(await tab.innerText()) : "";
  });
  await shot("vscode-palette-diff", false);
  await page.keyboard.press("Control+W");
}

async function restoreDialogs() {
  await clickRow("Missions", config.running);
  await waitUntil("restore points", async () => (await rows("Restore Points")).some((r) => r.startsWith("p2")));
  seen.pointRows = await rows("Restore Points");
  seen.pointIcons = await pane("Restore Points").locator(".monaco-list-row .custom-view-tree-node-item-icon")
    .evaluateAll((els) => els.map((e) => e.className));
  const buttons = await inline("Restore Points", "p2");
  seen.pointInline = await buttons.evaluateAll((els) => els.map((e) => [e.getAttribute("aria-label"), e.className]));
  await shot("vscode-restore-icons");
  seen.restoreFilesDialog = await shotDialog("vscode-restore-files-asks",
    async () => (await inline("Restore Points", "p2")).nth(2).click(), { fromRow: true }); // Restore with Files…
  seen.restoreDialog = await shotDialog("vscode-restore-modal",
    async () => (await inline("Restore Points", "p2")).nth(0).click(), { fromRow: true }); // Restore Mission to Point…
  const before = await row("Restore Points", "p1");
  seen.pointAges = [before, await waitUntil("the point ages move on", async () => {
    const now = await row("Restore Points", "p1");
    return now !== before ? now : "";
  }, 40_000)];
}

async function paletteFork() {
  [seen.forkMissionPick, seen.forkPointPick] = await paletteWithPicks("Fork Mission from Point", config.running, "p2");
  const name = page.locator(".quick-input-widget input").first(); // the fork's name, defaulted: keep it
  await name.waitFor({ state: "visible", timeout: 60_000 });
  await sleep(300);
  await name.press("Enter");
  const label = `${config.running} (fork of p2)`;
  seen.forkRow = await waitUntil("the fork's row", () => row("Missions", label));
  seen.forkSelected = await waitUntil("the fork selected", async () => {
    const sel = pane("Missions").locator(".monaco-list-row.selected", { hasText: "fork of p2" }).first();
    return (await sel.count()) ? squash(await sel.innerText()) : "";
  });
  seen.forkToast = squash(await (await toast("forked")).innerText());
  seen.pointsDescription = await waitUntil("the fork's restore points", async () => {
    const text = squash(await pane("Restore Points").locator(".pane-header").innerText());
    return /fork of p2/.test(text) ? text : "";
  });
  await shot("vscode-fork-named");
  await closeToasts();
}

async function cancelAndDelete() {
  await palette("Cancel Mission");
  await pick("fork of p2");
  seen.cancelDialog = await dialog();
  await shot("vscode-cancel-confirm", false);
  await pressDialog("Cancel Mission");
  seen.cancelledRow = await waitUntil("the fork cancelled",
    async () => { const r = await row("Missions", "fork of p2"); return /cancelled/.test(r) ? r : ""; });
  await palette("Delete Mission");
  seen.deletePick = await quickPick();
  await pick("fork of p2");
  seen.deleteDialog = await dialog();
  await shot("vscode-delete-confirm", false);
  await pressDialog("Delete");
  seen.afterDelete = await waitUntil("the fork gone",
    async () => { const r = await rows("Missions"); return r.some((t) => t.includes("fork of p2")) ? undefined : r; });
}

async function question() {
  const item = await toast(config.question);
  seen.questionToast = squash(await item.innerText());
  await shot("vscode-question-toast");
  // dark: from the toast's Answer button (then cancelled); light: from the status bar, and answered
  // toasts hide after a while: the status bar item answers as well
  seen.answeredFrom = await item.locator(".monaco-button", { hasText: "Answer" }).first().click({ timeout: 3000 })
    .then(() => "toast", async () => {
      await page.locator(".statusbar-item", { hasText: "needs input" }).first().click();
      return "status bar";
    });
  const input = page.locator(".quick-input-widget input").first();
  for (const kind of ["dark", "light"]) {
    if (kind === "light") {
      await theme("light");
      await page.locator(".statusbar-item", { hasText: "needs input" }).first().click();
    }
    // the picker that asks this question, not a closing one: its title is the question
    await page.locator(".quick-input-widget").filter({ hasText: config.question }).first()
      .waitFor({ state: "visible", timeout: 60_000 });
    await input.waitFor({ state: "visible", timeout: 60_000 });
    await input.fill(config.answer);
    seen.questionWhileTyping = squash(await page.locator(".quick-input-widget").first().innerText());
    const file = join(config.shots, `vscode-question-title-${kind}.png`);
    await page.screenshot({ path: file });
    shots.push(file);
    await input.press(kind === "dark" ? "Escape" : "Enter");
    await page.locator(".quick-input-widget").first().waitFor({ state: "hidden", timeout: 60_000 });
  }
  await theme("dark");
  seen.answeredUnit = await waitUntil("the answered unit succeeded", async () => {
    const r = await rows("Missions");
    const u = r.find((t) => t.startsWith("q1 Ask"));
    return u && /succeeded/.test(u) ? u : "";
  }, 60_000);
}

async function completion() {
  const item = await toast(`${config.asking} completed`);
  seen.completionToast = squash(await item.innerText());
  seen.completionStatus = await statusItem();
  await shot("vscode-completion-offer");
  await item.locator(".monaco-button", { hasText: "Review Changes" }).first().click();
  seen.reviewPick = await quickPick();
  await page.keyboard.press("Escape");
  await closeToasts();
}

async function failover() {
  await palette("Start Mission");
  await pick(config.failoverFile);
  const item = await toast("failed over", 90_000);
  seen.failoverToast = squash(await item.innerText());
  seen.failoverStatus = await waitUntil("the status bar's failover sign",
    async () => { const s = await statusItem(); return /b\/b-model/.test(s.text) ? s : undefined; });
  seen.failoverRow = await waitUntil("the served model on the row",
    async () => { const r = await row("Missions", config.failover); return /b\/b-model/.test(r) ? r : ""; });
  await expand("Providers");
  seen.providers = await waitUntil("provider rows", async () => {
    const r = await rows("Providers");
    return r.length >= 4 && r.some((t) => /cooling \d+s/.test(t)) ? r : undefined;
  });
  await shot("vscode-failover");
  const cooling = (r) => Number(/cooling (\d+)s/.exec(r.find((t) => /cooling/.test(t)) ?? "")?.[1] ?? 0);
  const first = cooling(seen.providers);
  await sleep(3_000);
  seen.coolingCountdown = [first, cooling(await rows("Providers"))];
  seen.providerAria = await ariaLabels("Providers");
  seen.usageRow = await waitUntil("tokens and cost on the row",
    async () => { const r = await row("Missions", config.failover); return /tokens/.test(r) && /cost/.test(r) ? r : ""; }, 45_000);
  // the row's tooltip has the whole account (the sidebar cuts the row's description)
  const missionRow = pane("Missions").locator(".monaco-list-row", { hasText: config.failover }).first();
  for (const kind of ["dark", "light"]) {
    await theme(kind);
    await page.mouse.move(700, 400);
    await sleep(300);
    await missionRow.hover();
    await waitUntil("the mission's tooltip", () => page.locator(".monaco-hover", { hasText: "tokens" }).first().isVisible());
    seen.usageTooltip = squash(await page.locator(".monaco-hover", { hasText: "tokens" }).first().innerText());
    const file = join(config.shots, `vscode-tokens-cost-${kind}.png`);
    await page.screenshot({ path: file });
    shots.push(file);
  }
  await theme("dark");
}

async function mainScene() {
  await openKeel();
  await layoutAndLabels();
  await liveUnits();
  await question();
  await completion();
  await pauseAndJargon();
  await applyConfirm();
  await paletteDiff();
  await restoreDialogs();
  await paletteFork();
  await cancelAndDelete();
  await failover();
}

// -- first run ------------------------------------------------------------------------------------------
/** keel is not on PATH but the workspace's .venv has it: the toast offers it as a button, and Start
 * Mission in an empty workspace offers to create the mission file (and .keel/config.toml). */
async function firstRunVenvScene() {
  await openKeel();
  const told = await toast("not installed", 60_000);
  seen.venvToast = squash(await told.innerText());
  seen.venvButtons = (await told.locator(".monaco-button").allInnerTexts()).map(squash);
  await shot("vscode-first-run-venv");
  await told.locator(".monaco-button", { hasText: "Use .venv" }).first().click();
  seen.venvWelcome = await waitUntil("keel running from .venv", async () => {
    const text = squash(await pane("Missions").innerText());
    return /No missions/.test(text) ? text : "";
  }, 60_000);
  await closeToasts();
  await palette("Start Mission");
  seen.startPick = await quickPick();
  await shot("vscode-start-offers-create", false);
  await pick("Create a mission file");
  seen.createdToast = squash(await (await toast("as keel init does")).innerText());
  seen.createdTabs = (await page.locator(".tabs-container .tab").allInnerTexts()).map(squash);
  await shot("vscode-created-mission-and-config");
}

async function firstRunScene() {
  await openKeel();
  seen.notInstalledWelcome = await waitUntil("the not-installed welcome", async () => {
    const text = squash(await pane("Missions").innerText());
    return /not installed/.test(text) ? text : "";
  });
  seen.notInstalledToast = squash(await (await toast("not installed")).innerText());
  await shot("vscode-first-run-not-installed");
  await page.locator(".pane .monaco-button", { hasText: "Choose Interpreter" }).first().click();
  seen.interpreterPick = await quickPick();
  await pick("Open the keel.python setting");
  seen.settingsEditor = await waitUntil("the keel.python setting in the settings editor", async () => {
    const editor = page.locator(".settings-editor").first();
    if ((await editor.count()) === 0) {
      return "";
    }
    const text = squash(await editor.innerText());
    return /Keel: Python|keel\.python/i.test(text) && /Python interpreter that has keel/.test(text) ? text.slice(0, 600) : "";
  });
  seen.settingsTab = squash(await page.locator(".settings-editor .settings-tabs-widget .action-item.checked")
    .first().innerText().catch(() => ""));
  await shot("vscode-first-run-setting", false);
  await page.keyboard.press("Control+W");
  await palette("Choose Python Interpreter");
  await pick("Enter an interpreter path");
  const input = page.locator(".quick-input-widget input").first();
  await input.waitFor({ state: "visible", timeout: 60_000 });
  await input.fill(config.python);
  await input.press("Enter");
  seen.fixedWelcome = await waitUntil("the running welcome", async () => {
    const text = squash(await pane("Missions").innerText());
    return /No missions/.test(text) ? text : "";
  }, 60_000);
  seen.toastsAfterFix = await waitUntil("the not-installed toast gone", async () => {
    const t = await toastTexts();
    return t.some((x) => /not installed/.test(x)) ? undefined : t;
  });
  await shot("vscode-first-run-fixed");
}

/** keel is installed nowhere the extension looks: Install keel (the toast's button) makes keel's own
 * environment from the wheel the VSIX carries, in a terminal, and keel then starts from it. */
async function firstRunInstallScene() {
  await openKeel();
  const told = await toast("not installed", 60_000);
  seen.installButtons = (await told.locator(".monaco-button").allInnerTexts()).map(squash);
  await told.locator(".monaco-button", { hasText: "Install keel" }).first().click();
  seen.installTerminal = await waitUntil("the install terminal", async () => {
    const tabs = (await page.locator(".terminal-tabs-entry, .single-terminal-tab, .tabs-list .monaco-list-row")
      .allInnerTexts()).map(squash);
    return tabs.some((t) => t.includes("keel install")) ? tabs : undefined;
  }, 60_000).catch(() => []);
  seen.installedWelcome = await waitUntil("keel running from its own environment", async () => {
    const text = squash(await pane("Missions").innerText());
    return /No missions/.test(text) ? text : "";
  }, 400_000);
  await shot("vscode-first-run-installed", false);
}

await runDriver({
  main: mainScene, firstRun: firstRunScene, firstRunVenv: firstRunVenvScene, firstRunInstall: firstRunInstallScene,
});
