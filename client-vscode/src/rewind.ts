/**
 * Rewinding and moving missions: Fork, Restore with Files and Diff on restore points, Apply, Export and
 * Import. Diff opens VS Code's diff view on two virtual documents (scheme `keel-point`) whose text the
 * server serves with `keel/pointFile`; a point's changed files come from `keel/pointChanges`.
 * Must not draw views.
 */
import * as vscode from "vscode";
import { commandRunner } from "./commands";
import type { KeelConnection } from "./connection";
import type { MissionModel } from "./model";
import type { PointNode } from "./pointsTree";
import {
  Requests,
  SANDBOX,
  ServerCommands,
  type ApplyResult,
  type FileChange,
  type PointFile,
} from "./protocol";

export const SCHEME = "keel-point";

/** `keel-point:/<mission>/<point>/<path>`: one file of a point's snapshot (or of the sandbox). */
export function pointUri(missionId: string, point: string, path: string): vscode.Uri {
  return vscode.Uri.from({ scheme: SCHEME, path: `/${missionId}/${point}/${path}` });
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
    vscode.workspace.registerTextDocumentContentProvider(SCHEME, new PointFiles(connection)),
    run(ServerCommands.fork, async (target?: PointTarget, point?: string) => {
      const [id, p] = pointOf(model, target, point);
      if (id === undefined || p === undefined) {
        return undefined;
      }
      const summary = await missionCommand(ServerCommands.fork, [id, p]);
      model.select(summary.id);
      void vscode.window.showInformationMessage(`keel: forked ${id} at ${p} as ${summary.id} (paused)`);
      return summary;
    }),
    run("keel.restoreWithFiles", async (target?: PointTarget, point?: string) => {
      const [id, p] = pointOf(model, target, point);
      return id && p ? missionCommand(ServerCommands.restore, [id, p, { files: true }]) : undefined;
    }),
    run("keel.diffPoint", async (target?: PointTarget, point?: string, file?: string) => {
      const [id, p] = pointOf(model, target, point);
      if (id === undefined || p === undefined) {
        return undefined;
      }
      const path = file ?? await pickChanged(connection, id, p);
      if (path === undefined) {
        return undefined;
      }
      await vscode.commands.executeCommand("vscode.diff", pointUri(id, p, path), pointUri(id, SANDBOX, path),
        `${path} (${p} ↔ sandbox)`);
      return path;
    }),
    run(ServerCommands.apply, async (target?: string | { id: string }, options?: { branch?: string }) => {
      const id = typeof target === "string" ? target : target?.id ?? model.selected?.id;
      if (id === undefined) {
        return undefined;
      }
      const result = await connection.executeCommand<ApplyResult>(ServerCommands.apply, [id, options ?? {}]);
      const count = result.added.length + result.modified.length + result.removed.length;
      void vscode.window.showInformationMessage(result.branch ? `keel: mission ${id} committed on ${result.branch}`
        : `keel: applied mission ${id}: ${count} file(s) changed, uncommitted`);
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

function pointOf(model: MissionModel, target: PointTarget, point: string | undefined): [string?, string?] {
  if (typeof target === "string") {
    return [target, point];
  }
  if (target !== undefined) {
    return [target.point.missionId, target.point.id];
  }
  return [model.selected?.id, point];
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
