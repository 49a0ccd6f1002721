"""Both sides of a file change an activity item shows, for a diff editor.

A side is the stored blob its content digest names when the store has it (every checkpoint's file
snapshot keeps the sandbox's files as blobs); otherwise it is rebuilt from the recorded diff, which
holds all of a created or deleted file and the changed regions (with context) of any other, and
`complete` says so. Depends on storage and protocol only.
"""

from __future__ import annotations

import msgspec

from keel.protocol.errors import NotFoundError
from keel.server.activity.items import FileChange, journal_item
from keel.storage import Store, Txn
from keel.storage import missions as m

GAP = "⋯"  # stands for lines the diff does not show


class FileSides(msgspec.Struct, frozen=True, rename="camel"):
    path: str
    before: str
    after: str
    complete: bool  # False: parts the diff does not cover are left out (marked with GAP lines)
    existed_before: bool
    exists_after: bool


def file_sides(store: Store, mission: str, item_id: str, path: str) -> FileSides:
    return store.read(lambda txn: _sides(txn, mission, item_id, path))


def _sides(txn: Txn, mission: str, item_id: str, path: str) -> FileSides:
    mid = m.resolve_mission_id(txn, mission)
    change = _change(txn, mid, item_id, path)
    old_text, old_full = _side(txn, change.before, change.diff, old=True)
    new_text, new_full = _side(txn, change.after, change.diff, old=False)
    return FileSides(
        path=change.path,
        before=old_text,
        after=new_text,
        complete=old_full and new_full,
        existed_before=change.before is not None,
        exists_after=change.after is not None,
    )


def _change(txn: Txn, mid: str, item_id: str, path: str) -> FileChange:
    kind, _, rest = item_id.partition("/")
    lane, _, seq = rest.rpartition("/")
    entry = m.journal_get(txn, mid, lane, int(seq)) if kind == "j" and seq.isdigit() else None
    item = journal_item(entry, lane, [], copied=False, prices=None) if entry is not None else None
    if item is None:
        raise NotFoundError(f"mission {mid} has no activity item {item_id!r} with file changes")
    for change in item.files:
        if change.path == path:
            return change
    known = ", ".join(c.path for c in item.files) or "none"
    raise NotFoundError(f"activity item {item_id} of mission {mid} did not change {path!r} (it changed: {known})")


def _side(txn: Txn, digest: str | None, diff: str, *, old: bool) -> tuple[str, bool]:
    if digest is None and _whole_side_absent(diff, old):
        return "", True
    if digest:
        data = txn.get_blob(digest)
        if data is not None:
            return data.decode("utf-8", errors="replace"), True
    return from_diff(diff, old=old)


def _whole_side_absent(diff: str, old: bool) -> bool:
    marker = "--- /dev/null" if old else "+++ /dev/null"
    return any(line.startswith(marker) for line in diff.splitlines())


def from_diff(diff: str, *, old: bool) -> tuple[str, bool]:
    """One side of a unified diff: (text, complete). Complete only for one hunk from the file's top with
    no context lines: a whole file written or removed."""
    keep = "-" if old else "+"
    out: list[str] = []
    hunks, context, gaps = 0, False, False
    for line in diff.splitlines():
        if line.startswith(("--- ", "+++ ", "\\")):
            continue
        if line.startswith("@@"):
            hunks += 1
            first = line.split(" ")[1 if old else 2][1:].split(",")[0]
            if hunks > 1 or first not in ("0", "1"):
                out.append(GAP)
                gaps = True
            continue
        if line.startswith(" "):
            context = True
            out.append(line[1:])
        elif line.startswith(keep):
            out.append(line[1:])
    return "\n".join(out) + ("\n" if out else ""), hunks == 1 and not context and not gaps
