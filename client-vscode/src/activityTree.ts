/**
 * The Activity view: what the agents of the selected mission did, one row per step, live.
 *
 * `ActivityFeed` loads the selected mission's history with `keel/activity` (paged by cursor) and merges every
 * `keel/activityChanged` for it by item id (a later item with the same id, such as an intent that got its
 * result, replaces the row in place). `ActivityTreeProvider` draws the rows that pass the filters (unit,
 * kinds, failures only); a row expands to its details, and a changed file's row opens the diff editor.
 * Must not send commands other than the activity requests.
 */
import * as vscode from "vscode";
import type { KeelConnection } from "./connection";
import type { MissionModel } from "./model";
import { Requests, type ActivityFileChange, type ActivityItem, type ActivityPage } from "./protocol";

export interface ActivityFilter {
  unit?: string;
  kinds: string[];
  failuresOnly: boolean;
}

export class ActivityFeed implements vscode.Disposable {
  private items = new Map<string, ActivityItem>();
  private missionId: string | undefined;
  private loading = 0;
  private readonly changed = new vscode.EventEmitter<void>();
  private readonly subscriptions: vscode.Disposable[];
  readonly onDidChange = this.changed.event;

  constructor(private readonly connection: KeelConnection, model: MissionModel,
              private readonly log: vscode.LogOutputChannel) {
    this.subscriptions = [
      model.onDidChangeSelection((m) => {
        if (m?.id !== this.missionId) {
          void this.load(m?.id);
        }
      }),
      connection.onDidChangeActivity((news) => {
        if (news.id === this.missionId) {
          this.merge(news.items);
        }
      }),
      connection.onDidChangeState(() => void this.load(this.missionId)),
    ];
  }

  get mission(): string | undefined {
    return this.missionId;
  }

  /** Every step of the mission, in order (for the view and the tests). */
  get all(): ActivityItem[] {
    return [...this.items.values()];
  }

  get units(): string[] {
    return [...new Set(this.all.map((i) => i.unit).filter((u): u is string => !!u))];
  }

  async load(missionId: string | undefined): Promise<void> {
    const ticket = ++this.loading;
    this.missionId = missionId;
    this.items = new Map();
    this.changed.fire();
    if (missionId === undefined) {
      return;
    }
    let cursor = "";
    try {
      for (;;) {
        const page = await this.connection.request<ActivityPage>(Requests.activity, { id: missionId, cursor, limit: 500 });
        if (ticket !== this.loading) {
          return; // another mission was selected meanwhile
        }
        this.merge(page.items);
        cursor = page.cursor;
        if (!page.more) {
          return;
        }
      }
    } catch (err) {
      this.log.warn(`keel/activity for ${missionId} failed: ${String(err)}`);
    }
  }

  private merge(items: ActivityItem[]): void {
    if (items.length === 0) {
      return;
    }
    for (const item of items) {
      this.items.set(item.id, item);
    }
    this.changed.fire();
  }

  dispose(): void {
    this.subscriptions.forEach((d) => d.dispose());
    this.changed.dispose();
  }
}

export type ActivityNode =
  | { kind: "item"; item: ActivityItem }
  | { kind: "detail"; parent: string; label: string; text: string; icon?: string }
  | { kind: "file"; item: ActivityItem; file: ActivityFileChange };

const KIND_ICONS: Record<string, string> = {
  model: "sparkle", tool: "tools", verification: "beaker", question: "question", answer: "comment",
  failover: "arrow-swap", restart: "debug-restart", reexecuted: "refresh", unit: "symbol-event",
  state: "circle-outline", control: "person", note: "note", step: "debug-step-over", error: "error",
};

export class ActivityTreeProvider implements vscode.TreeDataProvider<ActivityNode>, vscode.Disposable {
  private readonly emitter = new vscode.EventEmitter<ActivityNode | undefined>();
  readonly onDidChangeTreeData = this.emitter.event;
  filter: ActivityFilter = { kinds: [], failuresOnly: false };
  private readonly subscription: vscode.Disposable;

  constructor(readonly feed: ActivityFeed) {
    this.subscription = feed.onDidChange(() => this.emitter.fire(undefined));
  }

  setFilter(filter: ActivityFilter): void {
    this.filter = filter;
    this.emitter.fire(undefined);
  }

  /** The rows shown now, in order. */
  visible(): ActivityItem[] {
    const f = this.filter;
    return this.feed.all.filter((i) => (f.unit === undefined || i.unit === f.unit)
      && (f.kinds.length === 0 || f.kinds.includes(i.kind)) && (!f.failuresOnly || i.failed === true));
  }

