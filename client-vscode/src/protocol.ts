/**
 * The keel LSP contract as the extension sees it (docs/lsp.md): method and command names, payload types.
 *
 * This is the one module that knows the wire shapes; the views read these types and nothing else.
 * It must not import `vscode` or the language client, so tests and views can share it.
 */

export type MissionState =
  | "created" | "running" | "pausing" | "paused" | "waiting_input"
  | "offline" | "completed" | "failed" | "cancelled";

export type UnitState = "pending" | "ready" | "running" | "succeeded" | "failed" | "resumable";

export interface Question {
  unit: string;
  seq: number;
  text: string;
  choices?: string[];
  kind?: string;
}

export interface UnitCounts {
  total: number;
  done: number;
  running: number;
  failed: number;
  pending: number;
}

export interface MissionSummary {
  id: string;
  name: string;
  state: MissionState;
  pauseReason?: string;
  question?: Question;
  error?: string;
  units: UnitCounts;
  percentage: number;
  currentUnit?: string;
  currentUnitTitle?: string;
  stranded?: boolean;
  missionFile?: string;
  workspace?: string;
  restorePoints?: number;
  createdAt: number;
  updatedAt: number;
  /** The host the record names, and whether it is alive. */
  host?: MissionHost;
  /** The digest of the newest checkpoint. */
  head?: string;
  /** The mission and point this one was forked from. */
  forkedFrom?: ForkOrigin;
  /** Why a paused mission is paused when no person paused it: "restored to p3", "forked at p2". */
  pauseNote?: string;
  usage?: MissionUsage;
}

export interface MissionHost {
  hostId: string;
  pid: number;
  hostname: string;
  alive: boolean;
}

export interface ForkOrigin {
  mission: string;
  point: string;
}

/** Tokens the mission's model calls used, their cost where a price is configured, the model that
 * served the newest call and how many failovers happened. */
export interface MissionUsage {
  calls: number;
  promptTokens: number;
  completionTokens: number;
  servedModel?: string;
  failovers?: number;
  cost?: number;
  /** The currency of `cost` ([providers.cost] currency, "USD" when not given). */
  currency?: string;
}

export interface UnitInfo {
  id: string;
  title: string;
  state: UnitState;
  after: string[];
  attempts: number;
  error: string;
}

export interface MissionDetail {
  mission: MissionSummary;
  goal: string;
  units: UnitInfo[];
  /** The newest 50 events. */
  events: MissionEvent[];
}

export interface MissionEvent {
  seq: number;
  kind: string;
  at: number;
  unit: string;
  state: string;
  message: string;
}

/** `keel/subagents`: one unit's lease in the subagent registry. */
export interface Subagent {
  unit: string;
  lane: string;
  state: "offered" | "running" | "expired" | "returned" | "orphaned" | "done";
  epoch: number;
  pid: number;
  hostId: string;
  hostname: string;
  heartbeat: number;
  leaseAge: number;
  ttl: number;
  sandbox: string;
  branch: string;
  lastCheckpoint: number;
  merged: boolean;
  worker: string;
  why: string;
}

export interface RestorePoint {
  id: string;
  missionId: string;
  checkpoint: string;
  reason: string;
  createdAt: number;
  label: string;
}

/** `keel/pointChanges`: a file that differs between two points (or a point and the sandbox). */
export interface FileChange {
  path: string;
  status: "added" | "removed" | "modified" | "mode";
}

/** `keel/pointFile`: one file of a restore point's snapshot, or of the sandbox (point "sandbox"). */
export interface PointFile {
  missionId: string;
  point: string;
  path: string;
  exists: boolean;
  binary: boolean;
  text: string;
}

/** `keel.apply`: the files a mission's result changed in the working tree, or the branch it made. */
export interface ApplyResult {
  mission: string;
  target: string;
  added: string[];
  modified: string[];
  removed: string[];
  branch: string;
  commit: string;
}

export interface VerifyResult {
  ok: boolean;
  records: number;
  problems: { db: string; key: string; message: string }[];
}

/** One endpoint of one model provider (`keel/providers`, `keel/providersChanged`; docs/lsp.md). */
export interface ProviderEndpoint {
  provider: string;
  endpoint: string;
  url: string;
  model: string;
  state: "healthy" | "degraded" | "cooling_down" | "down";
  active: boolean;
  configured: boolean;
  kind: string;
  keySource: string;
  consecutiveFailures: number;
  lastError: string;
  lastErrorKind: string;
  lastErrorAt: number;
  lastSuccessAt: number;
  cooldownUntil: number;
  lastFailover: string;
  lastFailoverAt: number;
  updatedAt: number;
  /** A host has called the endpoint at least once; before that its health is not known. */
  called?: boolean;
}

export interface ProvidersPayload {
  endpoints: ProviderEndpoint[];
  sources?: string[];
  configError?: string;
}

/** One file an activity item changed: content digests (null: no file) and its unified diff. */
export interface ActivityFileChange {
  path: string;
  before?: string | null;
  after?: string | null;
  diff?: string;
}

/** One step of a mission's activity (`keel/activity`, `keel/activityChanged`; docs/lsp.md). */
export interface ActivityItem {
  id: string;
  kind: string;
  at: number;
  title: string;
  unit?: string;
  lane?: string;
  seq?: number;
  status?: string;
  failed?: boolean;
  durationMs?: number;
  model?: string;
  provider?: string;
  tokensIn?: number;
  tokensOut?: number;
  cost?: number | null;
  tool?: string;
  args?: Record<string, unknown> | null;
  effect?: string;
  result?: string;
  files?: ActivityFileChange[];
  text?: string;
  /** A unit started again (kind "restart"): the recorded steps it kept from the journal. */
  kept?: number;
}

