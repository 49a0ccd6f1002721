/**
 * The task graph of a large mission as plain data: each unit's level in the `after` graph, the groups the
 * page draws (by level, by folder or by state) with their counts per state, the units that stay in view
 * (running, failed, asking, paused), the order the keyboard walks, and a failure's cause read from the
 * output it left. Pure functions of the keel/... payloads; must not import `vscode` or touch the DOM.
 */
import type { ActivityItem, UnitInfo, UnitState } from "../protocol";

export type Look = UnitState | "asking";
export type GroupBy = "level" | "folder" | "state";

/** The order states are counted and listed in: what needs a person first, what is done last. */
export const STATE_ORDER: readonly Look[] = ["asking", "failed", "running", "resumable", "ready", "pending", "succeeded"];

/** The states a unit stays in view for, whatever the groups, filters and zoom. */
export const IN_VIEW: ReadonlySet<Look> = new Set<Look>(["asking", "failed", "running", "resumable"]);

export interface Group {
  key: string;
  label: string;
  units: UnitInfo[];
  counts: Partial<Record<Look, number>>;
}

export function lookOf(unit: UnitInfo, asking: string | undefined): Look {
  return unit.id === asking ? "asking" : unit.state;
}

/** Each unit's level: 0 for a unit that waits for nothing, else one more than the deepest unit it waits
 * for. An `after` naming no unit is ignored; a cycle (which keel refuses to record) cannot loop. */
export function levels(units: readonly UnitInfo[]): Map<string, number> {
  const byId = new Map(units.map((u) => [u.id, u]));
  const level = new Map<string, number>();
  const visiting = new Set<string>();
  const levelOf = (u: UnitInfo): number => {
    const known = level.get(u.id);
    if (known !== undefined) {
      return known;
    }
    if (visiting.has(u.id)) {
      return 0;
    }
    visiting.add(u.id);
    let deepest = -1;
    for (const id of u.after) {
      const parent = byId.get(id);
      if (parent !== undefined) {
        deepest = Math.max(deepest, levelOf(parent));
      }
    }
    visiting.delete(u.id);
    level.set(u.id, deepest + 1);
    return deepest + 1;
  };
  units.forEach(levelOf);
  return level;
}

/** A unit id's folder is what comes before its last dot: "billing.api.migrate" is in "billing.api"; an id
 * with no dot is in the top folder. */
export function folderOf(unit: UnitInfo): string {
  const cut = unit.id.lastIndexOf(".");
  return cut > 0 ? unit.id.slice(0, cut) : "";
}

export function countStates(units: readonly UnitInfo[], asking: string | undefined): Partial<Record<Look, number>> {
  const counts: Partial<Record<Look, number>> = {};
  for (const u of units) {
    const look = lookOf(u, asking);
    counts[look] = (counts[look] ?? 0) + 1;
  }
  return counts;
}

/** The groups in the order they are drawn, each with its units in the mission's order. `levelOf` is
 * levels(units), passed in so a caller computes it once per graph shape, not once per update. */
export function groupUnits(units: readonly UnitInfo[], by: GroupBy, asking: string | undefined,
                           levelOf: ReadonlyMap<string, number>): Group[] {
  const groups = new Map<string, Group>();
  const add = (key: string, label: string, unit: UnitInfo): void => {
    let group = groups.get(key);
    if (group === undefined) {
      group = { key, label, units: [], counts: {} };
      groups.set(key, group);
    }
    group.units.push(unit);
    const look = lookOf(unit, asking);
    group.counts[look] = (group.counts[look] ?? 0) + 1;
  };
  for (const u of units) {
    if (by === "state") {
      const look = lookOf(u, asking);
      add(`s:${look}`, STATE_WORDS[look], u);
    } else if (by === "folder") {
      const folder = folderOf(u);
      add(`f:${folder}`, folder === "" ? "(top folder)" : `${folder}.*`, u);
    } else {
      const level = levelOf.get(u.id) ?? 0;
      add(`l:${String(level).padStart(6, "0")}`, `Level ${level + 1}`, u);
    }
  }
  const order = (g: Group): string => by === "state" ? String(STATE_ORDER.indexOf(g.key.slice(2) as Look)) : g.key;
  return [...groups.values()].sort((a, b) => order(a).localeCompare(order(b), "en", { numeric: true }));
}

export const STATE_WORDS: Record<Look, string> = {
  asking: "waiting for input",
  failed: "failed",
  running: "running",
  resumable: "paused",
  ready: "ready",
  pending: "pending",
  succeeded: "succeeded",
};

/** Whether a group starts folded: in a large mission, a group with nothing left to watch (every unit
 * succeeded, or nothing started yet) is a header with counts until a person opens it. */
export function startsFolded(group: Group, total: number): boolean {
  if (total <= 80) {
    return false;
  }
  return !Object.keys(group.counts).some((look) => IN_VIEW.has(look as Look));
}

/** The units that stay in view: asking, failed, running, paused, in that order; at most `limit`, and how
 * many more there are. */
export function inView(units: readonly UnitInfo[], asking: string | undefined,
                       limit: number): { shown: UnitInfo[]; more: number } {
  const picked = units.filter((u) => IN_VIEW.has(lookOf(u, asking)));
  picked.sort((a, b) => STATE_ORDER.indexOf(lookOf(a, asking)) - STATE_ORDER.indexOf(lookOf(b, asking)));
  return { shown: picked.slice(0, limit), more: Math.max(0, picked.length - limit) };
}

/** The keyboard's walk over the graph: a group's header, then its units when it is open. Arrow keys step
 * along it; PageDown/PageUp jump to the next or previous group's header; Home/End go to the ends. */
export function nextStop(order: readonly string[], current: string | undefined, key: string): string | undefined {
  if (order.length === 0) {
    return undefined;
  }
  const at = current === undefined ? -1 : order.indexOf(current);
  const isHead = (k: string): boolean => k.startsWith("g:");
  switch (key) {
    case "ArrowDown":
    case "ArrowRight":
      return order[Math.min(order.length - 1, at + 1)];
    case "ArrowUp":
    case "ArrowLeft":
      return order[Math.max(0, at - 1)];
    case "Home":
      return order[0];
    case "End":
      return order[order.length - 1];
    case "PageDown": {
      const next = order.findIndex((k, i) => i > at && isHead(k));
      return next < 0 ? order[order.length - 1] : order[next];
    }
    case "PageUp": {
      let prev = -1;
      for (let i = Math.min(at, order.length) - 1; i >= 0; i--) {
        if (isHead(order[i] ?? "")) {
          prev = i;
          break;
        }
      }
      return order[Math.max(0, prev)];
    }
    default:
      return undefined;
  }
}

const CAUSE = /(\b\w*(Error|Exception)\b[:(]|^error[:[]|^E\s+|\bfatal:|\bFAILED\b|\bnot found\b|No such file)/i;

/** What made a unit fail, from the output its newest failed step left (`failed`): the last line that reads
 * as a cause ("ModuleNotFoundError: No module named 'structlog'"), else the output's last line. Undefined
 * when there is no output, or the line only repeats the unit's own error. */
export function causeOf(failed: ActivityItem | undefined, error: string): string | undefined {
  const lines = (failed?.text ?? "").split("\n").map((l) => l.trim()).filter((l) => l !== "");
  const cause = [...lines].reverse().find((l) => CAUSE.test(l)) ?? lines[lines.length - 1];
  return cause === undefined || error.includes(cause) ? undefined : cause;
}
