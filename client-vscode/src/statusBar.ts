/**
 * The status-bar item: the mission that most needs attention, with its progress, and the one action
 * its state allows — running: click to pause; paused: click to resume; waiting for input: click to
 * answer. Hidden when no mission is active. Must not send commands itself (the click runs a command).
 */
import * as vscode from "vscode";
import { ConnectionState, type KeelConnection } from "./connection";
import type { MissionModel } from "./model";
import { isActive, missionLabel, progressText, type MissionState, type MissionSummary } from "./protocol";

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

  constructor(private readonly model: MissionModel, private readonly connection: KeelConnection,
              private readonly lastFinished: () => MissionSummary | undefined = () => undefined) {
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
      this.showFinished();
      return;
    }
    const progress = progressText(m) + (m.usage?.failovers ? ` $(arrow-swap) ${m.usage.servedModel ?? ""}` : "");
    const failover = m.usage?.failovers
      ? `\n\nFailed over ${m.usage.failovers} time(s); now served by ${m.usage.servedModel ?? "another provider"}.` : "";
    const args = [m.id];
    const name = missionLabel(m);
    switch (m.state) {
      case "waiting_input":
        this.show(`$(question) keel: ${name} needs input`, `${m.question?.text ?? "The mission asks a question"}\n\nClick to answer.`,
          { title: "Answer", command: "keel.answer", arguments: args },
          new vscode.ThemeColor("statusBarItem.warningBackground"));
        return;
      case "offline":
        this.show(`$(debug-disconnect) keel: ${name} offline${progress ? ` ${progress}` : ""}`,
          `${name} is offline: no model provider answers; it resumes by itself when one does.\n` +
          `${m.error ?? ""}\n\nClick to resume now.`,
          { title: "Resume", command: "keel.resume", arguments: args },
          new vscode.ThemeColor("statusBarItem.warningBackground"));
        return;
      case "paused":
        this.show(`$(debug-pause) keel: ${name} ${m.state}${progress ? ` ${progress}` : ""}`,
          `${name} is ${m.state}${m.pauseNote || m.pauseReason ? ` (${m.pauseNote || m.pauseReason})` : ""}` +
          `${m.error ? `: ${m.error}` : ""}.${failover} Click to resume.`,
          { title: "Resume", command: "keel.resume", arguments: args });
        return;
      case "pausing":
        this.show(`$(loading~spin) keel: ${name} pausing`, `${name} is reaching a checkpoint to pause.`, undefined);
        return;
      default:
        this.show(`$(sync~spin) keel: ${name}${progress ? ` ${progress}` : ""}`,
          `${name} is ${m.state} (${m.percentage}%).${failover} Click to pause.`,
          { title: "Pause", command: "keel.pause", arguments: args });
    }
  }

  /** No mission is active: the one that finished last while this window watched, until another starts. */
  private showFinished(): void {
    const done = this.lastFinished();
    const m = done === undefined ? undefined : this.model.get(done.id);
    if (m === undefined || isActive(m)) {
      this.item.hide();
      return;
    }
    const icon = m.state === "completed" ? "$(pass)" : "$(error)";
    this.show(`${icon} keel: ${missionLabel(m)} ${m.state}`, `${missionLabel(m)} ${m.state}. Click to review its changes.`,
      { title: "Review Changes", command: "keel.reviewChanges", arguments: [m.id] });
  }

  private show(text: string, tooltip: string, command: vscode.Command | undefined,
               background?: vscode.ThemeColor): void {
    this.item.text = text;
    // screen readers hear words, not icon ids such as "debug-pause"
    this.item.accessibilityInformation = { label: `${text.replace(/\$\([^)]*\)\s*/g, "")}. ${tooltip.split("\n")[0]}` };
    this.item.tooltip = tooltip;
    this.item.command = command;
    this.item.backgroundColor = background;
    this.item.show();
  }
}