export interface ActivityPage {
  mission: string;
  state: MissionState;
  items: ActivityItem[];
  cursor: string;
  more: boolean;
}

/** `keel/activityChanged`: what one mission recorded since the last notification. */
export interface ActivityChanged {
  id: string;
  state: MissionState;
  items: ActivityItem[];
  cursor: string;
}

/** `keel/activityFile`: both sides of a file change (rebuilt from the diff when `complete` is false). */
export interface ActivityFile {
  path: string;
  before: string;
  after: string;
  complete: boolean;
  existedBefore: boolean;
  existsAfter: boolean;
}

export const ACTIVITY_KINDS = ["model", "tool", "verification", "question", "answer", "failover", "restart",
  "reexecuted", "unit", "state", "control", "note", "step", "error"] as const;

export const Requests = {
  missions: "keel/missions",
  mission: "keel/mission",
  restorePoints: "keel/restorePoints",
  pointChanges: "keel/pointChanges",
  pointFile: "keel/pointFile",
  providers: "keel/providers",
  activity: "keel/activity",
  activityFile: "keel/activityFile",
  starter: "keel/starter",
} as const;

/** The point name of a mission's sandbox as it is now, in `keel/pointChanges` and `keel/pointFile`. */
export const SANDBOX = "sandbox";

export const Notifications = {
  missionChanged: "keel/missionChanged",
  providersChanged: "keel/providersChanged",
  activityChanged: "keel/activityChanged",
} as const;

/** Commands the server executes (`workspace/executeCommand`); the palette commands carry the same ids. */
export const ServerCommands = {
  startMission: "keel.startMission",
  pause: "keel.pause",
  resume: "keel.resume",
  pauseAll: "keel.pauseAll",
  answer: "keel.answer",
  restore: "keel.restore",
  verifyStore: "keel.verifyStore",
  fork: "keel.fork",
  apply: "keel.apply",
  export: "keel.export",
  import: "keel.import",
  cancel: "keel.cancel",
  delete: "keel.delete",
} as const;

const PAUSABLE: ReadonlySet<MissionState> = new Set(["running", "pausing", "offline", "created"]);
const RESUMABLE: ReadonlySet<MissionState> = new Set(["paused", "offline", "failed"]);
const ACTIVE: ReadonlySet<MissionState> = new Set(["running", "pausing", "waiting_input", "paused", "offline", "created"]);

export function canPause(m: MissionSummary): boolean {
  return PAUSABLE.has(m.state);
}

export function canResume(m: MissionSummary): boolean {
  return RESUMABLE.has(m.state);
}

export function isActive(m: MissionSummary): boolean {
  return ACTIVE.has(m.state);
}

const FINISHED: ReadonlySet<MissionState> = new Set(["completed", "failed", "cancelled"]);

export function isFinished(m: MissionSummary): boolean {
  return FINISHED.has(m.state);
}

/** "write-docs", or "write-docs (fork of p3)" for a fork: how a mission is named everywhere. */
export function missionLabel(m: MissionSummary): string {
  return m.forkedFrom ? `${m.name} (fork of ${m.forkedFrom.point})` : m.name;
}

/** "12.3k tokens · 0.0421": tokens and, when a price is configured, the cost. */
export function usageText(m: MissionSummary): string {
  const u = m.usage;
  if (u === undefined || u.calls === 0) {
    return "";
  }
  const tokens = u.promptTokens + u.completionTokens;
  const short = tokens >= 10_000 ? `${(tokens / 1000).toFixed(0)}k` : tokens >= 1000 ? `${(tokens / 1000).toFixed(1)}k`
    : String(tokens);
  return `${short} tokens${u.cost !== undefined ? ` · cost ${costText(u)}` : ""}`;
}

/** "0.0421 USD": a cost with its currency. */
export function costText(u: MissionUsage): string {
  if (u.cost === undefined) {
    return "";
  }
  return `${u.cost.toFixed(u.cost < 1 ? 4 : 2)}${u.currency ? ` ${u.currency}` : ""}`;
}

/** "2/5" with the current unit when one runs: the short progress text of the tree and status bar. */
export function progressText(m: MissionSummary): string {
  const counts = m.units.total > 0 ? `${m.units.done}/${m.units.total}` : "";
  const unit = m.currentUnit ? `${m.currentUnit}${m.currentUnitTitle ? ` ${m.currentUnitTitle}` : ""}` : "";
  return [counts, unit].filter((s) => s !== "").join(" · ");
}

/** A mission page's tab: its name, and when another mission has the same name, when it started
 * ("build · started 14:02:11", or "build · started Dec 5, 14:02" on another day), so tabs differ. */
export function tabTitle(m: MissionSummary, all: readonly MissionSummary[]): string {
  const label = missionLabel(m);
  if (!all.some((o) => o.id !== m.id && missionLabel(o) === label)) {
    return label;
  }
  const started = new Date(m.createdAt * 1000);
  const today = started.toDateString() === new Date().toDateString();
  const when = today
    ? started.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false })
    : started.toLocaleString([], { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", hour12: false });
  return `${label} · started ${when}`;
}
