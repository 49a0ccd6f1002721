/**
 * The Missions view: one row per mission (state icon, progress, current unit), its units as children.
 * `contextValue` is `mission.<state>` / `unit.<state>`, so package.json menus offer the actions a state
 * allows. Rows change only when the model says so (keel/missionChanged). Must not send commands.
 */
import * as vscode from "vscode";
import type { MissionModel } from "./model";
import { Throttle } from "./throttle";
import {
  missionLabel,
  progressText,
  usageText,
  type MissionState,
  type MissionSummary,
  type UnitInfo,
  type UnitState,
} from "./protocol";

export interface MissionNode {
  readonly kind: "mission";
  readonly id: string;
}

export interface UnitNode {
  readonly kind: "unit";
  readonly missionId: string;
  readonly unit: UnitInfo;
  /** The mission's state when the unit was read: a stopped mission's unfinished units are "paused". */
  readonly missionState: MissionState;
  /** The unit whose question the mission waits on, if any. */
  readonly asking?: string;
}

export type MissionTreeNode = MissionNode | UnitNode;

const MISSION_ICONS: Record<MissionState, [string, string?]> = {
  created: ["circle-outline"],
  running: ["sync~spin", "charts.blue"],
  pausing: ["loading~spin", "charts.yellow"],
  paused: ["debug-pause", "charts.yellow"],
  waiting_input: ["question", "charts.orange"],
  offline: ["debug-disconnect", "charts.orange"],
  completed: ["pass", "testing.iconPassed"],
  failed: ["error", "testing.iconFailed"],
  cancelled: ["circle-slash"],
};

const UNIT_ICONS: Record<UnitState, [string, string?]> = {
  pending: ["circle-outline"],
  ready: ["circle-large-outline"],
  running: ["sync~spin", "charts.blue"],
  succeeded: ["pass", "testing.iconPassed"],
  failed: ["error", "testing.iconFailed"],
  resumable: ["debug-pause", "charts.yellow"],
};

/** The command a mission row runs when clicked (extension.ts): open the mission of the selected row. */
export const OPEN_SELECTED = "keel.openSelectedMission";
const ROW_GAP_MS = 500;
const BIG_ROW_GAP_MS = 1500; // a mission with more units than OPEN_UP_TO: reading them all costs more
const OPEN_UP_TO = 50;

const STOPPED: ReadonlySet<MissionState> = new Set(["paused", "pausing", "waiting_input", "offline", "failed", "cancelled"]);

/** The word a person reads for a unit's state: a resumable unit of a stopped mission is "paused" (it
 * continues where it stopped on resume), of a running one "resuming". */
export function unitStateText(state: UnitState, mission: MissionState, asking = false): string {
  if (asking && mission === "waiting_input") {
    return "waiting for input";
  }
  if (state === "resumable") {
    return STOPPED.has(mission) ? "paused" : "resuming";
  }
  return state;
}

function icon([name, color]: [string, string?]): vscode.ThemeIcon {
  return new vscode.ThemeIcon(name, color === undefined ? undefined : new vscode.ThemeColor(color));
}

/** "paused (operator)", "waiting for input", "running, stranded": the state words of a row. */
export function stateText(m: MissionSummary): string {
  const base = m.state === "waiting_input" ? "waiting for input" : m.state;
  // a pause no person asked for keeps its reason in sight: "paused (policy: no providers are configured…)"
  const why = m.pauseReason === "policy" && m.error ? `policy: ${m.error}` : m.pauseNote || m.pauseReason;
  const reason = m.state === "paused" && why ? ` (${why})`
    : m.state === "offline" ? " (no model provider answers; resumes by itself)" : "";
  return `${base}${reason}${m.stranded ? ", stranded" : ""}`;
}

export class MissionsTreeProvider implements vscode.TreeDataProvider<MissionTreeNode>, vscode.Disposable {
  private readonly nodes = new Map<string, MissionNode>();
  private readonly emitter = new vscode.EventEmitter<MissionTreeNode | undefined>();
  private readonly subscription: vscode.Disposable;
  private readonly throttles = new Map<string, Throttle>();
  private listed = new Set<string>();
  private readonly loading = new Set<string>();
  readonly onDidChangeTreeData = this.emitter.event;

  constructor(private readonly model: MissionModel) {
    this.subscription = model.onDidChange((summary) => this.refresh(summary));
  }

  nodeFor(id: string): MissionNode {
    let node = this.nodes.get(id);
    if (node === undefined) {
      node = { kind: "mission", id };
      this.nodes.set(id, node);
    }
    return node;
  }

  getChildren(element?: MissionTreeNode): vscode.ProviderResult<MissionTreeNode[]> {
    if (element === undefined) {
      const missions = this.model.list();
      this.listed = new Set(missions.map((m) => m.id));
      return missions.map((m) => this.nodeFor(m.id));
    }
    if (element.kind === "mission") {
      return this.unitsOf(element.id);
    }
    return [];
  }

  getParent(element: MissionTreeNode): MissionTreeNode | undefined {
    return element.kind === "unit" ? this.nodeFor(element.missionId) : undefined;
  }

  getTreeItem(element: MissionTreeNode): vscode.TreeItem {
    return element.kind === "mission" ? this.missionItem(element.id) : unitItem(element);
  }

  dispose(): void {
    this.throttles.forEach((t) => t.dispose());
    this.subscription.dispose();
    this.emitter.dispose();
  }

