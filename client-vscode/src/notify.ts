/**
 * Notifications a person should not miss, from the mission model's changes: a mission that completes or
 * fails (with Review Changes / Apply), a failover (which model serves now), and a free-text question
 * (with an Answer button; a question with choices comes as the server's message with one button per
 * choice), and a host that was lost and resumed from the journal (how many steps it kept). Each is shown
 * once. Must not draw views.
 */
import * as vscode from "vscode";
import type { KeelConnection } from "./connection";
import type { MissionModel } from "./model";
import { isActive, missionLabel, usageText, type ActivityChanged, type MissionSummary } from "./protocol";

const FAILOVER_WAIT_MS = 5_000;

export class Notifier implements vscode.Disposable {
  private readonly seen = new Map<string, MissionSummary>();
  private readonly asked = new Set<string>();
  private readonly failovers = new Map<string, { count: number; model: string }>();
  private readonly waiting = new Set<string>();
  private readonly subscriptions: vscode.Disposable[];
  private readonly resumed = new Set<string>();
  /** Missions that finished while this window watched, newest last (the status bar shows the last). */
  readonly finished: MissionSummary[] = [];
  /** What was shown, for the tests. */
  readonly shown: string[] = [];

  constructor(private readonly model: MissionModel, connection: KeelConnection) {
    this.subscriptions = [
      model.onDidChange((m) => m === undefined && this.remember()),
      model.onDidApply((m) => this.onChange(m)),
      connection.onDidChangeActivity((a) => this.hostLost(a)),
    ];
  }

  dispose(): void {
    this.subscriptions.forEach((d) => d.dispose());
  }

  /** "host lost, resumed from the journal: N step(s) kept, M run again", once per start again. */
  private hostLost(a: ActivityChanged): void {
    for (const item of a.items) {
      if (item.status !== "host-lost" || this.resumed.has(`${a.id}/${item.id}`)) {
        continue;
      }
      this.resumed.add(`${a.id}/${item.id}`);
      const m = this.model.get(a.id);
      this.show(`keel: ${m ? missionLabel(m) : a.id}: ${item.title}`, "Open Mission").then((pick) => {
        if (pick === "Open Mission") {
          void vscode.commands.executeCommand("keel.openMission", a.id);
        }
      });
    }
  }

  private remember(): void {
    for (const m of this.model.list()) {
      this.seen.set(m.id, m);
      if (m.state === "waiting_input" && m.question) {
        this.ask(m);
      }
    }
  }

  private onChange(m: MissionSummary): void {
    const before = this.seen.get(m.id);
    this.seen.set(m.id, m);
    const name = missionLabel(m);
    this.failover(m, before);
    if (m.state === "waiting_input" && m.question) {
      this.ask(m);
    }
    if (before !== undefined && isActive(before) && (m.state === "completed" || m.state === "failed")) {
      this.finished.push(m);
      const usage = usageText(m);
      const text = m.state === "completed"
        ? `keel: ${name} completed (${m.units.done}/${m.units.total} units${usage ? ` · ${usage}` : ""})`
        : `keel: ${name} failed: ${m.error ?? "see the log"}`;
      this.show(text, "Review Changes", "Apply").then((pick) => {
        if (pick === "Review Changes") {
          void vscode.commands.executeCommand("keel.reviewChanges", m.id);
        } else if (pick === "Apply") {
          void vscode.commands.executeCommand("keel.apply", { id: m.id });
        }
      });
    }
  }

  /**
   * A failover is recorded before the call it served is journaled: the toast waits (up to
   * FAILOVER_WAIT_MS) for the summary that names the model now serving, so it can say which.
   */
  private failover(m: MissionSummary, before: MissionSummary | undefined): void {
    const count = m.usage?.failovers ?? 0;
    const known = this.failovers.get(m.id) ?? { count: before?.usage?.failovers ?? 0, model: before?.usage?.servedModel ?? "" };
    if (count <= known.count) {
      this.failovers.set(m.id, known);
      return;
    }
    const model = m.usage?.servedModel ?? "";
    const announce = (serving: string) => {
      this.waiting.delete(m.id);
      this.failovers.set(m.id, { count, model: serving });
      this.show(`keel: ${missionLabel(m)} failed over; now served by ${serving || "another provider"}`, "Show Providers")
        .then((pick) => pick && vscode.commands.executeCommand("keel.providers.focus"));
    };
    if (model !== "" && model !== known.model) {
      announce(model);
      return;
    }
    this.failovers.set(m.id, known); // still the count before: the next summary may name the model
    if (!this.waiting.has(m.id)) {
      this.waiting.add(m.id);
      setTimeout(() => {
        if (this.waiting.delete(m.id) && (this.failovers.get(m.id)?.count ?? 0) < count) {
          announce(this.model.get(m.id)?.usage?.servedModel ?? "");
        }
      }, FAILOVER_WAIT_MS);
    }
  }

  /** A free-text question gets a toast with an Answer button (once per question). */
  private ask(m: MissionSummary): void {
    const q = m.question;
    if (q === undefined || (q.choices?.length ?? 0) > 0) {
      return;
    }
    const key = `${m.id}/${q.unit}/${q.seq}`;
    if (this.asked.has(key)) {
      return;
    }
    this.asked.add(key);
    this.show(`keel: ${missionLabel(m)} asks: ${q.text}`, "Answer").then((pick) => {
      if (pick === "Answer") {
        void vscode.commands.executeCommand("keel.answer", m.id);
      }
    });
  }

  private show(text: string, ...actions: string[]): Thenable<string | undefined> {
    this.shown.push(text);
    return vscode.window.showInformationMessage(text, ...actions);
  }
}
