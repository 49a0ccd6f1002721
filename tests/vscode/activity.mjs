// The person's path through the Activity view and the welcome content, driven by drive.mjs
// (modes "activity" and "welcome"); `h` carries drive.mjs's helpers: config, shot, waitUntil, steps, sleep,
// startFromPalette.

function pane(page, title) {
  return page.locator(".pane", { has: page.locator(".pane-header", { hasText: new RegExp(`^${title}`) }) }).first();
}

async function expandPane(page, title) {
  const header = page.locator(".pane-header", { hasText: new RegExp(`^${title}`) }).first();
  await header.waitFor({ timeout: 30_000 });
  if ((await header.getAttribute("aria-expanded")) !== "true") {
    await header.click();
  }
  return header;
}

async function collapsePane(page, title) {
  const header = page.locator(".pane-header", { hasText: new RegExp(`^${title}`) }).first();
  if ((await header.count()) > 0 && (await header.getAttribute("aria-expanded")) === "true") {
    await header.click();
  }
}

async function rows(page, title) {
  const texts = await pane(page, title).locator(".monaco-list-row").allInnerTexts();
  return texts.map((r) => r.replace(/\s+/g, " ").trim());
}

async function openKeel(page) {
  const keel = page.locator('.activitybar .action-item a[aria-label^="keel"]').first();
  await keel.waitFor({ timeout: 30_000 });
  await keel.click();
}

async function titleAction(page, title, label) {
  const header = await expandPane(page, title);
  await header.hover();
  const action = header.locator(`.actions .action-label[aria-label^="${label}"]`).first();
  await action.waitFor({ timeout: 60_000 });
  await action.click();
}

function tabOpens(page, h, name) {
  return h.waitUntil(page, `${name} opens in an editor`, async () => {
    const tab = page.locator(".tabs-container .tab", { hasText: name }).first();
    return (await tab.count()) > 0 ? (await tab.innerText()).trim() : "";
  });
}

export async function welcome(page, h) {
  const seen = {};
  const shots = [];
  await openKeel(page);
  await collapsePane(page, "Restore Points");
  await collapsePane(page, "Subagents");
  await expandPane(page, "Providers");
  const missions = pane(page, "Missions");
  const start = missions.locator(".welcome-view-content .monaco-button", { hasText: "Start Mission" }).first();
  await start.waitFor({ timeout: 30_000 });
  seen.missionsWelcome = (await missions.locator(".welcome-view-content").innerText()).replace(/\s+/g, " ").trim();
  seen.missionsButtons = await missions.locator(".welcome-view-content .monaco-button").allInnerTexts();
  const providers = pane(page, "Providers");
  await providers.locator(".welcome-view-content .monaco-button").first().waitFor({ timeout: 30_000 });
  seen.providersWelcome = (await providers.locator(".welcome-view-content").innerText()).replace(/\s+/g, " ").trim();
  seen.providersButtons = await providers.locator(".welcome-view-content .monaco-button").allInnerTexts();
  shots.push(await h.shot(page, "welcome-1-empty"));

  await missions.locator(".welcome-view-content .monaco-button", { hasText: "Create a Mission File" }).first().click();
  seen.missionTab = await tabOpens(page, h, "mission.toml");
  seen.missionEditor = await h.waitUntil(page, "the editor shows the template", async () => {
    const text = await page.locator(".editor-instance .view-lines").first().innerText().catch(() => "");
    return text.includes("keel.agents.coder") ? text : "";
  });
  shots.push(await h.shot(page, "welcome-2-mission-file"));

  // Create a Mission File writes .keel/config.toml too (as keel init does) and says so, with Open Config
  const told = page.locator(".notification-toast", { hasText: "as keel init does" }).first();
  seen.createdToast = (await h.waitUntil(page, "the toast naming both files", async () =>
    (await told.isVisible()) ? told.innerText() : "")).replace(/\s+/g, " ").trim();
  await told.locator(".monaco-button", { hasText: "Open Config" }).click();
  seen.configTab = await tabOpens(page, h, "config.toml");
  seen.providerRows = await h.waitUntil(page, "the Providers view lists the starter's endpoint", async () => {
    const found = await rows(page, "Providers");
    return found.some((r) => r.includes("local")) ? found : undefined;
  });
  shots.push(await h.shot(page, "welcome-3-config"));
  return { seen, shots };
}

