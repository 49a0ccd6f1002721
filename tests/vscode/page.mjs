// Drives the mission page (tests/vscode/test_mission_page.py) in a running code-server: opens each
// mission from the palette (keel: Open Mission) or its row, reads the page inside its webview as a
// person sees it (graph nodes, timeline marks, totals, activity rows, actions), uses its buttons, and
// takes screenshots of the page in the dark and the light theme.
//
// The "told" scene checks that the editor says what just happened: a host lost and resumed, a restore
// (with stale diff tabs closed), a named fork, a failover recorded once, a pause for policy.
//
//   node page.mjs '{"scene": "page" | "told", "url": …, "shots": dir, "missions": {…}, …}'
import {
  config, page, seen, sleep, squash, waitUntil, shot, palette, runPalette, pick, clickRow, closeToasts, openKeel,
  paletteWithPicks, dialog, pressDialog, toast, theme, shots, rows, row, expand, runDriver,
} from "./workbench.mjs";

/** The page's document: the active frame inside the visible webview's iframe. */
function view() {
  return page.frameLocator("iframe.webview.ready >> visible=true").frameLocator("#active-frame");
}

async function closeEditors() {
  await runPalette(">View: Close All Editors", "Close All Editors");
  await waitUntil("no webview", async () => (await page.locator("iframe.webview.ready >> visible=true").count()) === 0);
}

/** Open a mission's page from the palette and wait until it shows the mission in `state`. */
async function openPage(name, state) {
  await palette("Open Mission");
  await pick(name);
  return waitForPage(name, state);
}

async function waitForPage(name, state) {
  const title = page.locator(".tabs-container .tab", { hasText: name }).first();
  await waitUntil(`the page tab of ${name}`, () => title.isVisible(), 30_000);
  await waitUntil(`the page of ${name} ${state}`, async () => {
    const s = await view().locator("body").getAttribute("data-state", { timeout: 1000 }).catch(() => null);
    return s === state;
  }, 60_000);
  await sleep(400);
}

async function text(selector) {
  // SVG elements have no innerText: their text content, with HTML's line breaks as spaces
  return (await view().locator(selector).evaluateAll((els) => els.map((e) => e.innerText ?? e.textContent ?? "")))
    .map(squash);
}

async function attrs(selector, name) {
  return view().locator(selector).evaluateAll((els, n) => els.map((e) => e.getAttribute(n)), name);
}

/** What the page shows now: header, totals, graph nodes, timeline marks, activity rows. */
async function read() {
  return {
    title: squash(await view().locator("h1").innerText()),
    reasons: await text(".reason"),
    question: await text(".question"),
    actions: await text("header > .actions button"),
    totals: await text(".total"),
    nodes: await attrs(".node", "aria-label"),
    edges: await view().locator(".edge").count(),
    marks: await attrs(".mark", "class"),
    markLabels: await attrs(".mark", "aria-label"),
    rows: await text(".activity-list .row"),
    activityHeading: squash(await view().locator(".activity h2").innerText()),
  };
}

async function running() {
  await openPage(config.missions.running, "running");
  seen.running = await waitUntil("the running unit's step on its node", async () => {
    const r = await read();
    return r.nodes.some((n) => /running/.test(n)) && (await text(".unit-running .node-sub")).some((t) => /now:/.test(t))
      ? { ...r, runningSub: await text(".unit-running .node-sub") } : undefined;
  });
  await shot("vscode-page-running");
  await closeEditors();
}

async function asking() {
  await openPage(config.missions.asking, "waiting_input");
  seen.asking = await read();
  await shot("vscode-page-question");
  // a free-text question is answered in a field on the page, never an input box at the top of the window
  const field = view().locator(".question .answer-field");
  seen.answerPrompt = await field.getAttribute("aria-label");
  await field.fill(config.answer);
  await field.press("Enter");
  seen.quickInput = await page.locator(".quick-input-widget").isVisible();
  seen.answered = await waitUntil("the answered mission completes on the page", async () => {
    const s = await view().locator("body").getAttribute("data-state").catch(() => null);
    return s === "completed" ? read() : undefined;
  }, 60_000);
  await closeToasts();
  await closeEditors();
}

async function failover() {
  await openPage(config.missions.failover, "completed");
  seen.failover = await waitUntil("the failover on the timeline", async () => {
    const r = await read();
    return r.marks.some((c) => /mark-switches/.test(c)) && r.totals.some((t) => /served by/.test(t)) ? r : undefined;
  });
  await shot("vscode-page-failover");
  await closeEditors();
}

async function done() {
  // opened with a click on its row, as a person does
  await clickRow("Missions", config.missions.done);
  await waitForPage(config.missions.done, "completed");
  seen.done = await read();
  await shot("vscode-page-completed");
  // a node shows its activity
  await view().locator('.node[data-unit="b"]').click();
  seen.nodeActivity = await waitUntil("the activity of unit b", async () => {
    const r = await read();
    return /Activity of b/.test(r.activityHeading) ? r : undefined;
  });
  // a restore point on the timeline offers diff / restore / fork
  await view().locator(".mark-points").last().click();
  seen.pointDetail = await waitUntil("the point's actions", async () => {
    const t = await text(".mark-detail");
    return t.length && /Restore to/.test(t[0]) ? t[0] : undefined;
  });
  await shot("vscode-page-point");
}

