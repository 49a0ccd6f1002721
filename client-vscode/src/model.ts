/**
 * The extension's picture of the store: mission summaries by id, kept current by `keel/missionChanged`
 * (no polling), plus which mission the Restore Points view shows. Views read it and listen to it.
 * Must not depend on any view.
 */
import * as vscode from "vscode";
import { ConnectionState, type KeelConnection } from "./connection";
import { Requests, type MissionDetail, type MissionSummary, type RestorePoint } from "./protocol";

/** The views hear of changes at most once per this long (at most one update per mission each time): at once
 * when the last time is that long ago, else when it is. */
const COALESCE_MS = 100;

export class MissionModel implements vscode.Disposable {
  private readonly missions = new Map<string, MissionSummary>();
  private selectedId: string | undefined;
  private loaded = false;
  private readonly changed = new vscode.EventEmitter<MissionSummary | undefined>();
  private readonly selectionChanged = new vscode.EventEmitter<MissionSummary | undefined>();
  private readonly subscriptions: vscode.Disposable[] = [];
  private readonly applied = new vscode.EventEmitter<MissionSummary>();
  private readonly pending = new Set<string>();
  private flushTimer: ReturnType<typeof setTimeout> | undefined;
  private lastFlush = 0;
  /** One mission changed (its newest summary), or everything (undefined) after a (re)load. Changes that
   * come close together are told once, with the newest state: a view never replays the states between. */
  readonly onDidChange = this.changed.event;
  /** Every summary as it came, in order (what must notice each transition: the notifications). */
  readonly onDidApply = this.applied.event;
  readonly onDidChangeSelection = this.selectionChanged.event;

  constructor(private readonly connection: KeelConnection, private readonly log: vscode.LogOutputChannel) {
    this.subscriptions.push(
      connection.onDidChangeMission((summary) => this.apply(summary)),
      connection.onDidChangeState((state) => void this.onConnectionState(state)),
    );
  }

  /** Missions, oldest first (the server's order). */
  list(): MissionSummary[] {
    return [...this.missions.values()].sort((a, b) => a.createdAt - b.createdAt);
  }

  get(id: string): MissionSummary | undefined {
    return this.missions.get(id);
  }

  get isLoaded(): boolean {
    return this.loaded;
  }

  get selected(): MissionSummary | undefined {
    return this.selectedId === undefined ? undefined : this.missions.get(this.selectedId);
  }

  select(id: string | undefined): void {
    if (id === this.selectedId) {
      return;
    }
    this.selectedId = id;
    this.selectionChanged.fire(this.selected);
  }

  /** Ask the server for the whole list again (after a start, or the Refresh button). */
  async reload(): Promise<void> {
    const missions = await this.connection.request<MissionSummary[]>(Requests.missions);
    this.missions.clear();
    for (const m of missions) {
      this.missions.set(m.id, m);
    }
    this.loaded = true;
    if (this.selectedId === undefined || !this.missions.has(this.selectedId)) {
      const first = missions.find((m) => m.state !== "completed") ?? missions[0];
      this.selectedId = first?.id;
    }
    this.changed.fire(undefined);
    this.selectionChanged.fire(this.selected);
  }

  detail(id: string): Promise<MissionDetail> {
    return this.connection.request<MissionDetail>(Requests.mission, { id });
  }

  restorePoints(id: string): Promise<RestorePoint[]> {
    return this.connection.request<RestorePoint[]>(Requests.restorePoints, { id });
  }

  /** Take a summary from a notification or a command result; the views hear of it within COALESCE_MS. */
  apply(summary: MissionSummary): void {
    this.missions.set(summary.id, summary);
    this.log.debug(`mission ${summary.id} is ${summary.state}`);
    this.applied.fire(summary);
    this.pending.add(summary.id);
    // a timer even when no wait is due: the notifications of one read of the server come in one turn
    this.flushTimer ??= setTimeout(() => this.flush(), Math.max(0, this.lastFlush + COALESCE_MS - Date.now()));
  }

  /** Tell the views the newest state of every mission that changed since the last time. */
  private flush(): void {
    this.flushTimer = undefined;
    this.lastFlush = Date.now();
    const ids = [...this.pending];
    this.pending.clear();
    for (const id of ids) {
      const summary = this.missions.get(id);
      if (summary === undefined) {
        continue;
      }
      this.changed.fire(summary);
      if (this.selectedId === undefined) {
        this.select(id);
      } else if (id === this.selectedId) {
        this.selectionChanged.fire(summary);
      }
    }
  }

  /** Forget a deleted mission. */
  remove(id: string): void {
    if (!this.missions.delete(id)) {
      return;
    }
    this.changed.fire(undefined);
    if (this.selectedId === id) {
      this.selectedId = undefined;
      this.selectionChanged.fire(undefined);
    }
  }

  dispose(): void {
    clearTimeout(this.flushTimer);
    this.subscriptions.forEach((d) => d.dispose());
    this.changed.dispose();
    this.applied.dispose();
    this.selectionChanged.dispose();
  }

  private async onConnectionState(state: ConnectionState): Promise<void> {
    if (state === ConnectionState.Running) {
      try {
        await this.reload();
      } catch (err) {
        this.log.error(`keel/missions failed: ${String(err)}`);
      }
    } else if (state !== ConnectionState.Starting) {
      this.missions.clear();
      this.loaded = false;
      this.changed.fire(undefined);
      this.selectionChanged.fire(undefined);
    }
  }
}
