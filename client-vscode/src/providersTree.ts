/**
 * The Providers view: every model provider endpoint with its health (icon), URL, model, whether it served
 * the last call (active), cooldown, last error and last failover — from `keel/providers`, refreshed by
 * `keel/providersChanged` and when the server (re)starts. Must not send commands.
 */
import * as vscode from "vscode";
import { ConnectionState, type KeelConnection } from "./connection";
import { Requests, type ProviderEndpoint, type ProvidersPayload } from "./protocol";

export interface ProviderNode {
  readonly kind: "endpoint" | "problem";
  readonly endpoint?: ProviderEndpoint;
  readonly text?: string;
}

const HEALTH_ICONS: Record<ProviderEndpoint["state"], [string, string]> = {
  healthy: ["pass", "testing.iconPassed"],
  degraded: ["warning", "charts.yellow"],
  cooling_down: ["watch", "charts.orange"],
  down: ["error", "testing.iconFailed"],
};

export class ProvidersTreeProvider implements vscode.TreeDataProvider<ProviderNode>, vscode.Disposable {
  private readonly emitter = new vscode.EventEmitter<ProviderNode | undefined>();
  private readonly subscriptions: vscode.Disposable[];
  private payload: ProvidersPayload | undefined;
  private readonly timer: ReturnType<typeof setInterval>;
  readonly onDidChangeTreeData = this.emitter.event;

  constructor(private readonly connection: KeelConnection, private readonly log: vscode.LogOutputChannel) {
    this.subscriptions = [
      connection.onDidChangeProviders((p) => this.show(p)),
      connection.onDidChangeState((state) => {
        if (state === ConnectionState.Running) {
          void this.reload();
        }
      }),
    ];
    // "cooling 42s" counts down: redraw every second while an endpoint cools down
    this.timer = setInterval(() => {
      if (this.endpoints.some((e) => e.cooldownUntil > Date.now() / 1000 - 1)) {
        this.emitter.fire(undefined);
      }
    }, 1000);
  }

  /** The endpoints as last received (for the tests and the status bar). */
  get endpoints(): ProviderEndpoint[] {
    return this.payload?.endpoints ?? [];
  }

  async reload(): Promise<void> {
    try {
      this.show(await this.connection.request<ProvidersPayload>(Requests.providers));
    } catch (err) {
      this.log.warn(`keel/providers failed: ${String(err)}`);
    }
  }

  getChildren(element?: ProviderNode): ProviderNode[] {
    if (element !== undefined || this.payload === undefined) {
      return [];
    }
    const nodes: ProviderNode[] = this.payload.endpoints.map((endpoint) => ({ kind: "endpoint", endpoint }));
    if (this.payload.configError) {
      nodes.unshift({ kind: "problem", text: this.payload.configError });
    }
    return nodes;
  }

  getTreeItem(node: ProviderNode): vscode.TreeItem {
    if (node.kind === "problem" || node.endpoint === undefined) {
      const item = new vscode.TreeItem("configuration error", vscode.TreeItemCollapsibleState.None);
      item.description = node.text;
      item.tooltip = node.text;
      item.iconPath = new vscode.ThemeIcon("error", new vscode.ThemeColor("testing.iconFailed"));
      return item;
    }
    const e = node.endpoint;
    const item = new vscode.TreeItem(`${e.provider}/${e.endpoint}`, vscode.TreeItemCollapsibleState.None);
    item.id = `provider:${e.provider}/${e.endpoint}`;
    item.description = endpointDescription(e, Date.now() / 1000);
    const [name, color] = e.called === false ? ["circle-outline", undefined]
      : unreachable(e) ? ["debug-disconnect", "testing.iconFailed"] : HEALTH_ICONS[e.state] ?? ["circle-outline", undefined];
    item.iconPath = new vscode.ThemeIcon(name, color === undefined ? undefined : new vscode.ThemeColor(color));
    item.contextValue = e.active ? "providerEndpoint.active" : "providerEndpoint";
    item.tooltip = endpointTooltip(e);
    item.accessibilityInformation = { label: `endpoint ${e.provider}/${e.endpoint}, ${item.description}` };
    return item;
  }

  dispose(): void {
    clearInterval(this.timer);
    this.subscriptions.forEach((d) => d.dispose());
    this.emitter.dispose();
  }

  private show(payload: ProvidersPayload): void {
    this.payload = payload;
    this.emitter.fire(undefined);
  }
}

/** `● active · b-model · healthy · cooling 42s · 401 …`: what a row says after its name. */
export function endpointDescription(e: ProviderEndpoint, now: number): string {
  const parts = [e.active ? "● active" : "", e.model, healthText(e, now)];
  if (e.cooldownUntil > now) {
    parts.push(`cooling ${Math.ceil(e.cooldownUntil - now)}s`);
  }
  if (e.lastFailover) {
    parts.push(`failover ${e.lastFailover}`);
  }
  if (e.lastError && e.state !== "healthy" && !unreachable(e)) {
    parts.push(e.lastError);
  }
  return parts.filter((p) => p !== "").join(" · ");
}

/** A connection-level failure (nothing answered at that address), as the last word on an endpoint. */
function unreachable(e: ProviderEndpoint): boolean {
  return e.called !== false && e.state !== "healthy" && /^(connection|timeout|dns)$/.test(e.lastErrorKind);
}

/** "not used yet" before any call: keel knows nothing of its health then (even a dead endpoint). */
function healthText(e: ProviderEndpoint, now: number): string {
  if (e.called === false) {
    return "not used yet";
  }
  if (unreachable(e)) {
    return "unreachable";
  }
  return e.state === "cooling_down" && e.cooldownUntil <= now ? "cooled down" : e.state.replace("_", " ");
}

function endpointTooltip(e: ProviderEndpoint): string {
  const lines = [`${e.provider}/${e.endpoint} (${e.kind || "not configured"})`, `url: ${e.url}`, `model: ${e.model}`,
    `health: ${healthText(e, Date.now() / 1000)}${e.active ? ", served the last call" : ""}`];
  lines.push(e.keySource ? `key: ${e.keySource}` : "key: none configured");
  if (e.lastError) {
    lines.push(`last error (${e.lastErrorKind}): ${e.lastError}`);
  }
  if (e.lastFailover) {
    lines.push(`last failover: ${e.lastFailover} at ${new Date(e.lastFailoverAt * 1000).toLocaleString()}`);
  }
  return lines.join("\n");
}
