/**
 * The palette and tree commands (category "keel"). Each resolves its target (a tree node, a mission id,
 * or a quick pick), asks the server through `workspace/executeCommand`, and feeds the returned summary
 * into the model; failures become one short message (details in the log). Must not draw views.
 */
import * as path from "node:path";
import * as vscode from "vscode";
import type { KeelConnection } from "./connection";
import type { MissionModel } from "./model";
import type { MissionTreeNode } from "./missionsTree";
import type { PointNode } from "./pointsTree";
import { sayRewound } from "./rewound";
import {
  canPause,
  canResume,
  isFinished,
  missionLabel,
  progressText,
  ServerCommands,
  type MissionSummary,
  type VerifyResult,
} from "./protocol";

type Target = string | MissionTreeNode | PointNode | undefined;

/** Registers commands whose failures are logged and shown as one short message, and runs mission
 * commands whose answer (a mission summary) updates the model at once. */
export function commandRunner(connection: KeelConnection, model: MissionModel, log: vscode.LogOutputChannel) {
  const run = <A extends unknown[]>(name: string, fn: (...args: A) => Promise<unknown>) =>
    vscode.commands.registerCommand(name, async (...args: A) => {
      try {
        return await fn(...args);
      } catch (err) {
        const message = err instanceof Error ? err.message : String(err);
        log.error(`${name} failed: ${message}`);
        void vscode.window.showErrorMessage(`keel: ${message}`);
        return undefined;
      }
    });
  const missionCommand = async (command: string, args: unknown[]): Promise<MissionSummary> => {
    const summary = await connection.executeCommand<MissionSummary>(command, args);
    model.apply(summary);
    return summary;
  };
  return { run, missionCommand };
}

export function registerCommands(connection: KeelConnection, model: MissionModel,
                                 log: vscode.LogOutputChannel): vscode.Disposable[] {
  const { run, missionCommand } = commandRunner(connection, model, log);
  return [
    run(ServerCommands.startMission, async (file?: vscode.Uri | string) => {
      const missionFile = await pickMissionFile(file);
      if (missionFile === undefined) {
        return undefined;
      }
      const summary = await missionCommand(ServerCommands.startMission, [missionFile]);
      model.select(summary.id);
      await vscode.commands.executeCommand("keel.openMission", summary.id); // a started mission shows its page
      return summary;
    }),
    run(ServerCommands.pause, async (target?: Target) => {
      const id = await missionId(model, target, canPause, "Pause which mission?");
      return id && missionCommand(ServerCommands.pause, [id]);
    }),
    run(ServerCommands.resume, async (target?: Target) => {
      const id = await missionId(model, target, canResume, "Resume which mission?");
      return id && missionCommand(ServerCommands.resume, [id]);
    }),
    run(ServerCommands.answer, async (target?: Target, text?: string) => {
      const id = await missionId(model, target, (m) => m.state === "waiting_input", "Answer which mission?");
      const mission = id === undefined ? undefined : model.get(id);
      const answer = text ?? (mission && await askAnswer(mission));
      return id && answer !== undefined ? missionCommand(ServerCommands.answer, [id, answer]) : undefined;
    }),
    run(ServerCommands.cancel, async (target?: Target) => {
      const id = await missionId(model, target, (m) => !isFinished(m), "Cancel which mission?");
      const mission = id === undefined ? undefined : model.get(id);
      if (id === undefined || mission === undefined) {
        return undefined;
      }
      const choice = await vscode.window.showWarningMessage(
        `Cancel mission ${missionLabel(mission)} (${mission.state})?`,
        { modal: true, detail: "Its running units stop and it ends as cancelled; it cannot be resumed. " +
          "Its restore points stay: you can fork it from one." }, "Cancel Mission");
      return choice === "Cancel Mission" ? missionCommand(ServerCommands.cancel, [id]) : undefined;
    }),
    run(ServerCommands.delete, async (target?: Target) => {
      const id = await missionId(model, target, isFinished, "Delete which finished mission?");
      const mission = id === undefined ? undefined : model.get(id);
      if (id === undefined || mission === undefined) {
        return undefined;
      }
      const choice = await vscode.window.showWarningMessage(
        `Delete mission ${missionLabel(mission)} (${mission.state})?`,
        { modal: true, detail: `Its records, restore points and sandbox are removed; its branch keel/${id} stays.` },
        "Delete");
      if (choice !== "Delete") {
        return undefined;
      }
      const result = await connection.executeCommand<{ deleted: string }>(ServerCommands.delete, [id]);
      model.remove(id);
      return result;
    }),
    run(ServerCommands.pauseAll, async () => {
      const result = await connection.executeCommand<{ paused: string[] }>(ServerCommands.pauseAll, []);
      void vscode.window.showInformationMessage(`keel: pause requested for ${result.paused.length} mission(s)`);
      return result;
    }),
    run(ServerCommands.restore, async (target?: Target, pointId?: string, options?: { files: boolean }) =>
      restore(model, missionCommand, target, pointId, options)),
    run(ServerCommands.verifyStore, async () => {
      const result = await connection.executeCommand<VerifyResult>(ServerCommands.verifyStore, []);
      if (result.ok) {
        void vscode.window.showInformationMessage(`keel: store verified, ${result.records} records intact`);
      } else {
        result.problems.forEach((p) => log.error(`verify: ${p.db}/${p.key}: ${p.message}`));
        const first = result.problems[0];
        void vscode.window.showErrorMessage(`keel: ${result.problems.length} damaged record(s) in the store` +
          (first ? `, first ${first.db}/${first.key}: ${first.message}` : ""), "Show Log")
          .then((pick) => pick && log.show());
      }
      return result;
    }),
    run("keel.refresh", () => model.reload()),
    run("keel.restartServer", () => connection.restart()),
    run("keel.showLog", async () => log.show()),
    run("keel.selectMission", async (target?: Target) => {
      const id = await missionId(model, target, () => true, "Show restore points of which mission?");
      model.select(id);
      await vscode.commands.executeCommand("keel.restorePoints.focus");
    }),
  ];
}

