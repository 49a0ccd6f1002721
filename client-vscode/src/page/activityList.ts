/**
 * The mission page's live activity list: the newest steps (all units, or the chosen one's), one keyed row
 * per step, so new steps are appended without touching the rows a person reads or selects; it follows the
 * newest step until scrolled up. Earlier steps come in pages on request.
 */
import type { ActivityItem } from "../protocol";
import { button, el, Keyed, setAttr, setText } from "./dom";
import { clock } from "./timeline";

const PAGE = 300;

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

export class ActivityList {
  readonly section = el("section", "activity");
  private readonly heading = el("h2");
  private readonly headingText = el("span");
  private readonly showAll: HTMLButtonElement;
  private readonly box = el("div", "activity-list");
  private readonly earlier: HTMLButtonElement;
  private readonly rows = el("div", "rows");
  private readonly empty = el("p", "empty", "Nothing recorded yet.");
  private readonly keyed: Keyed<ActivityItem>;
  private following = true;
  private limit = PAGE;
  private unitWidth = 0;
  private scrolling = false;
  /** A person chose this frame whether the list follows (Show earlier steps, another unit). */
  private decided = false;

  constructor(private readonly clearFilter: () => void) {
    this.showAll = button("Show All Units", () => this.clearFilter());
    this.heading.append(this.headingText, this.showAll);
    this.earlier = button("", () => {
      this.limit += PAGE;
      this.following = false;
      this.decided = true;
      this.onEarlier();
    });
    this.earlier.classList.add("earlier");
    this.box.setAttribute("role", "log");
    this.box.setAttribute("aria-label", "activity");
    this.box.append(this.earlier, this.rows, this.empty);
    this.section.append(this.heading, this.box);
    this.keyed = new Keyed<ActivityItem>(this.rows, () => this.makeRow(), (row, item) => this.fillRow(row, item));
  }

  /** Called before the page changes anything in a frame (its layout is still the last frame's, so this reads
   * it for free): the list follows the newest step while it is scrolled to the bottom. A scroll event cannot
   * tell: rows leaving the top move the scroll position too. */
  measure(): void {
    const box = this.box;
    if (!this.decided) {
      this.following = box.scrollHeight === 0 || box.scrollTop + box.clientHeight >= box.scrollHeight - 8;
    }
    this.decided = false;
  }

  /** Set by the page: draw again after "Show earlier steps". */
  onEarlier: () => void = () => undefined;

  update(items: readonly ActivityItem[], unit: string | undefined): void {
    setText(this.headingText, unit ? `Activity of ${unit}` : "Activity");
    this.showAll.hidden = unit === undefined;
    const shown = unit === undefined ? items : items.filter((i) => i.unit === unit);
    const from = Math.max(0, shown.length - this.limit);
    const width = Math.min(24, Math.max(4, ...shown.slice(from).map((i) => (i.unit ?? "").length)));
    if (width !== this.unitWidth) {
      this.unitWidth = width;
      this.box.style.setProperty("--unit-w", `${width}ch`);
    }
    this.keyed.show(from === 0 ? shown : shown.slice(from), (i) => i.id);
    this.earlier.hidden = from === 0;
    setText(this.earlier, `Show earlier steps (${from} more)`);
    this.empty.hidden = shown.length > 0;
    if (this.following && !this.scrolling) {
      // after the frame's own layout, so that following the newest step never forces one
      this.scrolling = true;
      requestAnimationFrame(() => {
        this.scrolling = false;
        if (this.following) {
          this.box.scrollTop = this.box.scrollHeight;
        }
      });
    }
  }

  /** The filter changed: start again from the newest steps, following them. */
  reset(): void {
    this.limit = PAGE;
    this.following = true;
    this.decided = true;
  }

  private makeRow(): HTMLElement {
    const row = el("div", "row");
    row.append(el("span", "when"), el("span", "icon"), el("span", "unit"), el("span", "title"));
    return row;
  }

  private fillRow(row: HTMLElement, item: ActivityItem): void {
    const signature = `${item.kind}|${item.failed === true}|${item.title}|${item.unit ?? ""}|${item.at}|${item.text?.length ?? 0}`;
    if (row.dataset.sig === signature) {
      return;
    }
    row.dataset.sig = signature;
    row.className = `row kind-${item.kind}${item.failed ? " failed" : ""}`;
    const [when, icon, unit, title] = [...row.children] as HTMLElement[];
    setText(when as HTMLElement, clock(item.at));
    setText(icon as HTMLElement, rowIcon(item));
    setText(unit as HTMLElement, item.unit ?? "");
    setAttr(unit as HTMLElement, "title", item.unit);
    setText(title as HTMLElement, item.title);
    row.title = item.text ? `${item.title}\n\n${item.text.slice(0, 4000)}` : item.title;
  }
}
