/**
 * The mission page: a webview in the editor area (one per mission) that shows the task graph, the
 * timeline, the totals, the live activity and the actions of one mission. Its script and style are
 * bundled files of the extension (no network; a strict Content-Security-Policy with a nonce). Data comes
 * from keel/mission, keel/restorePoints and keel/activity, and follows keel/missionChanged and
 * keel/activityChanged (no polling). The page's buttons run the same keel commands as the views.
 * Must not draw the tree views.
 */
import { randomBytes } from "node:crypto";
import * as vscode from "vscode";
import { activitySideUri } from "./activity";
import { commandRunner, pickMission } from "./commands";
import type { KeelConnection } from "./connection";
import type { MissionTreeNode } from "./missionsTree";
import type { MissionModel } from "./model";
import type { FromPage, ToPage } from "./page/main";
import { Throttle } from "./throttle";
import {
  missionLabel, Requests, tabTitle, type ActivityItem, type ActivityPage, type MissionDetail, type MissionSummary,
  type RestorePoint,
} from "./protocol";

const VIEW_TYPE = "keel.mission";
const PAGE_LIMIT = 2000;
const MAX_ITEMS = 20_000;
/** A page reads its mission again at most once per this long, or per twice its last read's time if that is
 * longer: a read of a 1,000-unit mission is ~200 KB, and a loaded machine must not spend itself on them. */
const DETAIL_GAP_MS = 100;

class MissionPage implements vscode.Disposable {
  private readonly subscriptions: vscode.Disposable[] = [];
  private pointsCount = -1;
  private points: RestorePoint[] = [];
  private ready = false;
  private refreshing: Promise<void> | undefined;
  private loadMs = 0;
  private readonly throttle = new Throttle(() => Math.max(DETAIL_GAP_MS, 2 * this.loadMs), () => {
    const began = Date.now();
    this.refreshing = this.load().catch((err) => this.log.error(`mission page ${this.id}: ${String(err)}`))
      .finally(() => {
        this.loadMs = Date.now() - began;
        this.refreshing = undefined;
      });
  }, () => this.refreshing !== undefined);

  constructor(readonly id: string, readonly panel: vscode.WebviewPanel, private readonly connection: KeelConnection,
              private readonly model: MissionModel, private readonly log: vscode.LogOutputChannel,
              onDispose: () => void) {
    this.subscriptions.push(
      panel.webview.onDidReceiveMessage((message: FromPage) => void this.receive(message)),
      model.onDidChange((m) => {
        if (m === undefined || m.id === this.id) {
          this.refresh();
        }
      }),
      connection.onDidChangeActivity((a) => {
        if (a.id === this.id && this.ready) {
          this.post({ type: "activity", items: a.items, reset: false });
        }
      }),
      panel.onDidDispose(() => {
        this.dispose();
        onDispose();
      }),
    );
  }

  /** Fetch the detail (and the restore points when their count moved) and post them: at most once per gap
   * (DETAIL_GAP_MS) and one at a time; changes that come meanwhile are folded into one more, of the newest. */
  refresh(): void {
    this.throttle.request();
  }

  private async load(): Promise<void> {
    if (!this.ready) {
      return;
    }
    const detail = await this.connection.request<MissionDetail>(Requests.mission, { id: this.id });
    const count = detail.mission.restorePoints ?? 0;
    if (count !== this.pointsCount) {
      this.points = await this.model.restorePoints(this.id);
      this.pointsCount = count;
    }
    this.retitle();
    const from = detail.mission.forkedFrom?.mission;
    const origin = from === undefined ? undefined : this.model.get(from);
    this.post({ type: "mission", detail, points: this.points, now: Date.now() / 1000,
      origin: origin === undefined ? undefined : missionLabel(origin) });
  }

  /** The tab says the mission's name; two missions of one name are told apart by when each started. */
  retitle(): void {
    const m = this.model.get(this.id);
    if (m !== undefined) {
      this.panel.title = tabTitle(m, this.model.list());
    }
  }

  private async loadActivity(): Promise<void> {
    let cursor: string | undefined;
    let reset = true;
    for (let read = 0; read < MAX_ITEMS; read += PAGE_LIMIT) {
      const page = await this.connection.request<ActivityPage>(Requests.activity,
        { id: this.id, limit: PAGE_LIMIT, ...(cursor ? { cursor } : {}) });
      this.post({ type: "activity", items: page.items, reset });
      reset = false;
      cursor = page.cursor;
      if (!page.more) {
        return;
      }
    }
  }

  private async receive(message: FromPage): Promise<void> {
    try {
      switch (message.type) {
        case "ready":
          this.ready = true;
          this.pointsCount = -1;
          await this.load();
          await this.loadActivity();
          return;
        case "command":
          if (!message.command.startsWith("keel.")) {
            return;
          }
          await vscode.commands.executeCommand(message.command, ...message.args);
          return;
        case "showOutput":
          await showOutput(this.id, message.unit, message.item);
          return;
        case "diffItem":
          await vscode.commands.executeCommand("vscode.diff",
            activitySideUri(this.id, message.item, message.path, "before"),
            activitySideUri(this.id, message.item, message.path, "after"),
            `${message.path} (${message.item.unit ?? ""} step ${message.item.seq ?? ""})`);
          return;
      }
    } catch (err) {
      this.log.error(`mission page ${this.id}: ${String(err)}`);
    }
  }