/** The mission a command acts on: from the tree node or id it got, else the one candidate, else a pick. */
export async function missionId(model: MissionModel, target: Target, eligible: (m: MissionSummary) => boolean,
                                placeHolder: string): Promise<string | undefined> {
  if (typeof target === "string") {
    return target;
  }
  if (target !== undefined) {
    return target.kind === "mission" ? target.id : target.kind === "unit" ? target.missionId : target.point.missionId;
  }
  const candidates = model.list().filter(eligible);
  if (candidates.length === 0) {
    void vscode.window.showInformationMessage("keel: no mission is in a state for that");
    return undefined;
  }
  if (candidates.length === 1) {
    return candidates[0]?.id;
  }
  return pickMission(candidates, placeHolder);
}

/** A quick pick of missions, each with its state and progress. */
export async function pickMission(candidates: MissionSummary[], title: string): Promise<string | undefined> {
  const pick = await vscode.window.showQuickPick(
    candidates.map((m) => ({ label: missionLabel(m), description: [m.state.replace("_", " "), progressText(m)]
      .filter((s) => s !== "").join(" · "), detail: m.id, id: m.id })), { title, placeHolder: title });
  return pick?.id;
}

/** The question is the picker's title (and the input box's prompt), so it stays in view while typing. */
async function askAnswer(mission: MissionSummary): Promise<string | undefined> {
  const question = mission.question;
  const title = `${missionLabel(mission)} asks: ${question?.text ?? "(no question recorded)"}`;
  if (question?.choices && question.choices.length > 0) {
    return vscode.window.showQuickPick(question.choices, { title, placeHolder: "Choose an answer", ignoreFocusOut: true });
  }
  return vscode.window.showInputBox({
    title,
    prompt: question?.text ?? "",
    placeHolder: "Your answer",
    ignoreFocusOut: true,
    validateInput: (value) => (value.trim() === "" ? "An answer cannot be empty" : undefined),
  });
}

/**
 * From the tree or the palette, a modal confirmation asks whether to rewind the files too; a caller that
 * passes (missionId, pointId, {files}) has decided already (other extensions, the tests).
 */
