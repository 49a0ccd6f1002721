/**
 * The top of the mission page: its name and state, goal, where a fork came from (by the original's name),
 * why it stopped, the question it asks (answered in a field on the page, or with a choice's button), the
 * actions its state allows, and the totals. Each part is rebuilt only when what it shows changed, so the
 * answer being typed keeps its text and focus while the mission moves on.
 */
import type { ActivityItem, MissionDetail, MissionSummary } from "../protocol";
import { costText, missionLabel } from "../protocol";
import { button, el, Keyed, setText } from "./dom";
import { duration, resumptions } from "./picture";

export interface HeaderActions {
  command(name: string, ...args: unknown[]): void;
}

function part(cls: string): HTMLElement {
  return el("div", cls);
}

export class HeaderView {
  readonly section = el("header");
  private readonly title = el("h1");
  private readonly titleText = el("span", "mission-name");
  private readonly badge = el("span", "badge");
  private readonly goal = el("p", "goal");
  private readonly origin = el("p", "origin");
  private readonly reasons = part("reasons");
  private readonly question = part("question-box");
  private readonly actions = part("actions");
  private readonly totals = el("section", "totals");
  private readonly cells: Keyed<[string, string]>;
  private signatures = { reasons: "", question: "", actions: "" };

  constructor(private readonly act: HeaderActions) {
    this.title.append(this.titleText, this.badge);
    this.totals.setAttribute("aria-label", "totals");
    this.section.append(this.title, this.goal, this.origin, this.reasons, this.question, this.actions, this.totals);
    this.cells = new Keyed<[string, string]>(this.totals, () => {
      const cell = el("div", "total");
      cell.append(el("span", "total-key"), el("span", "total-value"));
      return cell;
    }, (cell, [k, v]) => {
      setText(cell.firstElementChild as HTMLElement, k);
      setText(cell.lastElementChild as HTMLElement, v);
    });
  }

  update(d: MissionDetail, items: readonly ActivityItem[], now: number, originName: string | undefined): void {
    const m = d.mission;
    setText(this.titleText, missionLabel(m));
    setText(this.badge, m.state.replace("_", " "));
    this.badge.className = `badge state-${m.state}`;
    setText(this.goal, d.goal);
    this.goal.hidden = !d.goal;
    const from = m.forkedFrom;
    setText(this.origin, from ? `Forked from ${originName ?? "a deleted mission"} at ${from.point}` : "");
    this.origin.hidden = from === undefined;
    this.once("reasons", JSON.stringify([m.state, m.pauseReason, m.pauseNote, m.error]), () => this.drawReasons(m));
    const q = m.question;
    this.once("question", q ? `${m.id}|${q.unit}|${q.seq}|${q.text}|${(q.choices ?? []).join("\u0000")}` : "",
      () => this.drawQuestion(m));
    this.once("actions", `${m.id}|${m.state}`, () => this.drawActions(m));
    this.cells.show(totals(d, items, now), ([k]) => k);
  }

  private once(which: keyof HeaderView["signatures"], signature: string, draw: () => void): void {
    if (this.signatures[which] !== signature) {
      this.signatures[which] = signature;
      draw();
    }
  }

  private drawReasons(m: MissionSummary): void {
    const stopped = m.state === "paused" || m.state === "offline";
    if (stopped && m.pauseReason === "policy") {
      // paused for policy: the reason stays on the page, with the file that fixes it
      const why = el("div", "reason");
      why.appendChild(el("p", undefined, `Paused for policy: ${m.error ?? "no model may serve this mission"}`));
      const row = el("div", "actions");
      row.appendChild(button("Open .keel/config.toml", () => this.act.command("keel.openConfig"), true));
      row.appendChild(button("Resume", () => this.act.command("keel.resume", m.id)));
      why.appendChild(row);
      this.reasons.replaceChildren(why);
      return;
    }
    const note = stopped ? m.pauseNote ?? (m.pauseReason ? `paused (${m.pauseReason})` : undefined) : undefined;
    this.reasons.replaceChildren(...[note, m.error].filter((s): s is string => !!s)
      .map((text) => el("p", m.error === text ? "reason error" : "reason", text)));
  }

  /** A free-text question is answered in a field here (Enter or Send); a question with choices has a
   * button per choice and a field for another answer. */
  private drawQuestion(m: MissionSummary): void {
    const q = m.question;
    if (q === undefined) {
      this.question.replaceChildren();
      return;
    }
    const box = el("div", "question");
    box.appendChild(el("span", "question-label", `${q.unit} asks:`));
    box.appendChild(el("p", "question-text", q.text));
    const choices = q.choices ?? [];
    if (choices.length > 0) {
      const row = el("div", "actions");
      for (const choice of choices) {
        row.appendChild(button(choice, () => this.act.command("keel.answer", m.id, choice), true));
      }
      box.appendChild(row);
    }
    const form = el("form", "answer");
    const field = el("textarea", "answer-field");
    field.rows = 2;
    field.placeholder = choices.length > 0 ? "Or write another answer" : "Your answer";
    field.setAttribute("aria-label", `answer to: ${q.text}`);
    const send = button("Send Answer", () => undefined, choices.length === 0);
    send.type = "submit";
    const problem = el("span", "answer-problem");
    problem.setAttribute("role", "alert");
    form.append(field, send, problem);
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      if (field.value.trim() === "") {
        setText(problem, "An answer cannot be empty");
        return;
      }
      send.disabled = true;
      this.act.command("keel.answer", m.id, field.value);
    });
    field.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey) {
        e.preventDefault();
        form.requestSubmit();
      }
    });
    box.appendChild(form);
    this.question.replaceChildren(box);
  }

  private drawActions(m: MissionSummary): void {
    const row: HTMLButtonElement[] = [];
    const add = (label: string, name: string, primary = false): void => {
      row.push(button(label, () => this.act.command(name, m.id), primary));
    };
    if (["running", "pausing", "offline", "created"].includes(m.state)) {
      add("Pause", "keel.pause", true);
    }
    if (["paused", "offline", "failed"].includes(m.state)) {
      add("Resume", "keel.resume", true);
    }
    add("Restore…", "keel.restore");
    add("Fork…", "keel.fork");
    add("Review Changes", "keel.reviewChanges");
    add("Apply…", "keel.apply");
    this.actions.replaceChildren(...row);
  }
}

function totals(d: MissionDetail, items: readonly ActivityItem[], now: number): [string, string][] {
  const m = d.mission;
  const u = m.usage;
  const live = ["running", "pausing", "offline", "waiting_input"].includes(m.state);
  const kept = resumptions(items as ActivityItem[]);
  return [
    ["units", `${m.units.done}/${m.units.total} done`],
    ["tokens", u ? `${(u.promptTokens + u.completionTokens).toLocaleString()} (${u.promptTokens.toLocaleString()} in, ${u.completionTokens.toLocaleString()} out)` : "0"],
    ["cost", u?.cost !== undefined ? costText(u) : u && u.calls > 0 ? "no price configured" : "none yet"],
    ["model calls", String(u?.calls ?? 0)],
    ["served by", u?.servedModel ? `${u.servedModel}${u.failovers ? ` (after ${u.failovers} failover${u.failovers > 1 ? "s" : ""})` : ""}` : "—"],
    ["wall time", duration((live ? now : m.updatedAt) - m.createdAt)],
    ["work kept", kept.length === 0 ? "no resume yet"
      : kept.map((r) => `${r.unit}: ${r.kept} kept, ${r.ranAfter} run after`).join("; ")],
  ];
}
