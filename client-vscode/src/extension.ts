/**
 * Entry point of the keel extension: wires the connection to `keel serve`, the mission model, the four
 * tree views, the status-bar item, the notifications and the commands; restarts the server when a keel setting or the
 * Python extension's interpreter changes. Returns a small API that the extension-host tests read.
 */
import * as vscode from "vscode";
import { registerActivity, type ActivityApi } from "./activity";
import { registerCommands } from "./commands";
import { KeelConnection } from "./connection";
import { keelHome, onPythonInterpreterChanged } from "./interpreter";
import { MissionsTreeProvider, OPEN_SELECTED, type MissionTreeNode } from "./missionsTree";
import { MissionModel } from "./model";
import { missionLabel } from "./protocol";
import { RestorePointsProvider } from "./pointsTree";
import { SubagentsProvider } from "./subagentsTree";
import { ProvidersTreeProvider } from "./providersTree";
import { registerRewind } from "./rewind";
import { Notifier } from "./notify";
import { registerMissionPage } from "./missionPage";
import { registerSetup } from "./setup";
import { KeelStatusBar } from "./statusBar";

export interface KeelApi {
  connection: KeelConnection;
  model: MissionModel;
  missions: MissionsTreeProvider;
  restorePoints: RestorePointsProvider;
  subagents: SubagentsProvider;
  statusBar: KeelStatusBar;
  providers: ProvidersTreeProvider;
  activity: Partial<ActivityApi>;
  notifier: Notifier;
  missionsView: vscode.TreeView<MissionTreeNode>;
}

let active: KeelConnection | undefined;

export async function activate(context: vscode.ExtensionContext): Promise<KeelApi> {
  const log = vscode.window.createOutputChannel("keel", { log: true });
  const home = keelHome(context);
  const connection = new KeelConnection(log, home);
  active = connection;
  const model = new MissionModel(connection, log);
  const missions = new MissionsTreeProvider(model);
  const restorePoints = new RestorePointsProvider(model);
  const notifier = new Notifier(model, connection);
  const statusBar = new KeelStatusBar(model, connection, () => notifier.finished[notifier.finished.length - 1]);
  const providers = new ProvidersTreeProvider(connection, log);
  const providersView = vscode.window.createTreeView("keel.providers", { treeDataProvider: providers });
  const missionsView = vscode.window.createTreeView<MissionTreeNode>("keel.missions", {
    treeDataProvider: missions, showCollapseAll: true,
  });
  const pointsView = vscode.window.createTreeView("keel.restorePoints", { treeDataProvider: restorePoints });
  const subagents = new SubagentsProvider(model, connection);
  const subagentsView = vscode.window.createTreeView("keel.subagents", { treeDataProvider: subagents });
  context.subscriptions.push(subagents, subagentsView);
  // a refresh re-announces the tree's selection: only a new one moves the model's (a fork selected by
  // the command must not be taken back by the refresh that shows it)
  let treeSelection: string | undefined;
  missionsView.onDidChangeSelection((e) => {
    const node = e.selection[0];
    const id = node === undefined ? undefined : node.kind === "mission" ? node.id : node.missionId;
    if (id !== undefined && id !== treeSelection) {
      treeSelection = id;
      model.select(id);
    }
  });
  // a click on a mission row selects it, then runs this command (extension host events come in order)
  context.subscriptions.push(vscode.commands.registerCommand(OPEN_SELECTED, async () => {
    const node = missionsView.selection[0];
    const id = node === undefined ? model.selected?.id : node.kind === "mission" ? node.id : node.missionId;
    return id === undefined ? undefined : vscode.commands.executeCommand("keel.openMission", id);
  }));
  model.onDidChangeSelection((m) => {
    // a mission selected by a command (a fork, a start) is selected in the tree too
    if (m !== undefined && missionsView.visible && !missionsView.selection.some((n) => n.kind === "mission" && n.id === m.id)) {
      revealSoon(missionsView, missions, m.id);
    }
    pointsView.description = m === undefined ? undefined : missionLabel(m);
    pointsView.message = m === undefined ? "Select a mission to see its restore points." : undefined;
  });
  context.subscriptions.push(log, connection, model, missions, restorePoints, statusBar, missionsView, pointsView,
    ...registerCommands(connection, model, log), providers, providersView, ...registerRewind(connection, model, log),
    notifier, ...registerSetup(connection, log, home), ...registerMissionPage(context, connection, model, log));

  context.subscriptions.push(vscode.workspace.onDidChangeConfiguration((e) => {
    if (e.affectsConfiguration("keel")) {
      log.info("keel settings changed: restarting the server");
      void connection.restart();
    }
  }));
  const pythonWatch = await onPythonInterpreterChanged(() => {
    if (vscode.workspace.getConfiguration("keel").get<string>("python", "") === "") {
      log.info("the Python extension's interpreter changed: restarting the server");
      void connection.restart();
    }
  });
  if (pythonWatch !== undefined) {
    context.subscriptions.push(pythonWatch);
  }
  const activity: Partial<ActivityApi> = {};
  context.subscriptions.push(...registerActivity(connection, model, log, activity));
  void connection.start();
  return { connection, model, missions, restorePoints, subagents, statusBar, providers, notifier, missionsView, activity };
}

/** Select a mission's row; a row that is not drawn yet (a fork the tree is still fetching) is tried again. */
function revealSoon(view: vscode.TreeView<MissionTreeNode>, tree: MissionsTreeProvider, id: string, tries = 10): void {
  Promise.resolve(view.reveal(tree.nodeFor(id), { select: true, focus: false })).catch(() => {
    if (tries > 1) {
      setTimeout(() => revealSoon(view, tree, id, tries - 1), 300);
    }
  });
}

/** Stop the server before the extension host goes away (VS Code waits for the returned promise). */
export function deactivate(): Promise<void> | undefined {
  return active?.stop();
}