async function restore(model: MissionModel, missionCommand: (c: string, a: unknown[]) => Promise<MissionSummary>,
                       target: Target, pointId: string | undefined,
                       options: { files: boolean } | undefined): Promise<MissionSummary | undefined> {
  if (typeof target === "string" && pointId !== undefined && options !== undefined) {
    return missionCommand(ServerCommands.restore, [target, pointId, options]);
  }
  let id: string | undefined;
  let point = pointId;
  if (target !== undefined && typeof target !== "string" && target.kind === "point") {
    id = target.point.missionId;
    point = target.point.id;
  } else {
    id = await missionId(model, target, () => true, "Restore which mission?");
  }
  if (id === undefined) {
    return undefined;
  }
  point ??= await pickPoint(model, id, "Restore to which point?");
  if (point === undefined) {
    return undefined;
  }
  const files = await confirmRestore(model, id, point);
  if (files === undefined) {
    return undefined;
  }
  const summary = await missionCommand(ServerCommands.restore, [id, point, { files }]);
  void sayRewound(summary, point, files);
  return summary;
}

/**
 * Asks before a rewind; the default (first) button rewinds the sandbox's files with the mission, so that
 * work and files stay consistent. Returns whether to rewind files, or undefined when cancelled.
 */
export async function confirmRestore(model: MissionModel, id: string, point: string,
                                     only?: "files"): Promise<boolean | undefined> {
  const mission = model.get(id);
  const name = mission ? missionLabel(mission) : id;
  const detail = "Restore with Files puts the sandbox's files back as they were at the point too. " +
    "History is kept: the rewind adds new records.";
  const buttons = only === "files" ? ["Restore with Files"] : ["Restore with Files", "Restore Progress Only"];
  const choice = await vscode.window.showWarningMessage(`Rewind mission ${name} to ${point}?`, { modal: true, detail },
    ...buttons);
  return choice === undefined ? undefined : choice === "Restore with Files";
}

/** A quick pick of a mission's restore points, newest first, each with its reason and age. */
export async function pickPoint(model: MissionModel, id: string, title: string): Promise<string | undefined> {
  const points = (await model.restorePoints(id)).reverse();
  if (points.length === 0) {
    void vscode.window.showInformationMessage("keel: that mission has no restore points yet");
    return undefined;
  }
  const pick = await vscode.window.showQuickPick(
    points.map((p) => ({ label: p.id, description: p.reason, detail: p.label, id: p.id })), { title, placeHolder: title });
  return pick?.id;
}

async function pickMissionFile(file: vscode.Uri | string | undefined): Promise<string | undefined> {
  if (typeof file === "string") {
    return file;
  }
  if (file !== undefined) {
    return file.fsPath;
  }
  const found = await vscode.workspace.findFiles("**/*.toml", "**/{node_modules,.keel,.git,.venv}/**", 200);
  const candidates = found.filter((uri) => /mission/i.test(path.basename(uri.fsPath)));
  const items: (vscode.QuickPickItem & { uri?: vscode.Uri })[] = candidates.map((uri) => ({
    label: vscode.workspace.asRelativePath(uri), uri,
  }));
  const create = "$(new-file) Create a mission file (mission.toml and .keel/config.toml, as keel init does)";
  if (candidates.length === 0) {
    items.push({ label: create, detail: "No mission file in this workspace yet: write the starter, edit it, then start it" });
  }
  items.push({ label: "$(folder-opened) Choose a mission file…" });
  const pick = await vscode.window.showQuickPick(items, { placeHolder: "Start which mission file?" });
  if (pick === undefined) {
    return undefined;
  }
  if (pick.uri !== undefined) {
    return pick.uri.fsPath;
  }
  if (pick.label === create) {
    await vscode.commands.executeCommand("keel.createMissionFile");
    return undefined;
  }
  const chosen = await vscode.window.showOpenDialog({ canSelectMany: false, filters: { "Mission files": ["toml"] } });
  return chosen?.[0]?.fsPath;
}
