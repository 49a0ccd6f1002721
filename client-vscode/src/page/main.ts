/**
 * The mission page's script, run inside the webview (bundled by esbuild, no network, no inline code):
 * draws what the extension posts — the mission's detail, restore points and activity — as the header and
 * totals, the units to watch, the task graph, the timeline and the live activity list; every action goes
 * back to the extension as a keel command. Messages only record the newest state; the page draws once per
 * animation frame whatever number came, each part touching only what changed (so focus, a selection and
 * an answer being typed survive updates). Depends on the page's own modules and protocol.ts; must not
 * import `vscode`.
 */
import type { ActivityItem, MissionDetail, RestorePoint } from "../protocol";
import { ActivityList } from "./activityList";
import { AttentionView } from "./attention";
import { el } from "./dom";
import { GraphView } from "./graph";
import { HeaderView } from "./header";
import { TimelineView } from "./timeline";

export type ToPage =
  | { type: "mission"; detail: MissionDetail; points: RestorePoint[]; now: number; origin?: string }
  | { type: "activity"; items: ActivityItem[]; reset: boolean };

export type FromPage =
  | { type: "ready"; mission?: string }
  | { type: "command"; command: string; args: unknown[] }
  | { type: "diffItem"; item: ActivityItem; path: string }
  | { type: "showOutput"; unit: string; item: ActivityItem };

/** What the page measured, read by the UI tests: the first paint (from the first message to the drawn
 * page) and every update after it (its script and layout, in ms), with the state it drew. */
export interface PageTimings {
  paintMs: number | undefined;
  // parts: ms since the update began when the header, the cards, the graph, the timeline and the activity were done
  updates: { at: number; ms: number; done: number; total: number; updatedAt: number; parts: number[] }[];
}

declare function acquireVsCodeApi(): {
  postMessage(message: FromPage): void;
  getState(): { mission?: string } | undefined;
  setState(state: { mission: string }): void;
};

const vscode = acquireVsCodeApi();
const send = (message: FromPage): void => vscode.postMessage(message);
const command = (name: string, ...args: unknown[]): void => send({ type: "command", command: name, args });

let detail: MissionDetail | undefined;
let points: RestorePoint[] = [];
let origin: string | undefined;
let now = Date.now() / 1000;
const list: ActivityItem[] = [];
const byId = new Map<string, ActivityItem>();
const steps = new Map<string, string>();
const failures = new Map<string, ActivityItem>();
let version = 0;
let unitFilter: string | undefined;
let scheduled = false;
let lastDraw = 0;
const MIN_GAP_MS = 100;
let firstMessageAt: number | undefined;
const timings: PageTimings = { paintMs: undefined, updates: [] };
(window as unknown as { keelPage: PageTimings }).keelPage = timings;

const choose = (unit: string): void => {
  unitFilter = unitFilter === unit ? undefined : unit;
  activity.reset();
  schedule();
};
const header = new HeaderView({ command });
const attention = new AttentionView({
  choose, command, showOutput: (unit, item) => send({ type: "showOutput", unit, item }),
});
const graph = new GraphView(choose);
const timeline = new TimelineView({ command, diffItem: (item, path) => send({ type: "diffItem", item, path }),
  wake: () => schedule() });
const activity = new ActivityList(() => {
  unitFilter = undefined;
  activity.reset();
  schedule();
});
activity.onEarlier = schedule;

/** Take one activity item in time order; remember each unit's newest step and newest failed output. */
function ingest(item: ActivityItem): void {
  const old = byId.get(item.id);
  byId.set(item.id, item);
  if (old !== undefined) {
    list[list.indexOf(old)] = item;
  } else if (list.length === 0 || (list[list.length - 1] as ActivityItem).at <= item.at) {
    list.push(item);
  } else {
    let lo = 0, hi = list.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if ((list[mid] as ActivityItem).at <= item.at) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    list.splice(lo, 0, item);
  }
  const unit = item.unit;
  if (unit && item.kind !== "state" && (list[list.length - 1] === item || !steps.has(unit))) {
    steps.set(unit, item.title);
  }
  // the output of a failed step (a verification, a tool call), not the unit's own failure line
  if (unit && item.failed === true && item.kind !== "unit" && item.kind !== "state" && (item.text ?? "").trim() !== "") {
    failures.set(unit, item);
  }
}

/** One draw for everything that came: at the next frame, and at most one per MIN_GAP_MS while a running
 * mission sends many changes a second (the newest state is drawn; nothing waits longer than that). */
function schedule(): void {
  if (!scheduled) {
    scheduled = true;
    const wait = lastDraw + MIN_GAP_MS - performance.now();
    if (wait > 0) {
      setTimeout(() => requestAnimationFrame(draw), wait);
    } else {
      requestAnimationFrame(draw);
    }
  }
}

function draw(): void {
  scheduled = false;
  lastDraw = performance.now();
  const d = detail;
  if (d === undefined) {
    return;
  }
  const started = performance.now();
  activity.measure();
  const root = document.getElementById("root") as HTMLElement;
  if (!root.classList.contains("drawn")) {
    root.classList.add("drawn");
    const side = el("div", "side");
    const main = el("div", "main");
    main.append(attention.section, graph.section, timeline.section);
    side.append(activity.section);
    root.replaceChildren(header.section, main, side);
  }
  const m = d.mission;
  const parts: number[] = [];
  const mark = (): void => void parts.push(Math.round((performance.now() - started) * 10) / 10);
  header.update(d, list, now, origin);
  mark();
  attention.update({ mission: m, units: d.units, steps, failures });
  mark();
  graph.update({ units: d.units, asking: m.state === "waiting_input" ? m.question?.unit : undefined, steps,
    chosen: unitFilter });
  mark();
  timeline.update(d, list, points, now, width, version);
  mark();
  activity.update(list, unitFilter);
  mark();
  document.body.dataset.state = m.state;
  // the layout this frame needs anyway, done here so that the update's cost includes it
  void document.body.offsetHeight;
  const ms = performance.now() - started;
  if (timings.paintMs === undefined) {
    timings.paintMs = performance.now() - (firstMessageAt ?? started);
  }
  timings.updates.push({ at: Date.now(), ms, done: m.units.done, total: m.units.total, updatedAt: m.updatedAt, parts });
  if (timings.updates.length > 5000) {
    timings.updates.splice(0, 1000);
  }
}

window.addEventListener("message", (event: MessageEvent<ToPage>) => {
  const message = event.data;
  firstMessageAt ??= performance.now();
  if (message.type === "mission") {
    detail = message.detail;
    points = message.points;
    now = message.now;
    origin = message.origin;
    vscode.setState({ mission: detail.mission.id });
  } else {
    if (message.reset) {
      list.length = 0;
      byId.clear();
      steps.clear();
      failures.clear();
    }
    message.items.forEach(ingest);
    version += 1;
  }
  schedule();
});
// the timeline's width, known without asking for a layout in the middle of an update
let width = document.body.clientWidth - 40;
new ResizeObserver((entries) => {
  const seen = Math.round(entries[0]?.contentRect.width ?? width);
  if (seen > 0 && seen !== width) {
    width = seen;
    graph.resized();
    schedule();
  }
}).observe(timeline.section);
send({ type: "ready", mission: vscode.getState()?.mission });
