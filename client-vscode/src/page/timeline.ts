/**
 * The mission page's timeline: one lane per kind of event, marks that would overlap drawn once with their
 * count (binMarks), one tab stop (arrow keys move along the marks), and the chosen mark's detail with its
 * actions (diff, restore, fork). Drawn again only when what it shows changed.
 */
import type { ActivityItem, MissionDetail, RestorePoint } from "../protocol";
import { button, el, svg } from "./dom";
import { binMarks, LANES, timelineMarks, timeSpan, type Bin, type Mark } from "./picture";

const LANE_H = 20;
const LABEL_W = 150;
const BIN_PX = 14;
const REDRAW_MS = 1000;

export interface TimelineActions {
  command(name: string, ...args: unknown[]): void;
  /** Ask the page for a draw (the timeline has something newer to show). */
  wake(): void;
  diffItem(item: ActivityItem, path: string): void;
}

const CLOCK = new Intl.DateTimeFormat([], { hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false });

/** "14:02:11" (one formatter for the page: making one per call costs more than drawing the row). */
export function clock(at: number): string {
  return CLOCK.format(at * 1000);
}

export class TimelineView {
  readonly section = el("section", "timeline");
  private readonly scroll = el("div", "timeline-scroll");
  private readonly detail = el("div", "mark-detail");
  private root = svg("svg", { role: "group", "aria-label": "timeline" }) as SVGSVGElement;
  private chosen: string | undefined;
  private cursor: string | undefined;
  private bins: Bin[] = [];
  private signature = "";
  private drawnAt = 0;
  private asked = "";
  private later: ReturnType<typeof setTimeout> | undefined;
  private marks: Mark[] = [];
  private marksOf = "";
  private last: { detail: MissionDetail; items: ActivityItem[]; points: RestorePoint[]; now: number;
    version: number } | undefined;

  constructor(private readonly act: TimelineActions) {
    this.section.appendChild(el("h2", undefined, "Timeline"));
    this.scroll.appendChild(this.root);
    this.section.append(this.scroll, this.detail);
    this.detail.hidden = true;
  }

  update(detail: MissionDetail, items: ActivityItem[], points: RestorePoint[], now: number, width: number,
         version: number): void {
    this.last = { detail, items, points, now, version };
    const w = Math.max(420, Math.min(1400, width));
    // a running mission's axis moves every second: the marks are drawn again at most once a second, or at
    // once when a person chose a mark or the page's width changed
    const asked = `${w}|${this.chosen ?? ""}`;
    const wait = this.drawnAt + REDRAW_MS - performance.now();
    if (asked === this.asked && wait > 0) {
      this.later ??= setTimeout(() => {
        this.later = undefined;
        this.asked = ""; // the newest state is drawn when the second is over, with the page's next draw
        this.act.wake();
      }, wait);
      return;
    }
    if (this.marksOf !== `${version}|${points.length}`) {
      this.marks = timelineMarks(items, points);
      this.marksOf = `${version}|${points.length}`;
    }
    const marks = this.marks;
    const [start, end] = timeSpan(detail, marks, now);
    const signature = `${marks.length}|${start}|${Math.round(end)}|${asked}|${points.length}`;
    if (signature === this.signature) {
      return;
    }
    this.signature = signature;
    this.asked = asked;
    this.drawnAt = performance.now();
    const plot = w - LABEL_W - 16;
    this.bins = binMarks(marks, start, end, plot, BIN_PX);
    const focusedKey = this.root.contains(document.activeElement) ? this.cursor : undefined;
    this.draw(w, plot, start, end);
    this.showDetail(detail, points);
    if (focusedKey !== undefined) {
      this.binElement(this.binOf(focusedKey)?.key)?.focus({ preventScroll: true });
    }
  }

