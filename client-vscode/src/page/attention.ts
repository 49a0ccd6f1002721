/**
 * The units a person watches, always in view above the graph however large it is: the one asking, the
 * failed ones (with the cause their output gives, and Why, Show Output and Retry This Unit), the running
 * ones (with their step) and the paused ones. Keyed cards: an update rewrites only a card that changed.
 */
import type { ActivityItem, MissionSummary, UnitInfo } from "../protocol";
import { button, el, Keyed, setText } from "./dom";
import { causeOf, inView, lookOf, STATE_WORDS } from "./groups";
import { UNIT_LOOK } from "./picture";

const LIMIT = 12;

export interface AttentionInput {
  mission: MissionSummary;
  units: UnitInfo[];
  steps: ReadonlyMap<string, string>;
  failures: ReadonlyMap<string, ActivityItem>;
}

export interface AttentionActions {
  choose(unit: string): void;
  command(name: string, ...args: unknown[]): void;
  showOutput(unit: string, item: ActivityItem): void;
}

interface Card {
  unit: UnitInfo;
  look: string;
  text: string;
  cause: string | undefined;
}

export class AttentionView {
  readonly section = el("section", "attention");
  private readonly list = el("div", "cards");
  private readonly more = el("p", "more");
  private readonly keyed: Keyed<Card>;
  private input: AttentionInput | undefined;

  constructor(private readonly act: AttentionActions) {
    this.section.setAttribute("aria-label", "units to watch");
    this.section.append(this.list, this.more);
    this.keyed = new Keyed<Card>(this.list, (c) => this.make(c), (e, c) => this.fill(e, c));
  }

  update(input: AttentionInput): void {
    this.input = input;
    const asking = input.mission.state === "waiting_input" ? input.mission.question?.unit : undefined;
    const { shown, more } = inView(input.units, asking, LIMIT);
    const cards = shown.map((unit) => {
      const look = lookOf(unit, asking);
      const step = unit.state === "running" ? input.steps.get(unit.id) : undefined;
      const cause = unit.state === "failed" ? causeOf(input.failures.get(unit.id), unit.error) : undefined;
      const text = step ? `now: ${step}` : unit.error || STATE_WORDS[look];
      return { unit, look, text, cause };
    });
    this.keyed.show(cards, (c) => c.unit.id);
    setText(this.more, more > 0 ? `and ${more} more (the counts above the graph show or hide them)` : "");
    this.section.hidden = cards.length === 0;
  }

  private make(card: Card): HTMLElement {
    const box = el("div", "card");
    box.dataset.unit = card.unit.id;
    const head = el("div", "card-head");
    head.append(el("span", "card-icon"), el("span", "card-title"), el("span", "card-id"));
    head.addEventListener("click", () => this.act.choose(card.unit.id));
    box.append(head, el("p", "card-text"), el("p", "card-cause"), el("div", "actions"));
    return box;
  }

  private fill(box: HTMLElement, card: Card): void {
    const mission = this.input?.mission;
    const signature = `${card.look}|${card.unit.title}|${card.text}|${card.cause ?? ""}|${mission?.state ?? ""}`;
    if (box.dataset.sig === signature || mission === undefined) {
      return;
    }
    box.dataset.sig = signature;
    const look = UNIT_LOOK[card.look as keyof typeof UNIT_LOOK];
    box.className = `card look-${card.look}`;
    box.style.borderLeftColor = `var(${look.color})`;
    const [head, text, cause, actions] = [...box.children] as HTMLElement[];
    const [icon, title, id] = [...(head as HTMLElement).children] as HTMLElement[];
    setText(icon as HTMLElement, look.icon);
    (icon as HTMLElement).style.color = `var(${look.color})`;
    setText(title as HTMLElement, card.unit.title || card.unit.id);
    setText(id as HTMLElement, `${card.unit.id} · ${look.word}`);
    setText(text as HTMLElement, card.text);
    setText(cause as HTMLElement, card.cause ?? "");
    (cause as HTMLElement).hidden = card.cause === undefined;
    (actions as HTMLElement).replaceChildren(...this.buttons(card, mission));
  }

  private buttons(card: Card, mission: MissionSummary): HTMLButtonElement[] {
    if (card.unit.state !== "failed") {
      return [];
    }
    const unit = card.unit;
    const why = button("Why", () => this.act.command("keel.activity.why",
      { kind: "unit", missionId: mission.id, unit, missionState: mission.state }), true,
      "the failed steps of this unit in the Activity view");
    const out = button("Show Output", () => {
      const item = this.input?.failures.get(unit.id);
      if (item !== undefined) {
        this.act.showOutput(unit.id, item);
      }
    }, false, "the whole output of the step that failed, in an editor");
    out.disabled = !this.input?.failures.has(unit.id);
    const canRetry = mission.state === "failed";
    const retry = button("Retry This Unit", () => this.act.command("keel.resume", mission.id), false,
      canRetry ? "resume the mission: its failed units run again" : "the mission runs its failed units again when it is resumed after it stops");
    retry.disabled = !canRetry;
    return [why, out, retry];
  }
}
