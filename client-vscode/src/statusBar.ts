/**
 * The status-bar item: the mission that most needs attention, with its progress, and the one action
 * its state allows — running: click to pause; paused: click to resume; waiting for input: click to
 * answer. Hidden when no mission is active. Must not send commands itself (the click runs a command).
 */
import * as vscode from "vscode";
import { ConnectionState, type KeelConnection } from "./connection";
import type { MissionModel } from "./model";
import { isActive, progressText, type MissionState, type MissionSummary } from "./protocol";

/** Which active mission the item shows: a question first, then running work, then paused work. */
const PRIORITY: Partial<Record<MissionState, number>> = {
  waiting_input: 0, running: 1, pausing: 2, offline: 3, created: 4, paused: 5,
};

export function focusMission(missions: readonly MissionSummary[]): MissionSummary | undefined {
  const active = missions.filter(isActive);
  active.sort((a, b) => (PRIORITY[a.state] ?? 9) - (PRIORITY[b.state] ?? 9) || b.updatedAt - a.updatedAt);
  return active[0];
}

export class KeelStatusBar implements vscode.Disposable {
  private readonly item = vscode.window.createStatusBarItem("keel.status", vscode.StatusBarAlignment.Left, 50);
  private readonly subscriptions: vscode.Disposable[];

  constructor(private readonly model: MissionModel, private readonly connection: KeelConnection) {
    this.item.name = "keel";
    this.subscriptions = [
      model.onDidChange(() => this.update()),
      connection.onDidChangeState(() => this.update()),
    ];
    this.update();
  }

  /** What the item shows right now (the extension-host tests read it). */
  get text(): string {
    return this.item.text;
  }

  get command(): vscode.Command | undefined {
    return typeof this.item.command === "object" ? this.item.command : undefined;
  }

  dispose(): void {
    this.subscriptions.forEach((d) => d.dispose());
    this.item.dispose();
  }

  private update(): void {
    const state = this.connection.current;
    if (state === ConnectionState.NotInstalled || state === ConnectionState.Failed) {
      this.show("$(error) keel: not running", `keel server ${state}: ${this.connection.problem}`,
        { title: "Show Log", command: "keel.showLog" }, new vscode.ThemeColor("statusBarItem.errorBackground"));
      return;
    }
    const m = focusMission(this.model.list());
    if (m === undefined) {
      this.item.hide();
      return;
    }
    const progress = progressText(m);
    const args = [m.id];
    switch (m.state) {
      case "waiting_input":
        this.show(`$(question) keel: ${m.name} needs input`, `${m.question?.text ?? "The mission asks a question"}\n\nClick to answer.`,
          { title: "Answer", command: "keel.answer", arguments: args },
          new vscode.ThemeColor("statusBarItem.warningBackground"));
        return;
      case "offline":
        this.show(`$(debug-disconnect) keel: ${m.name} offline${progress ? ` ${progress}` : ""}`,
          `${m.name} is offline: no model provider answers; it resumes by itself when one does.\n` +
          `${m.error ?? ""}\n\nClick to resume now.`,
          { title: "Resume", command: "keel.resume", arguments: args },
          new vscode.ThemeColor("statusBarItem.warningBackground"));
        return;
      case "paused":
        this.show(`$(debug-pause) keel: ${m.name} ${m.state}${progress ? ` ${progress}` : ""}`,
          `${m.name} is ${m.state}${m.pauseReason ? ` (${m.pauseReason})` : ""}` +
          `${m.error ? `: ${m.error}` : ""}. Click to resume.`,
          { title: "Resume", command: "keel.resume", arguments: args });
        return;
      case "pausing":
        this.show(`$(loading~spin) keel: ${m.name} pausing`, `${m.name} is reaching a checkpoint to pause.`, undefined);
        return;
      default:
        this.show(`$(sync~spin) keel: ${m.name}${progress ? ` ${progress}` : ""}`,
          `${m.name} is ${m.state} (${m.percentage}%). Click to pause.`,
          { title: "Pause", command: "keel.pause", arguments: args });
    }
  }

  private show(text: string, tooltip: string, command: vscode.Command | undefined,
               background?: vscode.ThemeColor): void {
    this.item.text = text;
    this.item.tooltip = tooltip;
    this.item.command = command;
    this.item.backgroundColor = background;
    this.item.show();
  }
}
