/**
 * The mission page's task graph, built for a thousand units: counts per state (each a filter), units
 * grouped by level, folder or state (a group with nothing left to watch starts folded), zoom and fit,
 * `after` edges where they can be read (a small graph drawn by level, and always the chosen unit's), and
 * one tab stop: arrow keys walk the units, PageUp/PageDown the groups (a roving tabindex). Updates touch
 * only the nodes whose state or step changed. The units that need watching are in `attention.ts`.
 */
import type { UnitInfo } from "../protocol";
import { el, button, Keyed, keepingFocus, setAttr, setClass, setText, svg } from "./dom";
import {
  countStates, groupUnits, levels, lookOf, nextStop, startsFolded, STATE_ORDER, STATE_WORDS, type Group, type GroupBy,
  type Look,
} from "./groups";
import { UNIT_LOOK } from "./picture";

export interface GraphInput {
  units: UnitInfo[];
  asking: string | undefined;
  steps: ReadonlyMap<string, string>;
  chosen: string | undefined;
}

const ZOOMS = [0.5, 0.625, 0.75, 0.875, 1, 1.25, 1.5];
const EDGES_UP_TO = 80;

function nodeLabel(u: UnitInfo, look: Look): string {
  return `unit ${u.id} ${u.title}: ${UNIT_LOOK[look].word}`;
}

export class GraphView {
  readonly section = el("section", "graph");
  private readonly counts = el("div", "counts");
  private readonly scroll = el("div", "graph-scroll");
  private readonly groupsBox = el("div", "groups");
  private readonly edges = svg("svg", { class: "edges", "aria-hidden": "true" }) as SVGSVGElement;
  private readonly zoomText = el("span", "zoom-level");
  private readonly groupsKeyed: Keyed<Group>;
  private readonly countKeyed: Keyed<Look, HTMLButtonElement>;
  private readonly nodes = new Map<string, HTMLElement>();
  /** Groups a person folded (true) or opened (false); the others follow startsFolded. */
  private readonly folded = new Map<string, boolean>();
  private foldedNow = new Set<string>();
  private readonly hidden = new Set<Look>();
  private by: GroupBy = "level";
  private zoom = 1;
  private cursor: string | undefined;
  private order: string[] = [];
  private shape = "";
  private levelOf = new Map<string, number>();
  private last: GraphInput | undefined;
  private width = 0;

  constructor(private readonly choose: (unit: string) => void) {
    const bar = el("div", "graph-bar");
    bar.appendChild(el("h2", undefined, "Task graph"));
    this.counts.setAttribute("role", "toolbar");
    this.counts.setAttribute("aria-label", "units by state (click to hide or show)");
    bar.appendChild(this.counts);
    bar.appendChild(this.groupPicker());
    const zoom = el("div", "zoom");
    zoom.appendChild(button("−", () => this.zoomBy(-1), false, "zoom out"));
    zoom.appendChild(this.zoomText);
    zoom.appendChild(button("+", () => this.zoomBy(1), false, "zoom in"));
    zoom.appendChild(button("Fit", () => this.fit(), false, "zoom so that the whole graph fits"));
    bar.appendChild(zoom);
    this.section.appendChild(bar);
    this.groupsBox.setAttribute("role", "tree");
    this.groupsBox.setAttribute("aria-label", "task graph");
    this.scroll.append(this.edges, this.groupsBox);
    this.section.appendChild(this.scroll);
    this.countKeyed = new Keyed<Look, HTMLButtonElement>(this.counts, (look) => this.countChip(look), () => undefined);
    this.groupsKeyed = new Keyed<Group>(this.groupsBox, (g) => this.makeGroup(g), (e, g) => this.updateGroup(e, g));
    this.groupsBox.addEventListener("keydown", (e) => this.onKey(e));
    this.groupsBox.addEventListener("focusin", (e) => {
      const stop = (e.target as HTMLElement).dataset.stop;
      if (stop !== undefined) {
        this.moveCursor(stop, false);
      }
    });
    this.setZoom(1);
  }