async function pageScene() {
  await openKeel(Object.values(config.missions));
  await running();
  await asking();
  await failover();
  await done();
}

// -- what just happened -------------------------------------------------------------------------------
async function hostLost() {
  const name = config.missions.survive;
  seen.hostLostToast = squash(await (await toast("host lost, resumed from the journal", 90_000)).innerText());
  await shot("vscode-host-lost");
  await closeToasts();
  await openPage(name, "running");
  seen.hostLostPage = await waitUntil("the host mark and the work kept", async () => {
    const r = await read();
    return r.marks.some((c) => /mark-host/.test(c)) && r.totals.some((t) => /kept/.test(t) && /u1/.test(t)) ? r : undefined;
  });
  await shot("vscode-host-lost-page");
  await closeEditors();
}

async function tabs() {
  return (await page.locator(".tabs-container .tab").allInnerTexts()).map(squash);
}

async function rewound() {
  const name = config.missions.rewind;
  await paletteWithPicks("Diff Point with Sandbox", name, "p2", "a.txt");
  seen.diffTabs = await waitUntil("the diff tab", async () => {
    const t = await tabs();
    return t.some((x) => /a\.txt/.test(x)) ? t : undefined;
  });
  await paletteWithPicks("Restore Mission to Point", name, "p2");
  seen.rewindDialog = await dialog();
  await pressDialog("Restore with Files");
  const told = await toast("rewound to p2");
  seen.rewoundToast = squash(await told.innerText());
  seen.tabsAfterRestore = await waitUntil("the stale diff closed", async () => {
    const t = await tabs();
    return t.some((x) => /a\.txt/.test(x)) ? undefined : t;
  });
  await shot("vscode-rewound");
  await (await toast("rewound to p2")).locator(".monaco-button", { hasText: "Resume" }).click();
  seen.resumedRow = await waitUntil("the rewound mission resumed and completed", async () => {
    const r = await row("Missions", name);
    return /completed/.test(r) ? r : "";
  }, 60_000);
  await closeToasts();
}

async function forkNamed() {
  const name = config.missions.rewind;
  const open = async () => {
    // p3 (u2 done): after the restore, "restored to p2" also names p2
    // by its label, first in the row: another point's row may name p3 too, or a longer id start with it
    await paletteWithPicks("Fork Mission from Point", name, /^\s*p3(?![0-9])/);
    const input = page.locator(".quick-input-widget input").first();
    await input.waitFor({ state: "visible", timeout: 60_000 });
    await sleep(300);
    return input;
  };
  for (const kind of ["dark", "light"]) {
    await theme(kind);
    const input = await open();
    seen.forkPrompt ??= { value: await input.inputValue(),
      text: squash(await page.locator(".quick-input-widget").first().innerText()) };
    const file = `${config.shots}/vscode-fork-name-${kind}.png`;
    await page.screenshot({ path: file });
    shots.push(file);
    if (kind === "dark") {
      await page.keyboard.press("Escape");
    } else {
      await input.fill(config.forkName);
      await waitUntil("the name typed", async () => (await input.inputValue()) === config.forkName);
      await sleep(300); // the input box validates the value before it accepts Enter
      await input.press("Enter");
    }
  }
  await theme("dark");
  const told = await toast("forked");
  seen.forkToast = squash(await told.innerText());
  seen.forkRow = await waitUntil("the named fork's row", () => row("Missions", `${config.forkName} (fork of p3)`));
  await shot("vscode-fork-told");
  await told.locator(".monaco-button", { hasText: "Open Mission" }).click();
  await waitForPage(config.forkName, "paused");
  seen.forkPage = await read();
  await closeEditors();
  await closeToasts();
}

async function failoverOnce() {
  const name = config.missions.failover;
  await clickRow("Missions", name);
  await waitForPage(name, "completed");
  seen.failoverPage = await read();
  await expand("Restore Points");
  seen.failoverPoints = await waitUntil("the failover's restore point", async () => {
    const r = await rows("Restore Points");
    return r.some((x) => /failover/.test(x)) ? r : undefined;
  });
  seen.failoverPointIcons = await page.locator(".pane", { hasText: "Restore Points" }).first()
    .locator(".monaco-list-row .custom-view-tree-node-item-icon").evaluateAll((els) => els.map((e) => e.className));
  await shot("vscode-failover-once");
  await closeEditors();
}

async function policyPause() {
  const name = config.missions.strict;
  seen.policyRow = await waitUntil("the policy pause on its row", async () => {
    const r = await row("Missions", name);
    return /paused \(policy: /.test(r) ? r : "";
  }, 60_000);
  await clickRow("Missions", name);
  await waitForPage(name, "paused");
  seen.policyPage = await read();
  // once no toast says it any more, the reason is still on the row and the page
  await waitUntil("no toast about the pause", async () => {
    const texts = (await page.locator(".notification-toast").allInnerTexts()).join(" ");
    return !/requirements|policy/.test(texts);
  }, 90_000);
  seen.policyRowLater = await row("Missions", name);
  seen.policyPageLater = await read();
  await shot("vscode-policy-reason");
  await closeEditors();
}

async function toldScene() {
  await openKeel(Object.values(config.missions));
  await hostLost();
  await rewound();
  await forkNamed();
  await failoverOnce();
  await policyPause();
}

await runDriver({ page: pageScene, told: toldScene });