  getChildren(node?: ActivityNode): ActivityNode[] {
    if (node === undefined) {
      return this.visible().map((item) => ({ kind: "item", item }));
    }
    return node.kind === "item" ? details(node.item) : [];
  }

  getParent(node: ActivityNode): ActivityNode | undefined {
    if (node.kind === "item") {
      return undefined;
    }
    const id = node.kind === "file" ? node.item.id : node.parent;
    const item = this.feed.all.find((i) => i.id === id);
    return item === undefined ? undefined : { kind: "item", item };
  }

  getTreeItem(node: ActivityNode): vscode.TreeItem {
    if (node.kind === "file") {
      const item = new vscode.TreeItem(node.file.path, vscode.TreeItemCollapsibleState.None);
      item.id = `${node.item.id}:file:${node.file.path}`;
      item.description = fileStatus(node.file);
      item.iconPath = new vscode.ThemeIcon("diff");
      item.tooltip = node.file.diff;
      item.command = { command: "keel.activity.diff", title: "Open Diff", arguments: [node.item, node.file.path] };
      item.contextValue = "activityFile";
      return item;
    }
    if (node.kind === "detail") {
      const item = new vscode.TreeItem(node.label, vscode.TreeItemCollapsibleState.None);
      item.description = node.text;
      item.tooltip = new vscode.MarkdownString().appendCodeblock(node.text, "text");
      item.iconPath = node.icon === undefined ? undefined : new vscode.ThemeIcon(node.icon);
      return item;
    }
    const a = node.item;
    const hasDetails = details(a).length > 0;
    const item = new vscode.TreeItem(a.title, hasDetails
      ? vscode.TreeItemCollapsibleState.Collapsed : vscode.TreeItemCollapsibleState.None);
    item.id = `activity:${a.id}`;
    item.description = [a.unit, clock(a.at)].filter((s) => !!s).join(" · ");
    item.iconPath = a.failed ? new vscode.ThemeIcon("error", new vscode.ThemeColor("testing.iconFailed"))
      : new vscode.ThemeIcon(KIND_ICONS[a.kind] ?? "circle-small");
    item.tooltip = tooltip(a);
    item.contextValue = `activity.${a.kind}${a.failed ? ".failed" : ""}`;
    return item;
  }

  dispose(): void {
    this.subscription.dispose();
    this.emitter.dispose();
  }
}

function details(a: ActivityItem): ActivityNode[] {
  const rows: ActivityNode[] = [];
  const add = (label: string, text: string | undefined, icon?: string): void => {
    if (text !== undefined && text !== "") {
      rows.push({ kind: "detail", parent: a.id, label, text, icon });
    }
  };
  if (a.failed && a.text) {
    add("why", a.text.split("\n")[0], "error");
  }
  if (a.args) {
    add("arguments", JSON.stringify(a.args));
  }
  add("result", a.result);
  add("effect", a.effect);
  if (a.kind === "model") {
    const cost = a.cost === undefined || a.cost === null ? "" : `, cost ${a.cost}`;
    add("model", `${a.provider ?? ""}/${a.model ?? ""}`);
    add("tokens", `${a.tokensIn ?? 0} in + ${a.tokensOut ?? 0} out${cost} (${a.status ?? ""})`);
  }
  if (a.durationMs) {
    add("took", `${Math.round(a.durationMs)} ms`);
  }
  for (const file of a.files ?? []) {
    rows.push({ kind: "file", item: a, file });
  }
  const text = (a.text ?? "").split("\n").filter((line) => line.trim() !== "");
  for (const line of text.slice(a.failed ? 1 : 0, 40)) { // a failure's first line is its "why"
    rows.push({ kind: "detail", parent: a.id, label: line, text: "" });
  }
  return rows;
}

function fileStatus(f: ActivityFileChange): string {
  if (f.before === null || f.before === undefined) {
    return "created";
  }
  return f.after === null ? "deleted" : "modified";
}

function tooltip(a: ActivityItem): vscode.MarkdownString {
  const md = new vscode.MarkdownString();
  md.appendMarkdown(`**${a.kind}** ${a.unit ? `\`${a.unit}\` ` : ""}${new Date(a.at * 1000).toLocaleString()}\n\n`);
  md.appendText(a.title);
  if (a.text) {
    md.appendCodeblock(a.text.slice(0, 2000), "text");
  }
  return md;
}

function clock(at: number): string {
  return new Date(at * 1000).toLocaleTimeString();
}