  update(input: GraphInput): void {
    this.last = input;
    const shape = input.units.map((u) => `${u.id}<${u.after.join(",")}`).join(";");
    if (shape !== this.shape) {
      this.shape = shape;
      this.levelOf = levels(input.units);
    }
    const total = input.units.length;
    const counts = countStates(input.units, input.asking);
    const present = STATE_ORDER.filter((look) => (counts[look] ?? 0) > 0);
    this.countKeyed.show(present, (look) => look);
    for (const look of present) {
      const chip = this.countKeyed.elements.get(look);
      if (chip !== undefined) {
        setText(chip, `${UNIT_LOOK[look].icon} ${counts[look] ?? 0} ${STATE_WORDS[look]}`);
        setAttr(chip, "aria-pressed", this.hidden.has(look) ? "false" : "true");
      }
    }
    const shown = this.hidden.size === 0 ? input.units
      : input.units.filter((u) => !this.hidden.has(lookOf(u, input.asking)));
    const groups = groupUnits(shown, this.by, input.asking, this.levelOf);
    setClass(this.groupsBox, "columns", this.by === "level" && total <= EDGES_UP_TO);
    this.foldedNow = new Set(groups.filter((g) => this.folds(g, total, input.chosen)).map((g) => g.key));
    keepingFocus(() => this.groupsKeyed.show(groups, (g) => g.key));
    this.order = groups.flatMap((g) => [`g:${g.key}`, ...(this.isFolded(g.key) ? [] : g.units.map((u) => u.id))]);
    for (const id of [...this.nodes.keys()]) {
      if (!this.nodes.get(id)?.isConnected) {
        this.nodes.delete(id);
      }
    }
    if (this.cursor === undefined || !this.order.includes(this.cursor)) {
      this.moveCursor(this.order[0], false);
    }
    this.drawEdges(input, total);
  }

  /** Whether a group is folded now: as a person left it; else as startsFolded says, except that a group
   * holding the keyboard's focus or the chosen unit stays as it is drawn. */
  private folds(g: Group, total: number, chosen: string | undefined): boolean {
    const chosenByPerson = this.folded.get(g.key);
    if (chosenByPerson !== undefined) {
      return chosenByPerson;
    }
    const box = this.groupsKeyed.elements.get(g.key);
    const holds = box !== undefined && (box.contains(document.activeElement) || g.units.some((u) => u.id === chosen));
    return holds ? this.foldedNow.has(g.key) : startsFolded(g, total);
  }

  /** The page's width changed: rows of nodes wrap elsewhere, so the edges are drawn again. */
  resized(): void {
    this.width = this.scroll.clientWidth;
    this.redraw();
  }

  private groupPicker(): HTMLElement {
    const label = el("label", "group-by", "Group by ");
    const select = el("select");
    for (const [value, text] of [["level", "level"], ["folder", "folder"], ["state", "state"]]) {
      const option = el("option", undefined, text);
      option.value = value ?? "";
      select.appendChild(option);
    }
    select.addEventListener("change", () => {
      this.by = select.value as GroupBy;
      this.redraw();
    });
    label.appendChild(select);
    return label;
  }

  private countChip(look: Look): HTMLButtonElement {
    const chip = button("", () => {
      if (!this.hidden.delete(look)) {
        this.hidden.add(look);
      }
      this.redraw();
    }, false, `show or hide the ${STATE_WORDS[look]} units`);
    chip.className = `count look-${look}`;
    chip.style.borderColor = `var(${UNIT_LOOK[look].color})`;
    return chip;
  }

  private makeGroup(g: Group): HTMLElement {
    const box = el("div", "group");
    box.dataset.group = g.key;
    const head = el("div", "group-head");
    head.setAttribute("role", "treeitem");
    head.tabIndex = -1;
    head.dataset.stop = `g:${g.key}`;
    head.append(el("span", "fold"), el("span", "group-name"), el("span", "group-counts"), el("span", "group-bar"));
    head.addEventListener("click", () => this.toggle(g.key));
    const body = el("div", "group-body");
    body.setAttribute("role", "group");
    box.append(head, body);
    const keyed = new Keyed<UnitInfo>(body, (u) => this.makeNode(u), (e, u) => this.updateNode(e, u));
    (box as HTMLElement & { keyed?: Keyed<UnitInfo> }).keyed = keyed;
    return box;
  }