  private draw(width: number, plot: number, start: number, end: number): void {
    const root = svg("svg", { width, height: LANES.length * LANE_H + 24, role: "group", "aria-label": "timeline" }) as SVGSVGElement;
    const x = (at: number): number => LABEL_W + ((at - start) / (end - start)) * plot;
    LANES.forEach(({ lane, label }, i) => {
      const y = i * LANE_H + LANE_H / 2;
      svg("text", { x: 0, y: y + 4, class: "lane-label" }, root).textContent = label;
      svg("line", { x1: LABEL_W, x2: LABEL_W + plot, y1: y, y2: y, class: `lane lane-${lane}` }, root);
    });
    const axisY = LANES.length * LANE_H + 14;
    for (const [at, anchor] of [[start, "start"], [end, "end"]] as const) {
      svg("text", { x: x(at), y: axisY, class: "axis", "text-anchor": anchor }, root).textContent = clock(at);
    }
    const chosenBin = this.chosen === undefined ? undefined : this.binOf(this.chosen);
    if (this.cursor === undefined || this.binOf(this.cursor) === undefined) {
      this.cursor = chosenBin?.key ?? this.bins[this.bins.length - 1]?.key;
    }
    const cursorBin = this.binOf(this.cursor);
    for (const bin of this.bins) {
      const row = LANES.findIndex((l) => l.lane === bin.lane);
      const shape = markShape(bin, x(bin.at), row * LANE_H + LANE_H / 2, root);
      const first = bin.marks[0] as Mark;
      const label = bin.marks.length === 1 ? first.label : `${bin.marks.length} ${LANES[row]?.label ?? ""} from ${clock(first.at)}`;
      shape.setAttribute("data-mark", bin.key);
      shape.setAttribute("tabindex", bin === cursorBin ? "0" : "-1");
      shape.setAttribute("role", "button");
      shape.setAttribute("aria-label", label);
      if (bin === chosenBin) {
        shape.classList.add("chosen");
      }
      svg("title", {}, shape).textContent = `${clock(bin.at)} ${label}`;
      shape.addEventListener("click", () => this.choose(bin.key));
    }
    root.addEventListener("keydown", (e) => this.onKey(e));
    this.root.replaceWith(root);
    this.root = root;
  }

  private binOf(markKey: string | undefined): Bin | undefined {
    return markKey === undefined ? undefined : this.bins.find((b) => b.key === markKey || b.marks.some((m) => m.key === markKey));
  }

  private binElement(key: string | undefined): SVGElement | undefined {
    return key === undefined ? undefined
      : (this.root.querySelector(`[data-mark="${CSS.escape(key)}"]`) as SVGElement | null) ?? undefined;
  }

  private choose(key: string): void {
    this.chosen = this.chosen === key ? undefined : key;
    this.cursor = key;
    this.redraw();
    this.binElement(this.binOf(key)?.key)?.focus({ preventScroll: true });
  }

  private redraw(): void {
    this.signature = "";
    this.asked = "";
    const last = this.last;
    if (last !== undefined) {
      this.update(last.detail, last.items, last.points, last.now, Number(this.root.getAttribute("width") ?? 480),
        last.version);
    }
  }

  private onKey(e: KeyboardEvent): void {
    const at = this.bins.findIndex((b) => b.key === this.cursor);
    const step = { ArrowRight: 1, ArrowDown: 1, ArrowLeft: -1, ArrowUp: -1 }[e.key];
    if (e.key === "Enter" || e.key === " ") {
      e.preventDefault();
      if (this.cursor !== undefined) {
        this.choose(this.cursor);
      }
    } else if (step !== undefined || e.key === "Home" || e.key === "End") {
      e.preventDefault();
      const index = e.key === "Home" ? 0 : e.key === "End" ? this.bins.length - 1
        : Math.min(this.bins.length - 1, Math.max(0, at + (step ?? 0)));
      const next = this.bins[index];
      this.binElement(this.cursor)?.setAttribute("tabindex", "-1");
      this.cursor = next?.key;
      const element = this.binElement(this.cursor);
      element?.setAttribute("tabindex", "0");
      element?.focus();
    }
  }

