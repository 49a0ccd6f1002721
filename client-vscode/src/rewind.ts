/**
 * Rewinding and moving missions: Fork, Restore with Files and Diff on restore points, Apply, Export and
 * Import. Diff opens VS Code's diff view on two virtual documents (scheme `keel-point`) whose text the
 * server serves with `keel/pointFile`; a point's changed files come from `keel/pointChanges`.
 * Must not draw views.
 */
import * as vscode from "vscode";
import { commandRunner, confirmRestore, missionId, pickMission, pickPoint } from "./commands";
import type { KeelConnection } from "./connection";
import type { MissionModel } from "./model";
import type { PointNode } from "./pointsTree";
import { POINT_SCHEME, sayForked, sayRewound } from "./rewound";
import {
  Requests,
  SANDBOX,
  ServerCommands,
  type ApplyResult,
  type FileChange,
  type MissionSummary,
  type PointFile,
  missionLabel,
  progressText,
} from "./protocol";


/** `keel-point:/<mission>/<point>/<path>`: one file of a point's snapshot (or of the sandbox). */
export function pointUri(missionId: string, point: string, path: string): vscode.Uri {
  return vscode.Uri.from({ scheme: POINT_SCHEME, path: `/${missionId}/${point}/${path}` });
}

class PointFiles implements vscode.TextDocumentContentProvider {
  constructor(private readonly connection: KeelConnection) {}

  async provideTextDocumentContent(uri: vscode.Uri): Promise<string> {
    const [, id, point, ...rest] = uri.path.split("/");
    const file = await this.connection.request<PointFile>(Requests.pointFile, { id, point, path: rest.join("/") });
    return file.binary ? `(binary file ${file.path})` : file.text;
  }
}

type PointTarget = PointNode | string | undefined;

export function registerRewind(connection: KeelConnection, model: MissionModel,
                               log: vscode.LogOutputChannel): vscode.Disposable[] {
  const { run, missionCommand } = commandRunner(connection, model, log);
  return [
    vscode.workspace.registerTextDocumentContentProvider(POINT_SCHEME, new PointFiles(connection)),
    run(ServerCommands.fork, async (target?: PointTarget, point?: string, options?: { name?: string }) => {
      const [id, p] = await pointOf(model, target, point, "Fork which mission?", "Fork from which point?");
      if (id === undefined || p === undefined) {
        return undefined;
      }
      const original = model.get(id);
      // a caller passing options has decided already (other extensions, the tests): its name or the original's
      const name = options !== undefined ? options.name ?? "" : await vscode.window.showInputBox({
        title: `Fork ${original ? missionLabel(original) : id} at ${p}`,
        prompt: "Name of the new mission (it starts paused, with the point's files in its own sandbox)",
        value: original?.name ?? "",
        validateInput: (v) => (v.trim() === "" ? "A mission needs a name" : undefined),
      });
      if (name === undefined) {
        return undefined;
      }
      const summary = await missionCommand(ServerCommands.fork, [id, p, { name: name.trim() }]);
      model.select(summary.id);
      void sayForked(original ? missionLabel(original) : id, p, summary);
      return summary;
    }),
    run("keel.restoreWithFiles", async (target?: PointTarget, point?: string) => {
      const [id, p] = await pointOf(model, target, point, "Restore which mission?", "Restore to which point?");
      if (id === undefined || p === undefined) {
        return undefined;
      }
      if (typeof target !== "string" && await confirmRestore(model, id, p, "files") === undefined) {
        return undefined;
      }
      const summary = await missionCommand(ServerCommands.restore, [id, p, { files: true }]);
      void sayRewound(summary, p, true);
      return summary;
    }),
    run("keel.diffPoint", async (target?: PointTarget, point?: string, file?: string) => {
      const [id, p] = await pointOf(model, target, point, "Diff which mission?", "Diff which point with the sandbox?");
      return id && p ? diffWithSandbox(connection, id, p, file) : undefined;
    }),
    run("keel.reviewChanges", async (target?: string | { id: string }) => {
      const id = typeof target === "string" ? target : target?.id
        ?? await missionId(model, undefined, () => true, "Review the changes of which mission?");
      const first = id === undefined ? undefined : (await model.restorePoints(id))[0]?.id;
      return id && first ? diffWithSandbox(connection, id, first, undefined) : undefined;
    }),
    run(ServerCommands.apply, async (target?: string | { id: string }, options?: { branch?: string }) => {
      const given = typeof target === "string" ? target : target?.id;
      const id = given ?? await pickMission(model.list(), "Apply the result of which mission to the working tree?");
      if (id === undefined) {
        return undefined;
      }
      // a caller passing (id, options) has decided already (other extensions, the tests)
      if (options === undefined && !await confirmApply(connection, model, id)) {
        return undefined;
      }
      const result = await connection.executeCommand<ApplyResult>(ServerCommands.apply, [id, options ?? {}]);
      const count = result.added.length + result.modified.length + result.removed.length;
      const name = model.get(id) ? missionLabel(model.get(id) as MissionSummary) : id;
      void vscode.window.showInformationMessage(result.branch ? `keel: mission ${name} committed on ${result.branch}`
        : `keel: applied mission ${name}: ${count} file(s) changed, uncommitted`);
      return result;
    }),
    run(ServerCommands.export, async (target?: string | { id: string }, file?: string) => {
      const id = typeof target === "string" ? target : target?.id ?? model.selected?.id;
      const out = file ?? (await vscode.window.showSaveDialog({ filters: { "keel bundles": ["keel"] } }))?.fsPath;
      return id && out ? connection.executeCommand<unknown>(ServerCommands.export, [id, out]) : undefined;
    }),
    run(ServerCommands.import, async (file?: string, options?: { workspace?: string; allowUnsigned?: boolean }) => {
      const chosen = file ?? (await vscode.window.showOpenDialog({ canSelectMany: false }))?.[0]?.fsPath;
      return chosen ? missionCommand(ServerCommands.import, [chosen, options ?? {}]) : undefined;
    }),
  ];
}

