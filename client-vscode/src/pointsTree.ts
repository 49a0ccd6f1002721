/**
 * The Restore Points view: the restore points of the mission selected in the Missions view, newest
 * first, each with an inline Restore action (`contextValue` "restorePoint"); ages are redrawn every 10 s.
 * Must not send commands.
 */
import * as vscode from "vscode";
import type { MissionModel } from "./model";
import type { MissionSummary, RestorePoint } from "./protocol";
import { Throttle } from "./throttle";

export interface PointNode {
  readonly kind: "point";
  readonly point: RestorePoint;
  readonly missionName: string;
}

export class RestorePointsProvider implements vscode.TreeDataProvider<PointNode>, vscode.Disposable {
  private readonly emitter = new vscode.EventEmitter<PointNode | undefined>();
  private readonly subscriptions: vscode.Disposable[];
  private shownVersion = "";
  private readonly timer: ReturnType<typeof setInterval>;
  private readonly throttle = new Throttle(() => POINTS_GAP_MS, () => this.emitter.fire(undefined));
  readonly onDidChangeTreeData = this.emitter.event;

  constructor(private readonly model: MissionModel) {
    this.subscriptions = [model.onDidChangeSelection((m) => this.onSelection(m))];
    // "12s ago" must move on: redraw the rows (their ages) every AGE_REFRESH_MS while a mission is shown
    this.timer = setInterval(() => this.model.selected !== undefined && this.emitter.fire(undefined), AGE_REFRESH_MS);
  }

  async getChildren(element?: PointNode): Promise<PointNode[]> {
    const mission = this.model.selected;
    if (element !== undefined || mission === undefined) {
      return [];
    }
    const points = await this.model.restorePoints(mission.id);
    return points.reverse().map((point) => ({ kind: "point", point, missionName: mission.name }));
  }

  getTreeItem(node: PointNode): vscode.TreeItem {
    const p = node.point;
    const item = new vscode.TreeItem(p.label ? `${p.id} ${p.label}` : p.id, vscode.TreeItemCollapsibleState.None);
    item.id = `point:${p.missionId}:${p.id}`;
    item.description = `${p.reason} · ${ago(p.createdAt)}`;
    item.iconPath = new vscode.ThemeIcon(p.reason.startsWith("failover") ? "arrow-swap" : "git-commit");
    item.contextValue = "restorePoint";
    item.accessibilityInformation = { label: `restore point ${item.label as string}, ${item.description}` };
    item.tooltip = `${node.missionName} ${p.id}: ${p.reason}\n${new Date(p.createdAt * 1000).toLocaleString()}\n` +
      `checkpoint ${p.checkpoint}`;
    return item;
  }

  dispose(): void {
    this.throttle.dispose();
    clearInterval(this.timer);
    this.subscriptions.forEach((d) => d.dispose());
    this.emitter.dispose();
  }

  /** Refetch only when the selection moved (at once) or the selected mission gained or lost restore points
   * (at most once per POINTS_GAP_MS: a mission that makes a point per unit would refetch them all each time). */
  private onSelection(mission: MissionSummary | undefined): void {
    const version = mission === undefined ? "" : `${mission.id}:${mission.restorePoints ?? mission.updatedAt}`;
    if (version !== this.shownVersion) {
      const moved = version.split(":")[0] !== this.shownVersion.split(":")[0];
      this.shownVersion = version;
      if (moved) {
        this.emitter.fire(undefined);
      } else {
        this.throttle.request();
      }
    }
  }
}

const AGE_REFRESH_MS = 10_000;
const POINTS_GAP_MS = 1000;

function ago(at: number): string {
  const seconds = Math.max(0, Math.round(Date.now() / 1000 - at));
  if (seconds < 90) {
    return `${seconds}s ago`;
  }
  if (seconds < 5400) {
    return `${Math.round(seconds / 60)}m ago`;
  }
  if (seconds < 86400 * 2) {
    return `${Math.round(seconds / 3600)}h ago`;
  }
  return `${Math.round(seconds / 86400)}d ago`;
}