  private showDetail(detail: MissionDetail, points: RestorePoint[]): void {
    const bin = this.chosen === undefined ? undefined : this.binOf(this.chosen);
    this.detail.hidden = bin === undefined;
    if (bin === undefined) {
      this.detail.replaceChildren();
      return;
    }
    // a bin of several marks: the detail of the one chosen (the bin itself stands for its first), and the others
    const shown = bin.marks.find((m) => m.key === this.chosen) ?? (bin.marks[0] as Mark);
    const others = bin.marks.filter((m) => m !== shown).slice(-30);
    const list = others.length === 0 ? [] : [el("p", "detail-line", `${others.length} more here:`), el("div", "actions")];
    list[1]?.append(...others.map((m) => button(`${clock(m.at)} ${m.label}`, () => this.choose(m.key))));
    this.detail.replaceChildren(...markDetail(detail, points, shown, this.act), ...list);
  }
}

/** A failover is a "switched" mark (two arrows), never an error mark; failed steps are red crosses; a bin of
 * several marks is a larger dot with its count. */
function markShape(bin: Bin, cx: number, cy: number, parent: Element): SVGElement {
  const lane = bin.lane;
  const g = svg("g", { class: `mark mark-${lane}${bin.failed ? " failed" : ""}${bin.marks.length > 1 ? " bin" : ""}` }, parent);
  if (lane === "switches") {
    svg("path", { d: `M${cx - 6},${cy - 3} h10 l-3,-3 M${cx + 6},${cy + 3} h-10 l3,3`, class: "switch" }, g);
    svg("circle", { cx, cy, r: 8, class: "hit" }, g);
  } else if (lane === "points") {
    svg("path", { d: `M${cx},${cy - 7} L${cx + 6},${cy} L${cx},${cy + 7} L${cx - 6},${cy} Z` }, g);
  } else if (bin.failed && bin.marks.length === 1) {
    svg("path", { d: `M${cx - 4},${cy - 4} L${cx + 4},${cy + 4} M${cx + 4},${cy - 4} L${cx - 4},${cy + 4}`, class: "cross" }, g);
    svg("circle", { cx, cy, r: 7, class: "hit" }, g);
  } else {
    const r = bin.marks.length > 1 ? Math.min(8, 4 + Math.log2(bin.marks.length)) : lane === "model" ? 5 : 4;
    svg("circle", { cx, cy, r }, g);
  }
  return g;
}

function markDetail(detail: MissionDetail, points: RestorePoint[], mark: Mark, act: TimelineActions): HTMLElement[] {
  const lines: HTMLElement[] = [el("p", undefined, `${clock(mark.at)} · ${mark.label}`)];
  const row = el("div", "actions");
  const id = detail.mission.id;
  const point = mark.point;
  const item = mark.item;
  if (point !== undefined) {
    if (!point.reason.startsWith("failover")) {
      row.appendChild(button("Diff with Sandbox", () => act.command("keel.diffPoint", id, point.id)));
    }
    row.appendChild(button(`Restore to ${point.id}…`, () => act.command("keel.restore", id, point.id)));
    row.appendChild(button(`Fork from ${point.id}…`, () => act.command("keel.fork", id, point.id)));
  }
  if (item !== undefined) {
    if (item.model) {
      lines.push(el("p", "detail-line", `served by ${item.provider ? `${item.provider}/` : ""}${item.model}` +
        `, ${item.tokensIn ?? 0} in + ${item.tokensOut ?? 0} out tokens` +
        (item.cost !== undefined && item.cost !== null ? `, cost ${item.cost}` : "")));
    }
    if (item.kind === "failover") { // its cause is in the label; each endpoint's health and cool-down there
      row.appendChild(button("Show Providers", () => act.command("keel.providers.focus")));
    }
    for (const file of item.files ?? []) {
      row.appendChild(button(`Diff ${file.path}`, () => act.diffItem(item, file.path)));
    }
    // the first restore point at or after the step (the newest when none came after it yet)
    const target = points.find((p) => p.createdAt >= item.at) ?? points[points.length - 1];
    if (target !== undefined) {
      row.appendChild(button(`Restore to ${target.id}…`, () => act.command("keel.restore", id, target.id),
        false, `the first restore point after this step: ${target.reason}`));
      row.appendChild(button(`Fork from ${target.id}…`, () => act.command("keel.fork", id, target.id)));
    }
  }
  lines.push(row);
  return lines;
}

