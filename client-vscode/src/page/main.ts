/**
 * The mission page's script, run inside the webview (bundled by esbuild, no network, no inline code):
 * draws what the extension posts — the mission's detail, restore points and activity — as the task graph,
 * the timeline, the totals, the live activity list and the actions; every action goes back to the
 * extension as a keel command. Depends on picture.ts and protocol.ts only; must not import `vscode`.
 */
import type { ActivityItem, MissionDetail, RestorePoint } from "../protocol";
import { costText, missionLabel } from "../protocol";
import {
  currentStep, duration, LANES, layoutGraph, NODE_H, NODE_W, resumptions, timelineMarks, timeSpan, UNIT_LOOK,
  type Mark,
} from "./picture";

export type ToPage =
  | { type: "mission"; detail: MissionDetail; points: RestorePoint[]; now: number }
  | { type: "activity"; items: ActivityItem[]; reset: boolean };

export type FromPage =
  | { type: "ready" }
  | { type: "command"; command: string; args: unknown[] }
  | { type: "diffItem"; item: ActivityItem; path: string };

declare function acquireVsCodeApi(): { postMessage(message: FromPage): void };

const vscode = acquireVsCodeApi();
const SVG = "http://www.w3.org/2000/svg";
let detail: MissionDetail | undefined;
let points: RestorePoint[] = [];
const items = new Map<string, ActivityItem>();
let unitFilter: string | undefined;
let selected: string | undefined;
let following = true;
let now = Date.now() / 1000;

function el<K extends keyof HTMLElementTagNameMap>(tag: K, cls?: string, text?: string): HTMLElementTagNameMap[K] {
  const e = document.createElement(tag);
  if (cls) {
    e.className = cls;
  }
  if (text !== undefined) {
    e.textContent = text;
  }
  return e;
}

function svg(tag: string, attrs: Record<string, string | number>, parent?: Element): SVGElement {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) {
    e.setAttribute(k, String(v));
  }
  parent?.appendChild(e);
  return e;
}

function button(label: string, onClick: () => void, primary = false, title?: string): HTMLButtonElement {
  const b = el("button", primary ? "primary" : "secondary", label);
  b.addEventListener("click", onClick);
  if (title) {
    b.title = title;
  }
  return b;
}

function command(name: string, ...args: unknown[]): void {
  vscode.postMessage({ type: "command", command: name, args });
}

function sorted(): ActivityItem[] {
  return [...items.values()].sort((a, b) => a.at - b.at);
}

function clock(at: number): string {
  return new Date(at * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit",
    hour12: false });
}

function color(variable: string): string {
  return `var(${variable})`;
}

// -- header, reason, question, actions ------------------------------------------------------------
function header(d: MissionDetail): HTMLElement {
  const m = d.mission;
  const box = el("header");
  const title = el("h1", undefined, missionLabel(m));
  const state = el("span", `badge state-${m.state}`, m.state.replace("_", " "));
  title.appendChild(state);
  box.appendChild(title);
  if (d.goal) {
    box.appendChild(el("p", "goal", d.goal));
  }
  const stopped = m.state === "paused" || m.state === "offline";
  if (stopped && m.pauseReason === "policy") {
    // paused for policy: the reason stays on the page, with the file that fixes it
    const why = el("div", "reason");
    why.appendChild(el("p", undefined, `Paused for policy: ${m.error ?? "no model may serve this mission"}`));
    const row = el("div", "actions");
    row.appendChild(button("Open .keel/config.toml", () => command("keel.openConfig"), true));
    row.appendChild(button("Resume", () => command("keel.resume", m.id)));
    why.appendChild(row);
    box.appendChild(why);
  } else {
    const note = stopped ? m.pauseNote ?? (m.pauseReason ? `paused (${m.pauseReason})` : undefined) : undefined;
    for (const text of [note, m.error].filter((s): s is string => !!s)) {
      box.appendChild(el("p", m.error === text ? "reason error" : "reason", text));
    }
  }
  if (m.question) {
    const q = el("div", "question");
    q.appendChild(el("span", "question-label", `${m.question.unit} asks:`));
    q.appendChild(el("p", "question-text", m.question.text));
    const row = el("div", "actions");
    for (const choice of m.question.choices ?? []) {
      row.appendChild(button(choice, () => command("keel.answer", m.id, choice), true));
    }
    row.appendChild(button((m.question.choices ?? []).length ? "Other answer…" : "Answer…",
      () => command("keel.answer", m.id), (m.question.choices ?? []).length === 0));
    q.appendChild(row);
    box.appendChild(q);
  }
  box.appendChild(actions(d));
  return box;
}

