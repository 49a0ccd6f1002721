"""Which effect an outside agent's request is, and whether keel makes it: one pure decision.

    effect_of(method, params, sandbox) -> Effect | None
    decide(journal, effect, files, refusal) -> Decision: run / answer / ask / refuse

An effect's identity is what it does: the keel tool it counts as, its normalised command or edit, its
working folder; never a call id, turn id or start time the agent minted (Codex's `call_id`, `turn_id`,
`started_at_ms`, Gemini's `toolCallId`). Its intent records that identity with the digest of the sandbox's
files it started from (`EffectMark`), and its outcome the digest of the files it left. A request for the
same effect whose files are those it started from or left (nothing else changed since) repeats it:
- completed: answered from the journal (the recorded result; nothing runs);
- in doubt (an intent without an outcome): a question for a person (rerun or skip);
- a person said "skip" (it had happened): answered with that, never run without asking.
The same command after an edit (the files changed since) is a new effect and runs. A request the
mission's permissions refuse is refused with the reason. An intent of keel's own tool met at its number
is decided here too, with what the sandbox shows of it (`seen`: the tool's `reconcile`). The files'
digest is `files/digest.py`'s. Nothing here reads the store, the disk or a clock; depends on protocol only.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from keel.protocol.hashes import blake2b
from keel.protocol.records import EffectMark, JournalEntry

# keys an agent mints per request: ids, turn numbers, times
_MINTED = re.compile(r"(^|_)(id|ids|turn|at|ms|time|timestamp)$", re.I)
_MINTED_CAMEL = re.compile(r"[a-z](Id|Ids|Turn|At|Ms|Time|Timestamp)$")
_SHELLS = frozenset({"sh", "bash", "zsh", "dash"})
_FOLDER_KEYS = ("cwd", "dir_path", "directory", "workdir", "working_directory")


@dataclass(frozen=True, slots=True)
class Effect:
    """A requested effect: the keel tool it counts as, its normalised action and its working folder."""

    tool: str
    action: str
    folder: str = "."

    @property
    def key(self) -> str:
        h = blake2b(digest_size=16, person=b"keel-effect")
        h.update(json.dumps([self.tool, self.action, self.folder], ensure_ascii=False).encode())
        return h.hexdigest()

    def mark(self, before: str) -> EffectMark:
        return EffectMark(key=self.key, before=before, text=f"{self.tool} {self.action[:160]}")


@dataclass(frozen=True, slots=True)
class Decision:
    """`run`: a new effect (or one to run again at `entry`, its intent: a person said so, or the sandbox
    shows it never happened); `answer`: a repeat of `entry`, answered from it; `settle`: `entry`'s effect
    is visibly in the sandbox, recorded as what it shows; `ask`: a repeat of `entry`, in doubt; `refuse`:
    not made."""

    kind: Literal["run", "answer", "settle", "ask", "refuse"]
    entry: JournalEntry | None = None
    reason: str = ""


def decide(
    journal: Iterable[JournalEntry],
    effect: Effect,
    files: str,
    refusal: str = "",
    *,
    at: JournalEntry | None = None,
    seen: bool | None = None,
) -> Decision:
    """What keel does with a request for `effect` while the sandbox's files digest to `files`, given the
    unit's journal since its agent's last durable point; `refusal` is why the mission's permissions
    refuse it ("" when they allow it). `at`: the intent the request meets at its own number (a numbering
    agent's, or one this decision sent back to its tool), judged by itself; `seen`: what the sandbox shows
    of that intent's effect (a keel tool's `reconcile`: True it happened, False it did not, None it
    cannot tell; an outside agent's effect: None)."""
    if refusal:
        return Decision("refuse", reason=refusal)
    entries = sorted(journal, key=lambda e: e.seq)
    if at is not None:
        return _judge(at, [e for e in entries if e.seq > at.seq], effect, files, seen)
    key = effect.key
    for index in range(len(entries) - 1, -1, -1):
        entry = entries[index]
        if entry.effect is not None and entry.effect.key == key:
            return _judge(entry, entries[index + 1 :], effect, files, seen)
    return Decision("run")


def _judge(entry: JournalEntry, later: list[JournalEntry], effect: Effect, files: str, seen: bool | None) -> Decision:
    """A request for the effect `entry` recorded (its intent or its outcome), with the entries after it."""
    mark = entry.effect
    unchanged = mark is None or files == mark.before or not _files_changed(later)
    if entry.phase == "intent":
        if entry.rerun_approved:
            return Decision("run", entry, "a person said to run it again")
        if seen is True:
            return Decision("settle", entry, "the sandbox shows it happened")
        if seen is False:
            return Decision("run", entry, "the sandbox shows it did not happen")
        if unchanged:
            return Decision("ask", entry, "it started and its outcome was never recorded")
        return Decision("run")
    if mark is None:  # a numbering agent's completed call: its position answers it, not its identity
        return Decision("answer", entry, f"entry {entry.seq} recorded its outcome")
    if entry.skipped:
        if unchanged:
            return Decision("answer", entry, f"a person said this {effect.tool} already happened: do not make it again")
        return Decision("run")
    if files in (mark.before, mark.after):
        return Decision("answer", entry, f"this {effect.tool} already ran on these same files (entry {entry.seq})")
    return Decision("run")


def _files_changed(entries: Iterable[JournalEntry]) -> bool:
    """Whether any of these (later) entries is a completed effect that changed the sandbox's files."""
    return any(changed_files(e) for e in entries)


def changed_files(entry: JournalEntry) -> bool:
    """Whether the entry is a completed effect that changed the sandbox's files."""
    return entry.effect is not None and entry.phase == "done" and entry.effect.after != entry.effect.before


def effect_of(method: str, params: Any, sandbox: str) -> Effect | None:
    """The effect a `tool/run` (effectful tools only) or `effect/ask` request asks for; None for others."""
    if not isinstance(params, dict):
        return None
    if method == "tool/run":
        args = _dict(params.get("args"))
        tool = str(params.get("tool", ""))
        folder = _folder(str(args.get("cwd") or "."), sandbox)
        if tool == "run":
            return Effect("run", _command(args.get("cmd")), folder)
        rest = {k: v for k, v in args.items() if k != "cwd"}
        return Effect(tool, _canonical(rest), folder)
    if method == "effect/ask":
        tool = str(params.get("tool", ""))
        detail = _dict(params.get("detail"))
        raw = _dict(detail.get("rawInput"))
        folder = next((str(raw[k]) for k in _FOLDER_KEYS if raw.get(k)), ".")
        if "command" in raw or "cmd" in raw:
            return Effect(tool, _command(raw.get("command", raw.get("cmd"))), _folder(folder, sandbox))
        edits = [c for c in detail.get("content") or [] if isinstance(c, dict) and c.get("type") == "diff"]
        if edits:
            action = _canonical([_clean({**e, "path": _folder(str(e.get("path", "")), sandbox)}) for e in edits])
            return Effect(tool, action, ".")
        return Effect(
            tool, _canonical({"title": params.get("title", ""), "input": _clean(raw)}), _folder(folder, sandbox)
        )
    return None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _command(cmd: Any) -> str:
    """A command as one string: `bash -lc X` is X, a list is joined, runs of white space are one."""
    if isinstance(cmd, list):
        words = [str(w) for w in cmd]
        if len(words) == 3 and os.path.basename(words[0]) in _SHELLS and words[1] in ("-c", "-lc"):
            return " ".join(words[2].split())
        return " ".join(" ".join(words).split())
    return " ".join(str(cmd or "").split())


def _folder(path: str, sandbox: str) -> str:
    """A path inside the sandbox as relative posix (the sandbox itself is "."); others as given."""
    if not os.path.isabs(path):
        return os.path.normpath(path)
    rel = os.path.relpath(os.path.normpath(path), os.path.normpath(sandbox)) if sandbox else path
    return path if rel.startswith("..") else rel


def _clean(value: Any) -> Any:
    """`value` without the keys an agent mints per request (ids, turns, times)."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items() if not _minted(str(k))}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def _minted(key: str) -> bool:
    return bool(_MINTED.search(key) or _MINTED_CAMEL.search(key))


def _canonical(value: Any) -> str:
    return json.dumps(_clean(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def effect_outcome(entry: JournalEntry) -> str:
    """What the journal holds of an effect's outcome, in words for the agent."""
    if entry.phase == "intent":
        return "It started and no outcome was recorded: it may or may not have happened."
    if entry.skipped:
        return "A person said it had already happened."
    if entry.error:
        return f"Its recorded outcome: failed: {entry.error[:300]}."
    result = entry.result if isinstance(entry.result, dict) else {}
    if "outcome" in result:  # an outside agent's own effect (effect/done)
        status, output = str(result["outcome"]), result.get("output")
    else:  # a keel tool's result
        status, output = ("completed" if result.get("ok") else "failed"), result.get("output")
    if isinstance(output, dict):
        code = output.get("exit_code", output.get("returncode"))
        text = (
            (f"exit {code}; " if code is not None else "")
            + str(output.get("stdout", ""))
            + str(output.get("stderr", ""))
        )
    else:
        text = "" if output is None else str(output)
    text = text.strip()[-600:]
    return f"Its recorded outcome: {status}" + (f"; output: {text}" if text else "") + "."
