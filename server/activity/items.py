"""Activity items: one stored record (journal entry, evidence, event, control request) as a step a person reads.

An item's `id` names its record (`j/<lane>/<seq>`, `v/<seq>` evidence, `e/<seq>` event, `c/<seq>`
control), so a later item with the same id (an intent that became done) replaces the earlier one. Field
names are camelCase on the wire: the CLI's `--json` and the language server send the same shape.
Depends on protocol only.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import msgspec

from keel.protocol.records import Control, Event, Evidence, JournalEntry

# model | tool | verification | question | answer | failover | restart | reexecuted | unit | state | control |
# note | step | error
KINDS = (
    "model",
    "tool",
    "verification",
    "question",
    "answer",
    "failover",
    "restart",
    "reexecuted",
    "unit",
    "state",
    "control",
    "note",
    "step",
    "error",
)
Prices = Callable[[str, str], "tuple[float, float] | None"]  # (provider, model) -> (input, output) per Mtok
TEXT_LIMIT = 4000


class FileChange(msgspec.Struct, frozen=True, rename="camel", omit_defaults=True):
    """One file a tool call changed: content digests before and after (None: no file), and its diff."""

    path: str
    before: str | None = None
    after: str | None = None
    diff: str = ""


class ActivityItem(msgspec.Struct, frozen=True, rename="camel", omit_defaults=True):
    id: str
    kind: str
    at: float
    title: str
    unit: str = ""
    lane: str = ""
    seq: int = 0
    status: str = ""  # model: paid | replayed; tool: its effect; verification: passed | failed
    failed: bool = False
    duration_ms: float = 0.0
    model: str = ""
    provider: str = ""
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float | None = None
    tool: str = ""
    args: dict[str, Any] | None = None
    effect: str = ""  # intent only | done | reconciled | skipped | read-only
    result: str = ""
    files: tuple[FileChange, ...] = ()
    text: str = ""
    kept: int = 0  # a unit's start: the recorded steps its agent got from the journal (not run again)


def unit_of(lane: str) -> str:
    return lane.split("#", 1)[0]


# -- journal entries ----------------------------------------------------------------------------------
def journal_item(
    entry: JournalEntry, lane: str, linked: list[Evidence], *, copied: bool, prices: Prices | None
) -> ActivityItem | None:
    """`linked`: the evidence recorded with this entry; `copied`: the entry was recorded by the mission
    this one was forked from (replayed here, never paid here)."""
    base = ActivityItem(
        id=f"j/{lane}/{entry.seq}",
        kind="step",
        at=entry.at,
        title=entry.summary or entry.kind,
        unit=unit_of(lane),
        lane=lane,
        seq=entry.seq,
        duration_ms=entry.cost.wall_ms,
        failed=bool(entry.error),
    )
    match entry.kind:
        case "model/complete" | "model/forward":  # model/forward: an outside agent's request via keel's proxy
            return _model(base, entry, copied, prices)
        case "effect/ask":  # an outside agent's effect, asked before it made it (the intent)
            allowed = isinstance(entry.result, dict) and bool(entry.result.get("allow"))
            verdict = "allowed" if allowed else "denied"
            effect = "intent only" if entry.phase == "intent" else "done"  # done: the agent reported its outcome
            return msgspec.structs.replace(base, kind="tool", effect=effect, status=verdict, result=verdict)
        case "effect/done":  # shown on the effect/ask entry it settles
            return None
        case "tool/run":
            return _tool(base, entry, next((e for e in linked if e.kind == "tool"), None))
        case "human/ask":
            answer = _answer_of(entry)
            asked = next((e for e in linked if e.kind == "answer"), None)
            question = str(asked.data.get("question", "")) if asked and isinstance(asked.data, dict) else ""
            title = f"answered {answer!r}" + (f" to: {question}" if question else "")
            return msgspec.structs.replace(base, kind="answer", title=title[:300], text=question, result=answer)
        case "evidence/add":
            notes = [e for e in linked if e.kind not in ("tool", "diff", "answer")]
            if not notes:  # recorded before evidence named its entry: the evidence log shows it
                return None
            note = notes[0]
            return msgspec.structs.replace(
                base, kind="note", title=f"{note.kind}: {note.summary}"[:300], text=_data(note)
            )
        case "plan/add":
            added = entry.result.get("added", []) if isinstance(entry.result, dict) else []
            return msgspec.structs.replace(base, title=f"added units: {', '.join(map(str, added))}")
        case "state/save":
            return msgspec.structs.replace(base, title="checkpoint: the agent's progress is kept")
    return msgspec.structs.replace(base, title=entry.kind, result=_short(json.dumps(entry.result, default=str)))


def _model(base: ActivityItem, entry: JournalEntry, copied: bool, prices: Prices | None) -> ActivityItem:
    result = entry.result if isinstance(entry.result, dict) else {}
    usage = result.get("usage") or {}
    tin, tout = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
    provider, model = str(result.get("provider", "")), str(result.get("model", entry.served_model))
    price = prices(provider, model) if prices is not None and provider else None
    cost = round((tin * price[0] + tout * price[1]) / 1e6, 6) if price else None
    status = "replayed" if copied else "paid"
    if entry.error:
        title = f"model call failed: {entry.error}"
    else:
        title = f"model {provider}/{model}: {tin} in + {tout} out tokens" + (f", cost {cost:g}" if cost else "")
        title += " (recorded before the fork)" if copied else ""
    return msgspec.structs.replace(
        base,
        kind="model",
        title=title[:300],
        status=status,
        model=model,
        provider=provider,
        tokens_in=tin,
        tokens_out=tout,
        cost=cost,
        text=_model_text(result.get("message") or {}) or entry.error,
    )


def _model_text(message: dict[str, Any]) -> str:
    parts = [str(message.get("content") or "")]
    for call in message.get("tool_calls") or []:
        fn = call.get("function", {}) if isinstance(call, dict) else {}
        parts.append(f"→ {fn.get('name', '?')}({fn.get('arguments', '')})")
    return _short("\n".join(p for p in parts if p), TEXT_LIMIT)


def _tool(base: ActivityItem, entry: JournalEntry, told: Evidence | None) -> ActivityItem:
    data = told.data if told is not None and isinstance(told.data, dict) else {}
    tool = str(data.get("tool") or (entry.summary or "tool").split(" ", 1)[0])
    args = data.get("args") if isinstance(data.get("args"), dict) else None
    result = entry.result if isinstance(entry.result, dict) else {}
    if entry.phase == "intent":
        effect, outcome, failed = "intent only", "started; not known to have finished", False
        files = _files(result)
    else:
        effect = _effect(entry, data)
        output = result.get("output")
        error = entry.error or str(result.get("error") or "")
        failed = bool(error) or result.get("ok") is False
        outcome = _short(error, 500) if failed else _output_summary(output)
        files = _files(output if isinstance(output, dict) else {})
    title = f"{entry.summary or tool}: {'failed' if failed else outcome}" if entry.phase == "done" else entry.summary
    return msgspec.structs.replace(
        base,
        kind="tool",
        title=_short(f"{title} [{effect}]", 300),
        tool=tool,
        args=args,
        effect=effect,
        status=effect,
        result=outcome,
        failed=failed,
        files=files,
    )


def _effect(entry: JournalEntry, data: dict[str, Any]) -> str:
    if entry.skipped:  # a person said the effect had already happened (the summary is only words)
        return "skipped"
    if data.get("effect") == "reconciled":
        return "reconciled"
    return "read-only" if entry.tool_class == "read_only" else "done"


def _output_summary(output: Any) -> str:
    if not isinstance(output, dict):
        return "ok" if output is None else _short(str(output), 200)
    if output.get("skipped"):
        return str(output.get("note", "skipped"))
    if "exit_code" in output or "returncode" in output:
        code = output.get("exit_code", output.get("returncode"))
        tail = (str(output.get("stdout", "")) + str(output.get("stderr", ""))).strip().splitlines()
        return f"exit {code}" + (f": {_short(tail[-1], 160)}" if tail else "")
    if "bytes" in output and "path" in output:
        return f"{'created' if output.get('created') else 'wrote'} {output['path']} ({output['bytes']} bytes)"
    if isinstance(output.get("files"), dict):
        return f"changed {', '.join(output['files'])}"
    if "content" in output and "path" in output:
        return f"read {output['path']} (lines {output.get('start_line', 1)}-{output.get('end_line', '?')})"
    for key, noun in (("files", "file(s)"), ("matches", "match(es)")):
        if isinstance(output.get(key), list):
            more = " (truncated)" if output.get("truncated") else ""
            return f"{len(output[key])} {noun}{more}"
    return _short(json.dumps(output, default=str), 200)


def _files(output: dict[str, Any]) -> tuple[FileChange, ...]:
    diff = output.get("diff")
    if not isinstance(diff, str) or not diff:
        return ()
    if isinstance(output.get("files"), dict):  # apply_diff: digests per file, one diff for all
        pieces = split_diff(diff)
        return tuple(
            FileChange(path=path, before=d.get("before"), after=d.get("after"), diff=pieces.get(path, diff))
            for path, d in output["files"].items()
            if isinstance(d, dict)
        )
    path = str(output.get("path", ""))
    return (FileChange(path=path, before=output.get("before"), after=output.get("after"), diff=diff),)


def split_diff(diff: str) -> dict[str, str]:
    """A multi-file unified diff, by file path (the new name, or the old one for a deletion)."""
    pieces: dict[str, str] = {}
    lines = diff.splitlines(keepends=True)
    starts = [i for i in range(len(lines) - 1) if lines[i].startswith("--- ") and lines[i + 1].startswith("+++ ")]
    for n, start in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(lines)
        old, new = _header(lines[start]), _header(lines[start + 1])
        pieces[new or old] = "".join(lines[start:end])
    return pieces


def _header(line: str) -> str:
    raw = line[4:].split("\t")[0].strip()
    if raw == "/dev/null":
        return ""
    return raw[2:] if raw.startswith(("a/", "b/")) else raw


def _answer_of(entry: JournalEntry) -> str:
    return str(entry.result.get("answer", "")) if isinstance(entry.result, dict) else ""


# -- evidence, events, control ---------------------------------------------------------------------------
def evidence_item(seq: int, item: Evidence) -> ActivityItem | None:
    data = item.data if isinstance(item.data, dict) else {}
    base = ActivityItem(id=f"v/{seq}", kind="note", at=item.at, title=_short(item.summary, 300), unit=item.unit)
    match item.kind:
        case "tool" | "diff":  # shown with their tool call (the journal entry holds call, result and diff)
            return None
        case "verification":
            ok = bool(data.get("ok"))
            return msgspec.structs.replace(
                base,
                kind="verification",
                status="passed" if ok else "failed",
                failed=not ok,
                text=_short(str(data.get("output", "")), TEXT_LIMIT),
                lane=item.lane,
                seq=item.seq,
            )
        case "failover":
            # the call was served elsewhere: a switch, not a failure (the mission goes on)
            return msgspec.structs.replace(base, kind="failover", status="switched", text=_data(item))
        case "reexecuted":
            return msgspec.structs.replace(base, kind="reexecuted", text=str(data.get("reason", "")))
        case "answer":
            title = f"answered {data.get('answer', '')!r} to: {data.get('question', '')}"
            return msgspec.structs.replace(
                base,
                kind="answer",
                title=_short(title, 300),
                text=str(data.get("question", "")),
                result=str(data.get("answer", "")),
            )
        case "merge-conflict":
            return msgspec.structs.replace(base, kind="question", failed=True, text=_data(item))
    return msgspec.structs.replace(base, title=_short(f"{item.kind}: {item.summary}", 300), text=_data(item))


def event_item(
    seq: int, event: Event, *, question: str = "", replayed: int = 0, why: str = "first", run_again: int = 0
) -> ActivityItem | None:
    """`question`: the pending question this state change asks; `replayed`: for a unit that starts again,
    how many recorded steps its agent gets from the journal (not executed, not paid again); `why`: why it
    starts (starts.why_started); `run_again`: the effects a lost host had started without a recorded result."""
    base = ActivityItem(id=f"e/{seq}", kind="note", at=event.at, title=event.message, unit=event.unit)
    match event.kind:
        case "state":
            if event.state == "waiting_input":
                title = "waiting for input" + (f": {question}" if question else "")
                return msgspec.structs.replace(base, kind="question", title=_short(title, 300), text=question)
            failed = event.state == "failed"
            title = f"mission {event.message.replace('_', ' ')}"  # "waiting input -> running", not the enum
            return msgspec.structs.replace(base, kind="state", title=title, failed=failed)
        case "unit" if event.state == "running":
            return _unit_start(base, event, replayed, why, run_again)
        case "unit":
            failed = event.state == "failed"
            title = f"unit {event.unit} {event.state}" + (f": {event.message}" if event.message else "")
            return msgspec.structs.replace(
                base, kind="unit", title=_short(title, 300), status=event.state, failed=failed, text=event.message
            )
        case "lease":
            return msgspec.structs.replace(base, kind="restart", title=f"unit {event.unit}: {event.message}")
        case "error":
            return msgspec.structs.replace(base, kind="error", failed=True, text=event.message)
    return msgspec.structs.replace(base, title=f"{event.kind}: {event.message}")


def _unit_start(base: ActivityItem, event: Event, replayed: int, why: str, run_again: int) -> ActivityItem:
    """Only a lost host's unit is a restart (the host lane, the work a resume kept); a unit that goes on
    after a person's answer or a resume is a unit step like its first start."""
    if replayed and why == "host-lost":
        again = f"{run_again} run again" if run_again else "none run again"
        title = f"host lost, resumed from the journal: {replayed} step(s) kept, {again} (unit {event.unit})"
        return msgspec.structs.replace(
            base, kind="restart", title=title, status="host-lost", kept=replayed, text=event.message
        )
    if not replayed:
        return msgspec.structs.replace(base, kind="unit", title=f"unit {event.unit} started ({event.message})")
    went_on = {
        "answered": f"unit {event.unit} goes on with the person's answer",
        "resumed": f"unit {event.unit} goes on after the mission resumed",
    }.get(why, f"unit {event.unit} started")
    title = f"{went_on} ({event.message}): {replayed} recorded step(s) from the journal, none run or paid again"
    return msgspec.structs.replace(base, kind="unit", title=title, status=why, kept=replayed, text=event.message)


def control_item(seq: int, control: Control) -> ActivityItem | None:
    if control.action == "answer":  # the answer item says it, with its question
        return None
    where = _SOURCES.get(control.source, "")
    return ActivityItem(id=f"c/{seq}", kind="control", at=control.at, title=f"{control.action} requested{where}")


_SOURCES = {"lsp": " in the editor", "cli": " from the terminal"}  # where a person asked


def _data(item: Evidence) -> str:
    return "" if item.data is None else _short(json.dumps(item.data, default=str, indent=1), TEXT_LIMIT)


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