  private post(message: ToPage): void {
    void this.panel.webview.postMessage(message);
  }

  dispose(): void {
    this.throttle.dispose();
    this.subscriptions.forEach((d) => d.dispose());
    this.subscriptions.length = 0;
  }
}

/** The whole output of a unit's failed step, in a read-only editor tab. */
async function showOutput(mission: string, unit: string, item: ActivityItem): Promise<void> {
  const content = `${item.title}\n${unit} (mission ${mission}), ${new Date(item.at * 1000).toLocaleString()}\n\n${item.text ?? ""}`;
  const doc = await vscode.workspace.openTextDocument({ content, language: "log" });
  await vscode.window.showTextDocument(doc, { preview: true, viewColumn: vscode.ViewColumn.Beside });
}

/** The page's HTML: only the bundled script (with a nonce) and style may load; nothing from the network. */
function html(webview: vscode.Webview, extension: vscode.Uri): string {
  const nonce = randomBytes(16).toString("base64");
  const script = webview.asWebviewUri(vscode.Uri.joinPath(extension, "client-vscode", "out", "page.js"));
  const style = webview.asWebviewUri(vscode.Uri.joinPath(extension, "client-vscode", "media", "page.css"));
  const csp = [`default-src 'none'`, `style-src ${webview.cspSource}`, `img-src ${webview.cspSource}`,
    `font-src ${webview.cspSource}`, `script-src 'nonce-${nonce}'`].join("; ");
  return `<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="${csp}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="${style.toString()}">
<title>keel mission</title></head>
<body><main id="root"><p class="loading">Loading the mission…</p></main>
<script nonce="${nonce}" src="${script.toString()}"></script></body></html>`;
}

/** The page's options: scripts from the extension's bundle only; kept alive while its tab is hidden. */
function panelOptions(extension: vscode.Uri): vscode.WebviewPanelOptions & vscode.WebviewOptions {
  return {
    enableScripts: true, retainContextWhenHidden: true,
    localResourceRoots: [vscode.Uri.joinPath(extension, "client-vscode", "out"),
      vscode.Uri.joinPath(extension, "client-vscode", "media")],
  };
}

export function registerMissionPage(context: vscode.ExtensionContext, connection: KeelConnection,
                                    model: MissionModel, log: vscode.LogOutputChannel): vscode.Disposable[] {
  const pages = new Map<string, MissionPage>();
  const { run } = commandRunner(connection, model, log);
  /** A panel becomes mission `id`'s page: made here, or given back by VS Code after a reload. */
  const adopt = (id: string, panel: vscode.WebviewPanel): MissionPage => {
    panel.iconPath = vscode.Uri.joinPath(context.extensionUri, "client-vscode", "media", "keel.svg");
    panel.webview.options = panelOptions(context.extensionUri);
    const page = new MissionPage(id, panel, connection, model, log, () => {
      pages.delete(id);
      pages.forEach((p) => p.retitle());
    });
    pages.set(id, page);
    panel.webview.html = html(panel.webview, context.extensionUri);
    pages.forEach((p) => p.retitle());
    return page;
  };
  const open = async (target?: string | MissionTreeNode): Promise<string | undefined> => {
    const id = typeof target === "string" ? target : target?.kind === "mission" ? target.id
      : target?.kind === "unit" ? target.missionId
      : await pickMission(model.list(), "Open which mission?");
    if (id === undefined) {
      return undefined;
    }
    const existing = pages.get(id);
    if (existing !== undefined) {
      existing.panel.reveal(undefined, true);
      return id;
    }
    const m = model.get(id);
    const panel = vscode.window.createWebviewPanel(VIEW_TYPE, m ? tabTitle(m, model.list()) : id,
      { viewColumn: vscode.ViewColumn.Active, preserveFocus: true }, panelOptions(context.extensionUri));
    adopt(id, panel);
    model.select(id);
    return id;
  };
  // after a window reload or a restart, VS Code gives back every page that was open, with the state its
  // script saved (the mission's id)
  const serializer = vscode.window.registerWebviewPanelSerializer(VIEW_TYPE, {
    deserializeWebviewPanel: async (panel: vscode.WebviewPanel, state: unknown) => {
      const id = (state as { mission?: unknown } | undefined)?.mission;
      if (typeof id !== "string" || pages.has(id)) {
        panel.dispose();
        return;
      }
      panel.title = model.get(id) ? tabTitle(model.get(id) as MissionSummary, model.list()) : panel.title;
      adopt(id, panel);
    },
  });
  return [
    run("keel.openMission", open),
    serializer,
    model.onDidChange(() => pages.forEach((p) => p.retitle())),
    { dispose: () => pages.forEach((p) => p.panel.dispose()) },
  ];
}