  private updateGroup(box: HTMLElement, g: Group): void {
    const head = box.firstElementChild as HTMLElement;
    const isFolded = this.isFolded(g.key);
    setAttr(head, "aria-expanded", isFolded ? "false" : "true");
    setAttr(head, "aria-label", `${g.label}: ${g.units.length} units, ${this.countWords(g)}`);
    const [fold, name, counts, bar] = [...head.children] as HTMLElement[];
    setText(fold as HTMLElement, isFolded ? "▸" : "▾");
    setText(name as HTMLElement, `${g.label} · ${g.units.length}`);
    setText(counts as HTMLElement, STATE_ORDER.filter((l) => g.counts[l]).map((l) => `${UNIT_LOOK[l].icon} ${g.counts[l]}`)
      .join("  "));
    this.stateBar(bar as HTMLElement, g);
    const keyed = (box as HTMLElement & { keyed?: Keyed<UnitInfo> }).keyed;
    keyed?.show(isFolded ? [] : g.units, (u) => u.id);
    keyed?.elements.forEach((node, id) => this.nodes.set(id, node));
  }

  private stateBar(bar: HTMLElement, g: Group): void {
    const signature = STATE_ORDER.map((l) => g.counts[l] ?? 0).join(",");
    if (bar.dataset.sig === signature) {
      return;
    }
    bar.dataset.sig = signature;
    bar.replaceChildren(...STATE_ORDER.filter((l) => g.counts[l]).map((l) => {
      const part = el("span");
      part.style.flexGrow = String(g.counts[l]);
      part.style.background = `var(${UNIT_LOOK[l].color})`;
      return part;
    }));
  }

  private countWords(g: Group): string {
    return STATE_ORDER.filter((l) => g.counts[l]).map((l) => `${g.counts[l]} ${STATE_WORDS[l]}`).join(", ");
  }

  private makeNode(u: UnitInfo): HTMLElement {
    const node = el("div", "node");
    node.dataset.unit = u.id;
    node.dataset.stop = u.id;
    node.setAttribute("role", "treeitem");
    node.tabIndex = -1;
    node.append(el("span", "node-icon"), el("span", "node-title"), el("span", "node-sub"));
    node.addEventListener("click", () => this.choose(u.id));
    return node;
  }

  private updateNode(node: HTMLElement, u: UnitInfo): void {
    const input = this.last;
    const look = lookOf(u, input?.asking);
    const step = u.state === "running" ? input?.steps.get(u.id) : undefined;
    const sub = step ? `now: ${step}` : `${u.id} · ${UNIT_LOOK[look].word}${u.error ? `: ${u.error}` : ""}`;
    const signature = `${look}|${u.title}|${sub}|${input?.chosen === u.id}`;
    if (node.dataset.sig === signature) {
      return;
    }
    node.dataset.sig = signature;
    node.className = `node unit-${u.state} look-${look}${input?.chosen === u.id ? " chosen" : ""}`;
    node.style.borderColor = `var(${UNIT_LOOK[look].color})`;
    const [icon, title, subText] = [...node.children] as HTMLElement[];
    setText(icon as HTMLElement, UNIT_LOOK[look].icon);
    (icon as HTMLElement).style.color = `var(${UNIT_LOOK[look].color})`;
    setText(title as HTMLElement, u.title || u.id);
    setText(subText as HTMLElement, sub);
    setAttr(node, "aria-label", nodeLabel(u, look));
    node.title = `${u.title}\n${u.id} · ${UNIT_LOOK[look].word}${step ? `\nnow: ${step}` : ""}${u.error ? `\n${u.error}` : ""}` +
      `${u.after.length ? `\nafter: ${u.after.join(", ")}` : ""}\nclick or Enter: show its activity`;
  }

  private isFolded(key: string): boolean {
    return this.foldedNow.has(key);
  }

  private toggle(key: string): void {
    this.folded.set(key, !this.isFolded(key));
    this.moveCursor(`g:${key}`, true);
    this.redraw();
  }

  private redraw(): void {
    if (this.last !== undefined) {
      this.update(this.last);
    }
  }

  private stopElement(stop: string | undefined): HTMLElement | undefined {
    if (stop === undefined) {
      return undefined;
    }
    if (stop.startsWith("g:")) {
      const box = this.groupsKeyed.elements.get(stop.slice(2));
      return (box?.firstElementChild as HTMLElement | null) ?? undefined;
    }
    return this.nodes.get(stop);
  }