/** The mission and point a command acts on: from the row or arguments, else picked (mission, then point). */
async function pointOf(model: MissionModel, target: PointTarget, point: string | undefined, missionTitle: string,
                       pointTitle: string): Promise<[string?, string?]> {
  if (target !== undefined && typeof target !== "string") {
    return [target.point.missionId, target.point.id];
  }
  const id = typeof target === "string" ? target : await missionId(model, undefined, () => true, missionTitle);
  if (id === undefined) {
    return [];
  }
  return [id, point ?? await pickPoint(model, id, pointTitle)];
}

async function diffWithSandbox(connection: KeelConnection, id: string, point: string,
                               file: string | undefined): Promise<string | undefined> {
  const path = file ?? await pickChanged(connection, id, point);
  if (path === undefined) {
    return undefined;
  }
  await vscode.commands.executeCommand("vscode.diff", pointUri(id, point, path), pointUri(id, SANDBOX, path),
    `${path} (${point} ↔ sandbox)`);
  return path;
}

/** A modal naming the mission, its state and the files its result changes; true when the person applies. */
async function confirmApply(connection: KeelConnection, model: MissionModel, id: string): Promise<boolean> {
  const mission = model.get(id);
  const first = (await model.restorePoints(id))[0]?.id;
  const changes = first === undefined ? []
    : await connection.request<FileChange[]>(Requests.pointChanges, { id, point: first });
  const state = mission === undefined ? "" : `${mission.state.replace("_", " ")}${progressText(mission)
    ? ` · ${progressText(mission)} units` : ""}`;
  const files = changes.length === 0 ? "It changes no files."
    : `${changes.length} file(s): ${changes.slice(0, 12).map((c) => `${c.path} (${c.status})`).join(", ")}` +
      (changes.length > 12 ? ", …" : "");
  const warning = mission !== undefined && mission.state !== "completed"
    ? `\n\nThis mission has not completed: its result is unfinished work.` : "";
  const choice = await vscode.window.showWarningMessage(
    `Apply mission ${mission ? missionLabel(mission) : id} (${state}) to the working tree?`,
    { modal: true, detail: `${files}${warning}\n\nThe files are written uncommitted into your checkout.` }, "Apply");
  return choice === "Apply";
}

async function pickChanged(connection: KeelConnection, id: string, point: string): Promise<string | undefined> {
  const changes = await connection.request<FileChange[]>(Requests.pointChanges, { id, point });
  if (changes.length === 0) {
    void vscode.window.showInformationMessage(`keel: the sandbox has the same files as ${point}`);
    return undefined;
  }
  const pick = await vscode.window.showQuickPick(
    changes.map((c) => ({ label: c.path, description: c.status })), { placeHolder: `Diff which file against ${point}?` });
  return pick?.label;
}
