/**
 * The Activity view's wiring and commands: filters (unit, kinds, failures only) as view title actions,
 * "Why Did It Fail?" on a failed unit of the Missions view (one click to the reason), diffs of recorded
 * file changes in VS Code's diff editor (virtual documents, scheme `keel-activity`, served by
 * `keel/activityFile`), and the starter files behind the welcome content ("Create a Mission File",
 * "Open .keel/config.toml", written by the server with `keel init`'s text).
 */
import * as vscode from "vscode";
import { ActivityFeed, ActivityTreeProvider, type ActivityFilter, type ActivityNode } from "./activityTree";
import { commandRunner } from "./commands";
import type { KeelConnection } from "./connection";
import type { UnitNode } from "./missionsTree";
import type { MissionModel } from "./model";
import { ACTIVITY_KINDS, Requests, type ActivityFile, type ActivityItem } from "./protocol";

export const ACTIVITY_SCHEME = "keel-activity";
const FAILURES_KEY = "keel.activityFailuresOnly";

/** `keel-activity:/<path>?<mission, item, side>`: one side of a file change an activity item recorded. */
export function activitySideUri(mission: string, item: ActivityItem, path: string, side: "before" | "after"): vscode.Uri {
  const query = new URLSearchParams({ mission, item: item.id, side }).toString();
  return vscode.Uri.from({ scheme: ACTIVITY_SCHEME, path: `/${path}`, query });
}

class ActivityFiles implements vscode.TextDocumentContentProvider {
  constructor(private readonly connection: KeelConnection) {}

  async provideTextDocumentContent(uri: vscode.Uri): Promise<string> {
    const q = new URLSearchParams(uri.query);
    const file = await this.connection.request<ActivityFile>(Requests.activityFile,
      { id: q.get("mission"), item: q.get("item"), path: uri.path.slice(1) });
    return q.get("side") === "before" ? file.before : file.after;
  }
}

export interface ActivityApi {
  feed: ActivityFeed;
  tree: ActivityTreeProvider;
  view: vscode.TreeView<ActivityNode>;
}

export function registerActivity(connection: KeelConnection, model: MissionModel, log: vscode.LogOutputChannel,
                                 api: Partial<ActivityApi> = {}): vscode.Disposable[] {
  const feed = new ActivityFeed(connection, model, log);
  const tree = new ActivityTreeProvider(feed);
  const view = vscode.window.createTreeView<ActivityNode>("keel.activity", { treeDataProvider: tree });
  Object.assign(api, { feed, tree, view });
  const describe = (): void => {
    const f = tree.filter;
    const parts = [model.get(feed.mission ?? "")?.name, f.unit, f.kinds.length ? f.kinds.join(",") : undefined,
      f.failuresOnly ? "failures only" : undefined];
    view.description = parts.filter((p) => !!p).join(" · ");
    view.message = feed.mission === undefined ? "Select a mission to follow what its agents do." : undefined;
  };
  const { run } = commandRunner(connection, model, log);
  const setFilter = (change: Partial<ActivityFilter>): void => {
    tree.setFilter({ ...tree.filter, ...change });
    void vscode.commands.executeCommand("setContext", FAILURES_KEY, tree.filter.failuresOnly);
    describe();
  };
  describe();
  return [feed, tree, view, feed.onDidChange(describe),
    vscode.workspace.registerTextDocumentContentProvider(ACTIVITY_SCHEME, new ActivityFiles(connection)),
    ...filterCommands(run, tree, setFilter),
    run("keel.activity.diff", async (item: ActivityItem, path: string) => {
      const mission = feed.mission;
      if (mission === undefined) {
        return undefined;
      }
      await vscode.commands.executeCommand("vscode.diff", activitySideUri(mission, item, path, "before"),
        activitySideUri(mission, item, path, "after"), `${path} (${item.unit ?? ""} step ${item.seq ?? ""}: ${item.tool ?? ""})`);
      return path;
    }),
    run("keel.activity.why", async (node?: UnitNode) => {
      if (node === undefined) {
        return undefined;
      }
      model.select(node.missionId);
      setFilter({ unit: node.unit.id, failuresOnly: true, kinds: [] });
      await vscode.commands.executeCommand("keel.activity.focus");
      await feed.load(node.missionId);
      const failure = tree.visible().find((i) => i.kind === "unit") ?? tree.visible()[0];
      if (failure !== undefined) {
        await view.reveal({ kind: "item", item: failure }, { expand: true, select: true, focus: true });
      }
      return failure;
    }),
    run("keel.createMissionFile", async () => createStarters(connection)),
    run("keel.openConfig", async () => openStarter(connection, "config")),
  ];
}

type Runner = ReturnType<typeof commandRunner>["run"];

/** The view title actions: which unit, which kinds, failures only, everything again. */
function filterCommands(run: Runner, tree: ActivityTreeProvider,
                        setFilter: (change: Partial<ActivityFilter>) => void): vscode.Disposable[] {
  return [
    run("keel.activity.filterUnit", async (unit?: string) => {
      const chosen = unit ?? (await vscode.window.showQuickPick(["All units", ...tree.feed.units],
        { placeHolder: "Show the steps of which unit?" }));
      if (chosen !== undefined) {
        setFilter({ unit: chosen === "All units" ? undefined : chosen });
      }
    }),
    run("keel.activity.filterKind", async (kinds?: string[]) => {
      const picks = kinds ?? (await vscode.window.showQuickPick(
        ACTIVITY_KINDS.map((k) => ({ label: k, picked: tree.filter.kinds.includes(k) })),
        { canPickMany: true, placeHolder: "Show which kinds of step? (none: all)" }))?.map((p) => p.label);
      if (picks !== undefined) {
        setFilter({ kinds: picks });
      }
    }),
    run("keel.activity.failuresOnly", async () => setFilter({ failuresOnly: true })),
    run("keel.activity.allSteps", async () => setFilter({ failuresOnly: false, unit: undefined, kinds: [] })),
  ];
}

/** What `keel init` writes: the starter mission file (opened) and .keel/config.toml, each unless it exists. */
async function createStarters(connection: KeelConnection): Promise<string> {
  const config = await connection.request<{ path: string; created: boolean }>(Requests.starter, { what: "config" });
  const mission = await openStarter(connection, "mission");
  if (config.created) {
    void vscode.window.showInformationMessage(`keel: wrote ${vscode.workspace.asRelativePath(mission)} and ` +
      `${vscode.workspace.asRelativePath(config.path)} (the providers it may use), as keel init does`, "Open Config")
      .then((pick) => pick && vscode.window.showTextDocument(vscode.Uri.file(config.path), { preview: false }));
  }
  return mission;
}

async function openStarter(connection: KeelConnection, what: "mission" | "config"): Promise<string> {
  const made = await connection.request<{ path: string; created: boolean }>(Requests.starter, { what });
  await vscode.window.showTextDocument(vscode.Uri.file(made.path), { preview: false });
  if (!made.created) {
    void vscode.window.showInformationMessage(`keel: ${made.path} already exists; opened it as it is`);
  }
  return made.path;
}