  /** A mission's row (and its units) is drawn again at most once per ROW_GAP_MS and never while its units
   * are still being read: changes that come meanwhile make one more refresh, with the newest state. A row
   * that stays put between refreshes takes a click. */
  private refresh(summary: MissionSummary | undefined): void {
    // a mission the list has not shown yet needs the whole list again (a node made for it by a reveal is
    // not in the tree until then, and refreshing it alone would show nothing)
    if (summary === undefined || !this.listed.has(summary.id)) {
      this.emitter.fire(undefined);
      return;
    }
    const id = summary.id;
    let throttle = this.throttles.get(id);
    if (throttle === undefined) {
      throttle = new Throttle(() => ((this.model.get(id)?.units.total ?? 0) > OPEN_UP_TO ? BIG_ROW_GAP_MS : ROW_GAP_MS),
        () => this.emitter.fire(this.nodeFor(id)), () => this.loading.has(id));
      this.throttles.set(id, throttle);
    }
    throttle.request();
  }

  private async unitsOf(missionId: string): Promise<UnitNode[]> {
    this.loading.add(missionId);
    try {
      const detail = await this.model.detail(missionId);
      const asking = detail.mission.question?.unit;
      return detail.units.map((unit) => ({ kind: "unit", missionId, unit, missionState: detail.mission.state, asking }));
    } finally {
      this.loading.delete(missionId);
    }
  }

  private missionItem(id: string): vscode.TreeItem {
    const m = this.model.get(id);
    if (m === undefined) {
      return new vscode.TreeItem(id, vscode.TreeItemCollapsibleState.None);
    }
    // an active mission shows its units, unless they are too many for a tree (its page groups them)
    const open = m.state !== "completed" && m.state !== "cancelled" && m.units.total <= OPEN_UP_TO;
    const item = new vscode.TreeItem(missionLabel(m) || m.id,
      open ? vscode.TreeItemCollapsibleState.Expanded : vscode.TreeItemCollapsibleState.Collapsed);
    item.id = `mission:${m.id}`;
    const failover = m.usage?.failovers ? `⇄ ${m.usage.servedModel ?? ""}` : "";
    item.description = [stateText(m), progressText(m), usageText(m), failover].filter((s) => s !== "").join(" · ");
    item.iconPath = icon(MISSION_ICONS[m.state] ?? ["circle-outline"]);
    item.contextValue = `mission.${m.state}`;
    // no arguments: VS Code keeps a row command's arguments only until the row is drawn again, so a click
    // that met a refresh ran nothing ("Actual command not found"); the command opens the selected row's mission
    item.command = { command: OPEN_SELECTED, title: "Open Mission" };
    item.tooltip = missionTooltip(m, m.forkedFrom ? this.model.get(m.forkedFrom.mission) : undefined);
    item.accessibilityInformation = { label: `mission ${missionLabel(m)}, ${item.description}` };
    return item;
  }
}

/** A unit row. Its description is the state alone: a unit continued after a pause or an answer is the
 * same piece of work, so how many times it was started goes to the tooltip only. */
function unitItem(node: UnitNode): vscode.TreeItem {
  const u = node.unit;
  const item = new vscode.TreeItem(u.title ? `${u.id} ${u.title}` : u.id, vscode.TreeItemCollapsibleState.None);
  item.id = `unit:${node.missionId}:${u.id}`;
  const state = unitStateText(u.state, node.missionState, node.asking === u.id);
  item.description = state;
  item.iconPath = icon(state === "waiting for input" ? ["question", "charts.orange"] : UNIT_ICONS[u.state] ?? ["circle-outline"]);
  item.contextValue = `unit.${u.state}`;
  const starts = u.attempts > 1 ? `\nstarted ${u.attempts} times (continued after a pause, a question or a crash)` : "";
  item.tooltip = `${u.id}: ${state}${u.error ? `\n${u.error}` : ""}${starts}`;
  item.accessibilityInformation = { label: `unit ${item.label as string}, ${state}` };
  return item;
}

function missionTooltip(m: MissionSummary, origin: MissionSummary | undefined): vscode.MarkdownString {
  const lines = [`**${missionLabel(m)}** \`${m.id}\``, "", `state: ${stateText(m)}`];
  if (m.forkedFrom) {
    lines.push(`forked from ${origin ? missionLabel(origin) : "a deleted mission"} at ${m.forkedFrom.point}`);
  }
  if (m.units.total > 0) {
    lines.push(`units: ${m.units.done}/${m.units.total} done (${m.percentage}%)` +
      (m.currentUnit ? `, now ${m.currentUnit}${m.currentUnitTitle ? ` ${m.currentUnitTitle}` : ""}` : ""));
  }
  const u = m.usage;
  if (u !== undefined && u.calls > 0) {
    lines.push(`model calls: ${u.calls}, tokens: ${u.promptTokens} in + ${u.completionTokens} out` +
      (u.cost !== undefined ? `, cost ${u.cost.toFixed(4)}` : ", cost unknown (no price configured)"));
  }
  if (u?.servedModel) {
    lines.push(`served by: ${u.servedModel}${u.failovers ? ` (after ${u.failovers} failover(s))` : ""}`);
  }
  if (m.question) {
    lines.push(`question: ${m.question.text}`);
  }
  if (m.error) {
    lines.push(`error: ${m.error}`);
  }
  const md = new vscode.MarkdownString(lines.join("  \n"));
  md.supportHtml = false;
  return md;
}
