/**
 * The mission page's picture as plain data: where each unit of the task graph goes, which marks the
 * timeline carries, and the totals. Pure functions of the keel/... payloads (protocol.ts), so the page
 * script only draws what these return. Must not import `vscode` or touch the DOM.
 */
import type { ActivityItem, MissionDetail, RestorePoint, UnitInfo, UnitState } from "../protocol";

export const NODE_W = 200;
export const NODE_H = 64;
const GAP_X = 56;
const GAP_Y = 20;

export interface PlacedUnit {
  unit: UnitInfo;
  x: number;
  y: number;
}

export interface GraphLayout {
  nodes: PlacedUnit[];
  edges: { from: PlacedUnit; to: PlacedUnit }[];
  width: number;
  height: number;
}

/** Units in columns by their depth in the `after` graph (a unit stands right of everything it waits
 * for), in the mission's order within a column. An `after` naming no unit is ignored; a cycle cannot
 * be recorded, but a depth is capped at the unit count so a bad graph still draws. */
export function layoutGraph(units: UnitInfo[]): GraphLayout {
  const byId = new Map(units.map((u) => [u.id, u]));
  const depth = new Map<string, number>();
  const depthOf = (u: UnitInfo, seen: number): number => {
    const known = depth.get(u.id);
    if (known !== undefined) {
      return known;
    }
    if (seen > units.length) {
      return 0;
    }
    const parents = u.after.map((id) => byId.get(id)).filter((p): p is UnitInfo => p !== undefined);
    const d = parents.length === 0 ? 0 : 1 + Math.max(...parents.map((p) => depthOf(p, seen + 1)));
    depth.set(u.id, d);
    return d;
  };
  const columns: UnitInfo[][] = [];
  for (const u of units) {
    const d = depthOf(u, 0);
    (columns[d] ??= []).push(u);
  }
  const placed = new Map<string, PlacedUnit>();
  columns.forEach((column, c) => column.forEach((unit, r) => {
    placed.set(unit.id, { unit, x: c * (NODE_W + GAP_X), y: r * (NODE_H + GAP_Y) });
  }));
  const nodes = units.map((u) => placed.get(u.id)).filter((p): p is PlacedUnit => p !== undefined);
  const edges = nodes.flatMap((to) => to.unit.after.map((id) => placed.get(id))
    .filter((from): from is PlacedUnit => from !== undefined).map((from) => ({ from, to })));
  const rows = Math.max(1, ...columns.map((c) => c.length));
  return { nodes, edges, width: Math.max(1, columns.length) * (NODE_W + GAP_X) - GAP_X, height: rows * (NODE_H + GAP_Y) - GAP_Y };
}

/** The look of a unit state: a word, an icon (a character the page's font has) and a theme colour. */
export const UNIT_LOOK: Record<UnitState | "asking", { word: string; icon: string; color: string }> = {
  pending: { word: "pending", icon: "○", color: "--vscode-disabledForeground" },
  ready: { word: "ready", icon: "◌", color: "--vscode-charts-blue" },
  running: { word: "running", icon: "▶", color: "--vscode-charts-blue" },
  succeeded: { word: "succeeded", icon: "✓", color: "--vscode-charts-green" },
  failed: { word: "failed", icon: "✕", color: "--vscode-charts-red" },
  resumable: { word: "paused", icon: "‖", color: "--vscode-charts-yellow" },
  asking: { word: "waiting for input", icon: "?", color: "--vscode-charts-orange" },
};

export type Lane = "steps" | "model" | "points" | "switches" | "control" | "questions" | "host";

export const LANES: { lane: Lane; label: string }[] = [
  { lane: "steps", label: "steps" },
  { lane: "model", label: "model calls" },
  { lane: "points", label: "restore points" },
  { lane: "switches", label: "failovers" },
  { lane: "control", label: "pauses and resumes" },
  { lane: "questions", label: "questions" },
  { lane: "host", label: "host losses and resumes" },
];

export interface Mark {
  key: string;
  lane: Lane;
  at: number;
  label: string;
  failed: boolean;
  item?: ActivityItem;
  point?: RestorePoint;
}