export async function activity(page, h) {
  const { config } = h;
  const seen = {};
  const shots = [];
  await openKeel(page);
  await collapsePane(page, "Restore Points");
  await collapsePane(page, "Subagents");
  await collapsePane(page, "Providers");
  await expandPane(page, "Activity");
  await h.startFromPalette(page);

  // live: a step shows up while the mission is still running
  seen.live = await h.waitUntil(page, "a write_file row while the mission runs", async () => {
    const missionRows = await rows(page, "Missions");
    const running = missionRows.some((r) => r.includes(config.mission) && /running/.test(r));
    const steps = await rows(page, "Activity");
    return running && steps.some((r) => r.includes("write_file a.py")) ? { missionRows, steps } : undefined;
  }, 45_000);
  shots.push(await h.shot(page, "activity-1-live"));

  seen.failedRow = await h.waitUntil(page, "the mission failed (unit bad)", async () => {
    const missionRows = await rows(page, "Missions");
    return missionRows.some((r) => r.includes(config.mission) && /failed/.test(r)) ? missionRows : undefined;
  }, 60_000);
  // the Activity view opens below a Missions view that keeps its room: give it the sidebar while reading steps
  await collapsePane(page, "Missions");
  seen.finished = await h.waitUntil(page, "the failure in the activity", async () => {
    const steps = await rows(page, "Activity");
    return steps.some((r) => r.includes("running -> failed")) ? steps : undefined;
  }, 60_000);

  const patch = pane(page, "Activity").locator(".monaco-list-row", { hasText: "apply_diff" }).first();
  await patch.click();
  const fileRow = pane(page, "Activity").locator(".monaco-list-row", { hasText: "a.py" }).filter({ hasText: "modified" }).first();
  await fileRow.waitFor({ timeout: 60_000 });
  seen.patchDetails = await rows(page, "Activity");
  await fileRow.click();
  seen.diffTab = await h.waitUntil(page, "the diff editor opens", async () => {
    const tab = page.locator(".tabs-container .tab", { hasText: "a.py" }).first();
    const diff = page.locator(".monaco-diff-editor").first();
    return (await tab.count()) > 0 && (await diff.count()) > 0 ? (await tab.innerText()).trim() : "";
  });
  seen.diffText = await h.waitUntil(page, "both sides in the diff editor", async () => {
    const sides = (await page.locator(".monaco-diff-editor .view-lines").allInnerTexts())
      .map((s) => s.replace(/\u00a0/g, " "));
    return sides.length >= 2 && sides.some((s) => s.includes("y = 2")) ? sides : undefined;
  });
  await h.sleep(500);
  shots.push(await h.shot(page, "activity-2-diff"));

  await titleAction(page, "Activity", "Show Failures Only");
  seen.failures = await h.waitUntil(page, "only failed steps", async () => {
    const steps = await rows(page, "Activity");
    return steps.length > 0 && !steps.some((r) => r.includes("write_file")) ? steps : undefined;
  });
  shots.push(await h.shot(page, "activity-3-failures"));
  await titleAction(page, "Activity", "Show All Steps");

  await expandPane(page, "Missions");
  const bad = pane(page, "Missions").locator(".monaco-list-row", { hasText: /^bad/ }).first();
  await bad.hover();
  await h.sleep(200);
  seen.badActions = await bad.locator(".actions .action-label").evaluateAll((els) => els.map((e) => e.getAttribute("aria-label")));
  await bad.locator('.actions .action-label[aria-label^="Why Did It Fail"]').first().click();
  seen.why = await h.waitUntil(page, "the reason under the failed unit", async () => {
    const steps = await rows(page, "Activity");
    return steps.some((r) => r.startsWith("why") && r.includes("exit code 3")) ? steps : undefined;
  });
  shots.push(await h.shot(page, "activity-4-why"));
  return { seen, shots };
}