function actions(d: MissionDetail): HTMLElement {
  const m = d.mission;
  const row = el("div", "actions");
  if (["running", "pausing", "offline", "created"].includes(m.state)) {
    row.appendChild(button("Pause", () => command("keel.pause", m.id), true));
  }
  if (["paused", "offline", "failed"].includes(m.state)) {
    row.appendChild(button("Resume", () => command("keel.resume", m.id), true));
  }
  if (m.state === "waiting_input") {
    row.appendChild(button("Answer…", () => command("keel.answer", m.id)));
  }
  row.appendChild(button("Restore…", () => command("keel.restore", m.id)));
  row.appendChild(button("Fork…", () => command("keel.fork", m.id)));
  row.appendChild(button("Review Changes", () => command("keel.reviewChanges", m.id)));
  row.appendChild(button("Apply…", () => command("keel.apply", m.id)));
  return row;
}

// -- totals --------------------------------------------------------------------------------------
function totals(d: MissionDetail, list: ActivityItem[]): HTMLElement {
  const m = d.mission;
  const u = m.usage;
  const live = ["running", "pausing", "offline", "waiting_input"].includes(m.state);
  const cells: [string, string][] = [
    ["units", `${m.units.done}/${m.units.total} done`],
    ["tokens", u ? `${(u.promptTokens + u.completionTokens).toLocaleString()} (${u.promptTokens.toLocaleString()} in, ${u.completionTokens.toLocaleString()} out)` : "0"],
    ["cost", u?.cost !== undefined ? costText(u) : u && u.calls > 0 ? "no price configured" : "none yet"],
    ["model calls", String(u?.calls ?? 0)],
    ["served by", u?.servedModel ? `${u.servedModel}${u.failovers ? ` (after ${u.failovers} failover${u.failovers > 1 ? "s" : ""})` : ""}` : "—"],
    ["wall time", duration((live ? now : m.updatedAt) - m.createdAt)],
  ];
  const kept = resumptions(list);
  cells.push(["work kept", kept.length === 0 ? "no resume yet"
    : kept.map((r) => `${r.unit}: ${r.kept} kept, ${r.ranAfter} run after`).join("; ")]);
  const grid = el("section", "totals");
  grid.setAttribute("aria-label", "totals");
  for (const [k, v] of cells) {
    const cell = el("div", "total");
    cell.appendChild(el("span", "total-key", k));
    cell.appendChild(el("span", "total-value", v));
    grid.appendChild(cell);
  }
  return grid;
}

// -- the task graph ------------------------------------------------------------------------------
function graph(d: MissionDetail, list: ActivityItem[]): HTMLElement {
  const section = el("section", "graph");
  section.appendChild(el("h2", undefined, "Task graph"));
  const layout = layoutGraph(d.units);
  const pad = 8;
  const root = svg("svg", { width: layout.width + 2 * pad, height: layout.height + 2 * pad, role: "img",
    "aria-label": "task graph" });
  const g = svg("g", { transform: `translate(${pad},${pad})` }, root);
  for (const { from, to } of layout.edges) {
    const x1 = from.x + NODE_W, y1 = from.y + NODE_H / 2, x2 = to.x, y2 = to.y + NODE_H / 2;
    const mid = (x1 + x2) / 2;
    svg("path", { d: `M${x1},${y1} C${mid},${y1} ${mid},${y2} ${x2 - 6},${y2}`, class: "edge" }, g);
    svg("path", { d: `M${x2 - 7},${y2 - 4} L${x2},${y2} L${x2 - 7},${y2 + 4} Z`, class: "arrow" }, g);
  }
  const asking = d.mission.question?.unit;
  for (const node of layout.nodes) {
    const u = node.unit;
    const look = UNIT_LOOK[u.id === asking && d.mission.state === "waiting_input" ? "asking" : u.state];
    const group = svg("g", { transform: `translate(${node.x},${node.y})`, class: `node unit-${u.state}`,
      tabindex: 0, role: "button", "data-unit": u.id,
      "aria-label": `unit ${u.id} ${u.title}: ${look.word}` }, g);
    const rect = svg("rect", { width: NODE_W, height: NODE_H, rx: 6, class: "node-box" }, group);
    rect.style.stroke = color(look.color);
    if (unitFilter === u.id) {
      rect.classList.add("chosen");
    }
    const icon = svg("text", { x: 12, y: 24, class: "node-icon" }, group);
    icon.textContent = look.icon;
    icon.style.fill = color(look.color);
    const name = svg("text", { x: 32, y: 24, class: "node-title" }, group);
    name.textContent = clip(`${u.id} ${u.title}`, 24);
    const step = u.state === "running" ? currentStep(list, u.id) : undefined;
    const sub = svg("text", { x: 12, y: 46, class: "node-sub" }, group);
    sub.textContent = clip(step ? `now: ${step}` : `${look.word}${u.error ? `: ${u.error}` : ""}`, 30);
    const tip = svg("title", {}, group);
    tip.textContent = `${u.id} ${u.title}\n${look.word}${step ? `\nnow: ${step}` : ""}${u.error ? `\n${u.error}` : ""}` +
      `\nclick: show its activity`;
    const choose = (): void => {
      unitFilter = unitFilter === u.id ? undefined : u.id;
      following = true;
      render();
    };
    group.addEventListener("click", choose);
    group.addEventListener("keydown", (e) => {
      if ((e as KeyboardEvent).key === "Enter" || (e as KeyboardEvent).key === " ") {
        choose();
      }
    });
  }
  const scroller = el("div", "graph-scroll");
  scroller.appendChild(root);
  section.appendChild(scroller);
  return section;
}