/** The lane of an activity item on the timeline (undefined: not drawn there, only listed). */
export function laneOf(item: ActivityItem): Lane | undefined {
  switch (item.kind) {
    case "model":
      return "model";
    case "tool":
    case "verification":
    case "step":
      return "steps";
    case "failover":
      return "switches";
    case "question":
    case "answer":
      return "questions";
    case "restart":
    case "reexecuted":
      return "host";
    case "control":
      return "control";
    case "state":
      return /paus|resum|offline/.test(item.title) ? "control" : undefined;
    default:
      return undefined;
  }
}

export function timelineMarks(items: ActivityItem[], points: RestorePoint[]): Mark[] {
  const marks: Mark[] = [];
  for (const item of items) {
    const lane = laneOf(item);
    if (lane !== undefined) {
      marks.push({ key: `i:${item.id}`, lane, at: item.at, label: item.title, failed: item.failed === true, item });
    }
  }
  for (const point of points) {
    marks.push({ key: `p:${point.id}`, lane: "points", at: point.createdAt, label: `${point.id}: ${point.reason}`,
      failed: false, point });
  }
  return marks.sort((a, b) => a.at - b.at);
}

/** The time axis: from the mission's start to now (a live mission) or its last change. */
export function timeSpan(detail: MissionDetail, marks: Mark[], now: number): [number, number] {
  const m = detail.mission;
  const live = m.state === "running" || m.state === "pausing" || m.state === "offline" || m.state === "waiting_input";
  const start = Math.min(m.createdAt, ...marks.map((k) => k.at));
  const end = Math.max(live ? now : m.updatedAt, ...marks.map((k) => k.at), start + 1);
  return [start, end];
}

export interface Resumption {
  at: number;
  unit: string;
  kept: number;
  ranAfter: number;
}

/** After each start again: how many recorded steps the unit kept from the journal, and how many it ran
 * (tool and model calls paid here) after that, until the next start again of the same unit. */
export function resumptions(items: ActivityItem[]): Resumption[] {
  const starts = items.filter((i) => i.kind === "restart" && i.kept !== undefined && i.unit);
  return starts.map((s) => {
    const next = starts.find((o) => o.unit === s.unit && o.at > s.at)?.at ?? Infinity;
    const ranAfter = items.filter((i) => i.unit === s.unit && i.at >= s.at && i.at < next
      && (i.kind === "tool" || i.kind === "model") && i.status !== "replayed").length;
    return { at: s.at, unit: s.unit ?? "", kept: s.kept ?? 0, ranAfter };
  });
}

/** "3 h 05 min", "4 min 12 s", "9 s". */
export function duration(seconds: number): string {
  const s = Math.max(0, Math.round(seconds));
  if (s >= 3600) {
    return `${Math.floor(s / 3600)} h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")} min`;
  }
  return s >= 60 ? `${Math.floor(s / 60)} min ${String(s % 60).padStart(2, "0")} s` : `${s} s`;
}

/** The step a running unit is on: its newest activity item's title. */
export function currentStep(items: ActivityItem[], unit: string): string | undefined {
  for (let i = items.length - 1; i >= 0; i--) {
    const item = items[i];
    if (item !== undefined && item.unit === unit && item.kind !== "state") {
      return item.title;
    }
  }
  return undefined;
}

export interface Bin {
  key: string;
  lane: Lane;
  at: number;
  marks: Mark[];
  failed: boolean;
}

/** Marks that would overlap on a lane (closer than `px` pixels on a `plot`-wide axis) are one bin, drawn
 * once with its count: a long mission's timeline stays readable instead of a solid bar. A bin's key is its
 * lane and first mark, so a chosen bin stays chosen while later marks arrive. */
export function binMarks(marks: readonly Mark[], start: number, end: number, plot: number, px: number): Bin[] {
  const perPx = (end - start) / Math.max(1, plot);
  const open = new Map<Lane, Bin>();
  const bins: Bin[] = [];
  for (const mark of marks) {
    const bin = open.get(mark.lane);
    if (bin !== undefined && (mark.at - bin.at) / perPx < px) {
      bin.marks.push(mark);
      bin.failed ||= mark.failed;
      continue;
    }
    const fresh: Bin = { key: mark.key, lane: mark.lane, at: mark.at, marks: [mark], failed: mark.failed };
    open.set(mark.lane, fresh);
    bins.push(fresh);
  }
  return bins;
}
