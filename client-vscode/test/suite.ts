/**
 * Extension-host tests: loaded by VS Code as `extensionTestsPath` (code-server with the smoke-test
 * driver), they run inside the real extension host against a real `keel serve` on the workspace's store.
 *
 * Each check records what it saw; the result goes to `<workspace>/.vscode-test/result.json` (and the
 * console). tests/vscode/test_extension_host.py prepared the store and asserts on that file; the checks
 * here fail on their own too (ok: false with the error) when the extension misbehaves.
 * Inputs: `<workspace>/.vscode-test/config.json` = {"barePython": path of a Python without keel}.
 */
import * as fs from "node:fs/promises";
import * as path from "node:path";
import * as vscode from "vscode";
import type { KeelApi } from "../src/extension";
import { ConnectionState } from "../src/connection";
import type { MissionTreeNode } from "../src/missionsTree";
import type { ApplyResult, MissionSummary, ProvidersPayload } from "../src/protocol";

interface CheckResult { name: string; ok: boolean; ms: number; error?: string }
const observed: Record<string, unknown> = {};

async function waitFor<T>(what: string, probe: () => T | undefined | Promise<T | undefined>, ms = 20_000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = await probe();
    if (value !== undefined && value !== false) {
      return value;
    }
    if (Date.now() > deadline) {
      throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
}

function check(condition: boolean, message: string): void {
  if (!condition) {
    throw new Error(message);
  }
}

function label(item: vscode.TreeItem): string {
  return typeof item.label === "string" ? item.label : item.label?.label ?? "";
}

function iconId(item: vscode.TreeItem): string {
  return item.iconPath instanceof vscode.ThemeIcon ? item.iconPath.id : "";
}

/** The pid of the `keel serve` child of this extension host (Linux /proc). */
async function serverPid(): Promise<number | undefined> {
  for (const entry of await fs.readdir("/proc")) {
    if (!/^\d+$/.test(entry)) {
      continue;
    }
    try {
      const stat = await fs.readFile(`/proc/${entry}/stat`, "utf8");
      const ppid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
      const cmdline = await fs.readFile(`/proc/${entry}/cmdline`, "utf8");
      if (ppid === process.pid && cmdline.includes("keel.server.cli\0serve")) {
        return Number(entry);
      }
    } catch {
      // the process went away while we looked
    }
  }
  return undefined;
}

async function treeRows(api: KeelApi): Promise<unknown[]> {
  const roots = (await api.missions.getChildren()) ?? [];
  const rows = [];
  for (const node of roots) {
    const item = api.missions.getTreeItem(node);
    const children = ((await api.missions.getChildren(node)) ?? []) as MissionTreeNode[];
    rows.push({
      id: node.kind === "mission" ? node.id : "", label: label(item), description: item.description,
      contextValue: item.contextValue, icon: iconId(item),
      units: children.map((c) => {
        const ci = api.missions.getTreeItem(c);
        return { label: label(ci), description: ci.description, contextValue: ci.contextValue, icon: iconId(ci) };
      }),
    });
  }
  return rows;
}

async function pointRows(api: KeelApi, id: string): Promise<unknown[]> {
  api.model.select(id);
  const nodes = await api.restorePoints.getChildren();
  return nodes.map((n) => {
    const item = api.restorePoints.getTreeItem(n);
    return { label: label(item), description: item.description, contextValue: item.contextValue };
  });
}

async function subagentRows(api: KeelApi, id: string): Promise<unknown[]> {
  api.model.select(id);
  const nodes = await api.subagents.getChildren();
  return nodes.map((n) => {
    const item = api.subagents.getTreeItem(n);
    return { label: label(item), description: item.description, contextValue: item.contextValue };
  });
}

function providerRows(api: KeelApi): unknown[] {
  return api.providers.getChildren().map((n) => {
    const item = api.providers.getTreeItem(n);
    return { label: label(item), description: item.description, contextValue: item.contextValue, icon: iconId(item),
      tooltip: item.tooltip };
  });
}

/** The Providers tree after the server's first answer, then after a provider is added to the workspace's
 * .keel/config.toml (the server notices the file and sends keel/providersChanged). */
async function checkProviders(api: KeelApi, folder: string): Promise<void> {
  await waitFor("the providers", () => api.providers.endpoints.length >= 2);
  observed["providersTree"] = providerRows(api);
  const notified: ProvidersPayload[] = [];
  const sub = api.connection.onDidChangeProviders((p) => notified.push(p));
  try {
    const config = path.join(folder, ".keel", "config.toml");
    await fs.appendFile(config, '\n[[providers]]\nname = "c"\nkind = "openai-compatible"\nmodel = "c-model"\n' +
      'endpoints = [{ url = "http://127.0.0.1:9/v1" }]\n');
    await waitFor("keel/providersChanged with the new provider",
      () => notified.some((p) => p.endpoints.some((e) => e.provider === "c")));
    observed["providersAfterChange"] = { rows: providerRows(api), notifications: notified.length };
  } finally {
    sub.dispose();
  }
}

function checks(api: KeelApi, ext: vscode.Extension<KeelApi>, config: { barePython: string }): [string, () => Promise<void>][] {
  return [
    ["commands are registered", async () => {
      const all = new Set(await vscode.commands.getCommands(true));
      const contributed = (ext.packageJSON.contributes.commands as { command: string }[]).map((c) => c.command);
      observed["commands"] = contributed.filter((c) => all.has(c));
      const missing = contributed.filter((c) => !all.has(c));
      check(missing.length === 0, `not registered: ${missing.join(", ")}`);
    }],
    ["the server starts and the missions load", async () => {
      await waitFor("a running connection", () => api.connection.current === ConnectionState.Running);
      await waitFor("the missions", () => api.model.isLoaded);
      observed["interpreter"] = api.connection.interpreter;
    }],
    ["the Missions tree shows missions and their units", async () => {
      const rows = await treeRows(api);
      observed["missionsTree"] = rows;
      check(rows.length === api.model.list().length, `${rows.length} rows for ${api.model.list().length} missions`);
    }],
    ["the Restore Points tree shows the selected mission's points", async () => {
      const points: Record<string, unknown> = {};
      for (const m of api.model.list()) {
        points[m.id] = await pointRows(api, m.id);
      }
      observed["restorePoints"] = points;
    }],
    ["the Subagents tree shows the selected mission's subagents", async () => {
      const rows: Record<string, unknown> = {};
      for (const m of api.model.list()) {
        rows[m.id] = await subagentRows(api, m.id);
      }
      observed["subagents"] = rows;
    }],
    ["the status bar shows the mission that needs attention", async () => {
      observed["statusBar"] = { text: api.statusBar.text, command: api.statusBar.command?.command,
        arguments: api.statusBar.command?.arguments };
    }],
    ["the Providers tree shows health and follows keel/providersChanged", async () => {
      await checkProviders(api, vscode.workspace.workspaceFolders?.[0]?.uri.fsPath ?? "");
    }],
    ["pause through the command; the tree follows keel/missionChanged", async () => {
      const running = await waitFor("a running mission", () => api.model.list().find((m) => m.state === "running"));
      const notified: MissionSummary[] = [];
      const sub = api.connection.onDidChangeMission((m) => m.id === running.id && notified.push(m));
      try {
        const node = api.missions.nodeFor(running.id);
        const result = await vscode.commands.executeCommand<MissionSummary>("keel.pause", node);
        check(result?.id === running.id, `keel.pause returned ${JSON.stringify(result)}`);
        await waitFor("a keel/missionChanged notification saying paused", () => notified.some((m) => m.state === "paused"));
        const item = api.missions.getTreeItem(node);
        observed["afterPause"] = { notifications: notified.map((m) => m.state), contextValue: item.contextValue,
          description: item.description, statusBar: api.statusBar.text, statusCommand: api.statusBar.command?.command };
        check(item.contextValue === "mission.paused", `tree row says ${item.contextValue}`);
      } finally {
        sub.dispose();
      }
    }],
    ["Verify Store checks the store through the server", async () => {
      const result = await vscode.commands.executeCommand<{ ok: boolean; records: number }>("keel.verifyStore");
      observed["verify"] = result;
      check(result?.ok === true && result.records > 0, `verify answered ${JSON.stringify(result)}`);
    }],
    ["a killed server is started again and the missions reload", async () => {
      const pid = await waitFor("the keel serve process", serverPid);
      let reloads = 0;
      const sub = api.model.onDidChange((m) => { if (m === undefined) { reloads += 1; } });
      try {
        process.kill(pid, "SIGKILL");
        await waitFor("a new keel serve process", async () => { const p = await serverPid(); return p !== pid && p; });
        await waitFor("the missions reloaded", () => reloads > 0 && api.model.isLoaded);
      } finally {
        sub.dispose();
      }
      observed["afterCrash"] = { state: api.connection.current, missions: api.model.list().length };
      check(api.connection.current === ConnectionState.Running, `connection is ${api.connection.current}`);
    }],
    ["a Python without keel gives the not-installed state, and a settings change restarts", async () => {
      const settings = vscode.workspace.getConfiguration("keel");
      const before = settings.get<string>("python");
      await settings.update("python", config.barePython, vscode.ConfigurationTarget.Workspace);
      try {
        await waitFor("the not-installed state", () => api.connection.current === ConnectionState.NotInstalled);
        observed["notInstalled"] = { problem: api.connection.problem, statusBar: api.statusBar.text };
      } finally {
        await settings.update("python", before, vscode.ConfigurationTarget.Workspace);
      }
      await waitFor("the server running again", () => api.connection.current === ConnectionState.Running);
      await waitFor("the missions again", () => api.model.isLoaded);
      observed["missionsAfterRestart"] = api.model.list().map((m) => ({ id: m.id, state: m.state }));
    }],
    ["keel.store and keel.logLevel reach the server; it restarts on each change", async () => {
      const settings = vscode.workspace.getConfiguration("keel");
      const restarted = () => waitFor("the server running with the missions loaded",
        () => api.connection.current === ConnectionState.Running && api.model.isLoaded);
      await settings.update("store", "other/store", vscode.ConfigurationTarget.Workspace);
      await settings.update("logLevel", "debug", vscode.ConfigurationTarget.Workspace);
      try {
        await waitFor("a restart with the new settings", () => api.connection.serverCommand.includes("--verbose"));
        await restarted();
        observed["otherStore"] = { command: api.connection.serverCommand, missions: api.model.list().length };
      } finally {
        await settings.update("store", undefined, vscode.ConfigurationTarget.Workspace);
        await settings.update("logLevel", undefined, vscode.ConfigurationTarget.Workspace);
      }
      await waitFor("a restart without them", () => !api.connection.serverCommand.includes("--store"));
      await restarted();
      observed["backToDefaultStore"] = { command: api.connection.serverCommand, missions: api.model.list().length };
    }],
    ["restore points: Diff opens VS Code's diff of two keel-point documents; Fork and Apply", async () => {
      const gamma = await waitFor("mission gamma", () => api.model.list().find((m) => m.name === "gamma"));
      const first = (await api.model.restorePoints(gamma.id))[0]?.id ?? "p1";
      const menus = ext.packageJSON.contributes.menus["view/item/context"] as { command: string; when: string; group: string }[];
      observed["pointActions"] = menus.filter((m) => m.when.includes("viewItem == restorePoint") && m.group.startsWith("inline"))
        .map((m) => m.command);
      await vscode.commands.executeCommand("keel.diffPoint", gamma.id, first, "g.txt");
      const tab = await waitFor("a diff editor", () => {
        const active = vscode.window.tabGroups.activeTabGroup.activeTab;
        return active?.input instanceof vscode.TabInputTextDiff ? active : undefined;
      });
      const input = tab.input as vscode.TabInputTextDiff;
      const side = async (uri: vscode.Uri) => ({ scheme: uri.scheme, path: uri.path,
        text: (await vscode.workspace.openTextDocument(uri)).getText() });
      observed["diff"] = { label: tab.label, left: await side(input.original), right: await side(input.modified) };
      await vscode.commands.executeCommand("workbench.action.closeActiveEditor");
      const fork = await vscode.commands.executeCommand<MissionSummary>("keel.fork", gamma.id, first, {});
      check(fork?.id !== undefined && fork.id !== gamma.id, `keel.fork returned ${JSON.stringify(fork)}`);
      await waitFor("the fork in the model", () => api.model.get(fork.id));
      const applied = await vscode.commands.executeCommand<ApplyResult>("keel.apply", gamma.id, {});
      observed["fork"] = { id: fork.id, state: fork.state, name: fork.name, selected: api.model.selected?.id };
      observed["apply"] = applied;
      check(applied?.added.includes("g.txt") === true, `keel.apply returned ${JSON.stringify(applied)}`);
    }],
  ];
}

export async function run(): Promise<void> {
  const folder = vscode.workspace.workspaceFolders?.[0];
  if (folder === undefined) {
    throw new Error("the extension-host tests need a workspace folder");
  }
  const out = path.join(folder.uri.fsPath, ".vscode-test");
  const results: CheckResult[] = [];
  try {
    const config = JSON.parse(await fs.readFile(path.join(out, "config.json"), "utf8")) as { barePython: string };
    const ext = vscode.extensions.getExtension<KeelApi>("keel.keel");
    if (ext === undefined) {
      throw new Error("extension keel.keel is not installed in this extension host");
    }
    const api = await ext.activate();
    for (const [name, fn] of checks(api, ext, config)) {
      const started = Date.now();
      try {
        await fn();
        results.push({ name, ok: true, ms: Date.now() - started });
      } catch (err) {
        results.push({ name, ok: false, ms: Date.now() - started, error: err instanceof Error ? err.message : String(err) });
      }
    }
  } catch (err) {
    results.push({ name: "setup", ok: false, ms: 0, error: err instanceof Error ? err.stack ?? err.message : String(err) });
  }
  const report = JSON.stringify({ results, observed }, null, 2);
  console.log(`KEEL-EXTENSION-TESTS ${report}`);
  await fs.writeFile(path.join(out, "result.json"), report);
}