function clip(text: string, n: number): string {
  return text.length > n ? `${text.slice(0, n - 1)}…` : text;
}

// -- the timeline --------------------------------------------------------------------------------
const LANE_H = 22;
const LABEL_W = 150;

function timeline(d: MissionDetail, list: ActivityItem[]): HTMLElement {
  const section = el("section", "timeline");
  section.appendChild(el("h2", undefined, "Timeline"));
  const marks = timelineMarks(list, points);
  const [start, end] = timeSpan(d, marks, now);
  const width = Math.max(480, Math.min(1400, document.body.clientWidth - 40));
  const plot = width - LABEL_W - 16;
  const x = (at: number): number => LABEL_W + ((at - start) / (end - start)) * plot;
  const root = svg("svg", { width, height: LANES.length * LANE_H + 24, role: "img", "aria-label": "timeline" });
  LANES.forEach(({ lane, label }, i) => {
    const y = i * LANE_H + LANE_H / 2;
    const text = svg("text", { x: 0, y: y + 4, class: "lane-label" }, root);
    text.textContent = label;
    svg("line", { x1: LABEL_W, x2: LABEL_W + plot, y1: y, y2: y, class: `lane lane-${lane}` }, root);
  });
  const axisY = LANES.length * LANE_H + 14;
  for (const [at, anchor] of [[start, "start"], [end, "end"]] as const) {
    const t = svg("text", { x: x(at), y: axisY, class: "axis", "text-anchor": anchor }, root);
    t.textContent = clock(at);
  }
  for (const mark of marks) {
    const row = LANES.findIndex((l) => l.lane === mark.lane);
    const cx = x(mark.at), cy = row * LANE_H + LANE_H / 2;
    const shape = markShape(mark, cx, cy, root);
    shape.setAttribute("data-mark", mark.key);
    shape.setAttribute("tabindex", "0");
    shape.setAttribute("role", "button");
    shape.setAttribute("aria-label", mark.label);
    if (mark.key === selected) {
      shape.classList.add("chosen");
    }
    const tip = svg("title", {}, shape);
    tip.textContent = `${clock(mark.at)} ${mark.label}`;
    shape.addEventListener("click", () => {
      selected = selected === mark.key ? undefined : mark.key;
      render();
    });
  }
  const scroller = el("div", "timeline-scroll");
  scroller.appendChild(root);
  section.appendChild(scroller);
  const chosen = marks.find((k) => k.key === selected);
  if (chosen !== undefined) {
    section.appendChild(markDetail(d, chosen));
  }
  return section;
}

/** A failover is a "switched" mark (two arrows), never an error mark; failed steps are red crosses. */
function markShape(mark: Mark, cx: number, cy: number, parent: Element): SVGElement {
  const g = svg("g", { class: `mark mark-${mark.lane}${mark.failed ? " failed" : ""}` }, parent);
  if (mark.lane === "switches") {
    svg("path", { d: `M${cx - 6},${cy - 3} h10 l-3,-3 M${cx + 6},${cy + 3} h-10 l3,3`, class: "switch" }, g);
    svg("circle", { cx, cy, r: 8, class: "hit" }, g);
  } else if (mark.lane === "points") {
    svg("path", { d: `M${cx},${cy - 7} L${cx + 6},${cy} L${cx},${cy + 7} L${cx - 6},${cy} Z` }, g);
  } else if (mark.failed) {
    svg("path", { d: `M${cx - 4},${cy - 4} L${cx + 4},${cy + 4} M${cx + 4},${cy - 4} L${cx - 4},${cy + 4}`, class: "cross" }, g);
    svg("circle", { cx, cy, r: 7, class: "hit" }, g);
  } else {
    svg("circle", { cx, cy, r: mark.lane === "model" ? 5 : 4 }, g);
  }
  return g;
}

