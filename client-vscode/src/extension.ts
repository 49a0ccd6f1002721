/**
 * Entry point of the keel extension: wires the connection to `keel serve`, the mission model, the two
 * tree views, the status-bar item and the commands; restarts the server when a keel setting or the
 * Python extension's interpreter changes. Returns a small API that the extension-host tests read.
 */
import * as vscode from "vscode";
import { registerActivity, type ActivityApi } from "./activity";
import { registerCommands } from "./commands";
import { KeelConnection } from "./connection";
import { onPythonInterpreterChanged } from "./interpreter";
import { MissionsTreeProvider, type MissionTreeNode } from "./missionsTree";
import { MissionModel } from "./model";
import { RestorePointsProvider } from "./pointsTree";
import { SubagentsProvider } from "./subagentsTree";
import { ProvidersTreeProvider } from "./providersTree";
import { registerRewind } from "./rewind";
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
}

let active: KeelConnection | undefined;

export async function activate(context: vscode.ExtensionContext): Promise<KeelApi> {
  const log = vscode.window.createOutputChannel("keel", { log: true });
  const connection = new KeelConnection(log);
  active = connection;
  const model = new MissionModel(connection, log);
  const missions = new MissionsTreeProvider(model);
  const restorePoints = new RestorePointsProvider(model);
  const statusBar = new KeelStatusBar(model, connection);
  const providers = new ProvidersTreeProvider(connection, log);
  const providersView = vscode.window.createTreeView("keel.providers", { treeDataProvider: providers });
  const missionsView = vscode.window.createTreeView<MissionTreeNode>("keel.missions", {
    treeDataProvider: missions, showCollapseAll: true,
  });
  const pointsView = vscode.window.createTreeView("keel.restorePoints", { treeDataProvider: restorePoints });
  const subagents = new SubagentsProvider(model, connection);
  const subagentsView = vscode.window.createTreeView("keel.subagents", { treeDataProvider: subagents });
  context.subscriptions.push(subagents, subagentsView);
  missionsView.onDidChangeSelection((e) => {
    const node = e.selection[0];
    if (node !== undefined) {
      model.select(node.kind === "mission" ? node.id : node.missionId);
    }
  });
  model.onDidChangeSelection((m) => {
    pointsView.description = m?.name;
    pointsView.message = m === undefined ? "Select a mission to see its restore points." : undefined;
  });
  context.subscriptions.push(log, connection, model, missions, restorePoints, statusBar, missionsView, pointsView,
    ...registerCommands(connection, model, log), providers, providersView, ...registerRewind(connection, model, log));

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
  return { connection, model, missions, restorePoints, subagents, statusBar, providers, activity };
}

/** Stop the server before the extension host goes away (VS Code waits for the returned promise). */
export function deactivate(): Promise<void> | undefined {
  return active?.stop();
}
