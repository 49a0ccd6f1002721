/**
 * The Subagents view: the lease registry (`keel/subagents`) of the mission selected in the Missions view —
 * one row per unit that ran under a lease, with its state, lease age and sandbox. Refetches when the
 * selection or the selected mission changes, and every 2 s while that mission runs (lease ages move).
 * Must not send commands.
 */
import * as vscode from "vscode";
import type { KeelConnection } from "./connection";
import type { MissionModel } from "./model";
import { Throttle } from "./throttle";
import type { Subagent } from "./protocol";

export interface SubagentNode {
  readonly kind: "subagent";
  readonly missionId: string;
  readonly subagent: Subagent;
}

const ICONS: Record<Subagent["state"], string> = {
  offered: "inbox", running: "sync~spin", expired: "warning", returned: "reply", orphaned: "debug-disconnect",
  done: "pass",
};

/** A worker whose host went away records "orphaned"; after a pause, a question or an offline stop that
 * is the normal way a unit stops, so it reads "paused" (and "stopped" otherwise). */
export function subagentStateText(state: Subagent["state"], missionState: string | undefined): string {
  if (state !== "orphaned") {
    return state;
  }
  return ["paused", "pausing", "waiting_input", "offline"].includes(missionState ?? "") ? "paused" : "stopped";
}

const SUBAGENTS_GAP_MS = 1000;

export class SubagentsProvider implements vscode.TreeDataProvider<SubagentNode>, vscode.Disposable {
  private readonly emitter = new vscode.EventEmitter<SubagentNode | undefined>();
  private readonly subscriptions: vscode.Disposable[];
  private readonly timer: ReturnType<typeof setInterval>;
  private shownVersion = "";
  private readonly throttle = new Throttle(() => SUBAGENTS_GAP_MS, () => this.emitter.fire(undefined));
  readonly onDidChangeTreeData = this.emitter.event;

  constructor(private readonly model: MissionModel, private readonly connection: KeelConnection) {
    this.subscriptions = [model.onDidChange(() => this.onChange()), model.onDidChangeSelection(() => this.onChange())];
    this.timer = setInterval(() => {
      if (this.model.selected?.state === "running") {
        this.emitter.fire(undefined);
      }
    }, 2000);
  }

  async getChildren(element?: SubagentNode): Promise<SubagentNode[]> {
    const mission = this.model.selected;
    if (element !== undefined || mission === undefined) {
      return [];
    }
    const rows = await this.connection.request<Subagent[]>("keel/subagents", { id: mission.id });
    return rows.map((subagent) => ({ kind: "subagent", missionId: mission.id, subagent }));
  }

  getTreeItem(node: SubagentNode): vscode.TreeItem {
    const s = node.subagent;
    const item = new vscode.TreeItem(s.unit, vscode.TreeItemCollapsibleState.None);
    item.id = `subagent:${node.missionId}:${s.unit}`;
    const state = subagentStateText(s.state, this.model.get(node.missionId)?.state);
    const age = s.state === "done" || state !== s.state ? "" : ` · lease ${s.leaseAge.toFixed(1)}s`;
    const where = s.worker ? ` · worker ${s.worker} on ${s.hostname}` : "";
    item.description = `${state}${age}${where} · ${s.sandbox}`;
    item.iconPath = new vscode.ThemeIcon(state === "paused" ? "debug-pause" : ICONS[s.state] ?? "circle-outline");
    item.accessibilityInformation = { label: `subagent ${s.unit}, ${state}` };
    item.contextValue = `subagent-${s.state}`;
    item.tooltip = `unit ${s.unit} (journal lane ${s.lane}): ${state} (lease ${s.state})\nlease epoch ${s.epoch}, pid ${s.pid} ` +
      `on ${s.hostname}, heartbeat ${s.leaseAge.toFixed(1)} s ago (ttl ${s.ttl} s)\n` +
      `journal up to entry ${s.lastCheckpoint}\nsandbox ${s.sandbox}\nbranch ${s.branch}` +
      (s.merged ? "\nmerged into the mission branch" : "") +
      (s.worker ? `\nrun by keel worker ${s.worker}` : "") + (s.why ? `\nhanded back: ${s.why}` : "");
    return item;
  }

  dispose(): void {
    this.throttle.dispose();
    clearInterval(this.timer);
    this.subscriptions.forEach((d) => d.dispose());
    this.emitter.dispose();
  }

  private onChange(): void {
    const m = this.model.selected;
    const version = m === undefined ? "" : `${m.id}:${m.updatedAt}:${m.state}`;
    if (version !== this.shownVersion) {
      const moved = version.split(":")[0] !== this.shownVersion.split(":")[0];
      this.shownVersion = version;
      if (moved) {
        this.emitter.fire(undefined); // another mission: at once; the same one: at most once per SUBAGENTS_GAP_MS
      } else {
        this.throttle.request();
      }
    }
  }
}