function markDetail(d: MissionDetail, mark: Mark): HTMLElement {
  const box = el("div", "mark-detail");
  box.appendChild(el("p", undefined, `${clock(mark.at)} · ${mark.label}`));
  const row = el("div", "actions");
  const id = d.mission.id;
  const point = mark.point;
  const item = mark.item;
  if (point !== undefined) {
    if (!point.reason.startsWith("failover")) {
      row.appendChild(button("Diff with Sandbox", () => command("keel.diffPoint", id, point.id)));
    }
    row.appendChild(button(`Restore to ${point.id}…`, () => command("keel.restore", id, point.id)));
    row.appendChild(button(`Fork from ${point.id}…`, () => command("keel.fork", id, point.id)));
  }
  if (item !== undefined) {
    if (item.model) {
      box.appendChild(el("p", "detail-line", `served by ${item.provider ? `${item.provider}/` : ""}${item.model}` +
        `, ${item.tokensIn ?? 0} in + ${item.tokensOut ?? 0} out tokens` +
        (item.cost !== undefined && item.cost !== null ? `, cost ${item.cost}` : "")));
    }
    if (item.kind === "failover") { // its cause is in the label; each endpoint's health and cool-down there
      row.appendChild(button("Show Providers", () => command("keel.providers.focus")));
    }
    for (const file of item.files ?? []) {
      row.appendChild(button(`Diff ${file.path}`, () => vscode.postMessage({ type: "diffItem", item, path: file.path })));
    }
    // the first restore point at or after the step (the newest when none came after it yet)
    const target = points.find((p) => p.createdAt >= item.at) ?? points[points.length - 1];
    if (target !== undefined) {
      row.appendChild(button(`Restore to ${target.id}…`, () => command("keel.restore", id, target.id),
        false, `the first restore point after this step: ${target.reason}`));
      row.appendChild(button(`Fork from ${target.id}…`, () => command("keel.fork", id, target.id)));
    }
  }
  box.appendChild(row);
  return box;
}

// -- the live activity list ----------------------------------------------------------------------
function activity(list: ActivityItem[]): HTMLElement {
  const section = el("section", "activity");
  const head = el("h2", undefined, unitFilter ? `Activity of ${unitFilter}` : "Activity");
  if (unitFilter) {
    head.appendChild(button("Show All Units", () => {
      unitFilter = undefined;
      render();
    }));
  }
  section.appendChild(head);
  const box = el("div", "activity-list");
  box.setAttribute("role", "log");
  const shown = unitFilter ? list.filter((i) => i.unit === unitFilter) : list;
  for (const item of shown) {
    const row = el("div", `row kind-${item.kind}${item.failed ? " failed" : ""}`);
    row.appendChild(el("span", "when", clock(item.at)));
    row.appendChild(el("span", "icon", rowIcon(item)));
    row.appendChild(el("span", "unit", item.unit ?? ""));
    row.appendChild(el("span", "title", item.title));
    row.title = item.text ? `${item.title}\n\n${item.text}` : item.title;
    box.appendChild(row);
  }
  if (shown.length === 0) {
    box.appendChild(el("p", "empty", "Nothing recorded yet."));
  }
  box.addEventListener("scroll", () => {
    following = box.scrollTop + box.clientHeight >= box.scrollHeight - 4;
  });
  section.appendChild(box);
  return section;
}

function rowIcon(item: ActivityItem): string {
  if (item.kind === "failover") {
    return "⇄";
  }
  if (item.failed) {
    return "✕";
  }
  return ({ model: "◆", tool: "▸", verification: "✓", question: "?", answer: "↩", restart: "↻",
    reexecuted: "↻", control: "‖", unit: "■", state: "●" } as Record<string, string>)[item.kind] ?? "·";
}

// -- drawing -------------------------------------------------------------------------------------
function render(): void {
  const root = document.getElementById("root");
  if (root === null || detail === undefined) {
    return;
  }
  const oldList = root.querySelector(".activity-list");
  const keep = oldList && !following ? oldList.scrollTop : undefined;
  const list = sorted();
  root.replaceChildren(header(detail), totals(detail, list), graph(detail, list), timeline(detail, list),
    activity(list));
  const box = root.querySelector(".activity-list");
  if (box !== null) {
    box.scrollTop = keep ?? box.scrollHeight;
  }
  document.body.dataset.state = detail.mission.state;
}

window.addEventListener("message", (event: MessageEvent<ToPage>) => {
  const message = event.data;
  if (message.type === "mission") {
    detail = message.detail;
    points = message.points;
    now = message.now;
  } else {
    if (message.reset) {
      items.clear();
    }
    for (const item of message.items) {
      items.set(item.id, item);
    }
  }
  render();
});
window.addEventListener("resize", render);
vscode.postMessage({ type: "ready" });