  private moveCursor(stop: string | undefined, focus: boolean): void {
    const previous = this.stopElement(this.cursor);
    const next = this.stopElement(stop);
    if (previous !== undefined && previous !== next) {
      previous.tabIndex = -1;
    }
    this.cursor = stop;
    if (next !== undefined) {
      next.tabIndex = 0;
      if (focus) {
        next.focus();
      }
    }
  }

  private onKey(e: KeyboardEvent): void {
    const stop = (e.target as HTMLElement).dataset.stop;
    if (stop === undefined) {
      return;
    }
    if (e.key === "Enter" || e.key === " ") {
      e.preventDefault();
      if (stop.startsWith("g:")) {
        this.toggle(stop.slice(2));
      } else {
        this.choose(stop);
      }
      return;
    }
    const target = nextStop(this.order, stop, e.key);
    if (target !== undefined) {
      e.preventDefault();
      this.moveCursor(target, true);
    }
  }

  private setZoom(z: number): void {
    this.zoom = Math.min(1.5, Math.max(0.3, z));
    this.groupsBox.style.setProperty("--zoom", String(this.zoom));
    setText(this.zoomText, `${Math.round(this.zoom * 100)}%`);
  }

  private zoomBy(step: number): void {
    const at = ZOOMS.findIndex((z) => z >= this.zoom - 1e-6);
    const index = Math.min(ZOOMS.length - 1, Math.max(0, (at < 0 ? ZOOMS.length - 1 : at) + step));
    this.setZoom(ZOOMS[index] ?? 1);
    this.redraw();
  }

  /** The zoom at which the open groups fit the graph's box (never larger than 100%). */
  private fit(): void {
    const width = this.scroll.clientWidth - 8, height = this.scroll.clientHeight - 8;
    const needW = this.groupsBox.scrollWidth, needH = this.groupsBox.scrollHeight;
    if (needW > 0 && needH > 0) {
      this.setZoom(Math.min(1, this.zoom * Math.min(width / needW, height / needH)));
      this.redraw();
    }
  }

  /** Edges between the nodes they join: every `after` of a small graph drawn by level, else only the
   * chosen unit's (what it waits for and what waits for it). */
  private drawEdges(input: GraphInput, total: number): void {
    const all = this.by === "level" && total <= EDGES_UP_TO;
    const chosen = input.chosen;
    const pairs: [string, string][] = [];
    for (const u of input.units) {
      for (const from of u.after) {
        if (all || u.id === chosen || from === chosen) {
          pairs.push([from, u.id]);
        }
      }
    }
    if (pairs.length === 0) {
      if (this.edges.firstChild !== null) {
        this.edges.replaceChildren();
        this.edges.dataset.sig = "";
      }
      return;
    }
    const signature = `${this.zoom}|${this.width}|${pairs.map((p) => p.join(">")).join(",")}|${this.order.join(",")}`;
    if (this.edges.dataset.sig === signature) {
      return;
    }
    this.edges.dataset.sig = signature;
    const paths: SVGElement[] = [];
    const base = this.groupsBox.getBoundingClientRect();
    for (const [from, to] of pairs) {
      const a = this.nodes.get(from)?.getBoundingClientRect();
      const b = this.nodes.get(to)?.getBoundingClientRect();
      if (a === undefined || b === undefined || a.width === 0 || b.width === 0) {
        continue;
      }
      const x1 = a.right - base.left, y1 = a.top + a.height / 2 - base.top;
      const x2 = b.left - base.left, y2 = b.top + b.height / 2 - base.top;
      const mid = (x1 + x2) / 2;
      paths.push(svg("path", { d: `M${x1},${y1} C${mid},${y1} ${mid},${y2} ${x2 - 6},${y2}`, class: "edge" }));
      paths.push(svg("path", { d: `M${x2 - 7},${y2 - 4} L${x2},${y2} L${x2 - 7},${y2 + 4} Z`, class: "arrow" }));
    }
    setAttr(this.edges, "width", String(this.groupsBox.scrollWidth));
    setAttr(this.edges, "height", String(this.groupsBox.scrollHeight));
    this.edges.replaceChildren(...paths);
  }
}
