"""Replay in the worker: a unit's recorded answers, handed to its worker so that a restarted agent's
requests are answered next to it rather than one round trip through the host each.

The host (`unitrun.UnitSession`), just before it sends `unit/run` to a replaying agent, sends the worker a
`keel/replay` notification: its journal's entries 1..n that are `done` without an error, each as (seq,
fingerprint, answer), up to the first entry that is not (an intent, an error, a gap) and within a size
budget. The worker (`subagent.py`) numbers the agent's requests as the host does and answers request k
itself only while entry k of that table has the request's fingerprint (`journal.request_fingerprint`,
the host's own function). At the first frame from the agent it does not answer that way — a request that
does not match or lies past the table, a notification, a response — it stops answering for good, sends
the host `keel/replayed` with how many it answered, and passes that frame and every later one through.
The host numbers on from there (`UnitSession.replayed_by_worker`), so the request that stopped the worker
meets the host's own replay and nondeterminism checks, and everything else (intents, effects, errors,
appending agents, which get no table) stays with the host. A worker answers only what the journal
recorded as done, so it makes no effect and writes nothing. The rule it answers by is the host's own
(`core.by_position`). Depends on protocol, `journal.py` and `core.py` only.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import msgspec

from keel.protocol import rpc
from keel.protocol.framing import DEFAULT_MAX_SIZE
from keel.protocol.records import JournalEntry
from keel.server.engine.journal import request_fingerprint
from keel.server.engine.step.core import Act, by_position

REPLAY = "keel/replay"  # host -> worker, never forwarded to the agent: params `ReplayTable`
REPLAYED = "keel/replayed"  # worker -> host: {"count": requests the worker answered}; never taken from an agent
TABLE_BUDGET = DEFAULT_MAX_SIZE // 4  # answers' JSON bytes in one table: well inside a frame's limit


class ReplayTable(msgspec.Struct, frozen=True):
    """Entries k+1..n of a lane, the agent's requests from its first on: (seq, fingerprint, the answer's JSON)."""

    entries: list[tuple[int, str, msgspec.Raw]]


@dataclass(frozen=True, slots=True)
class _Row:
    """A row of the table as the replay rule (core.by_position) sees it: a done entry without an error."""

    fingerprint: str
    phase: str = "done"


class _ReplayNotice(msgspec.Struct, frozen=True):
    method: str
    params: ReplayTable
    jsonrpc: str = rpc.JSONRPC


class _Answer(msgspec.Struct, frozen=True):
    id: rpc.Id
    result: msgspec.Raw
    jsonrpc: str = rpc.JSONRPC


_encoder = msgspec.json.Encoder()
_notice = msgspec.json.Decoder(_ReplayNotice)


def replay_notice(entries: Iterable[JournalEntry], after: int = 0, budget: int = TABLE_BUDGET) -> tuple[bytes, int]:
    """The `keel/replay` message for a lane's entries (any order), and how many entries it holds (0: none
    worth sending). Only a leading run after+1, after+2, ... of done entries without an error is in it:
    `after` is where the agent's requests start (a resuming agent's saved state's entry; else 0)."""
    by_seq = {e.seq: e for e in entries}
    table: list[tuple[int, str, msgspec.Raw]] = []
    used = 0
    while (entry := by_seq.get(after + len(table) + 1)) is not None and entry.phase == "done" and not entry.error:
        answer = _encoder.encode(entry.result)
        used += len(answer) + len(entry.fingerprint) + 32
        if used > budget:
            break
        table.append((entry.seq, entry.fingerprint, msgspec.Raw(answer)))
    if not table:
        return b"", 0
    return _encoder.encode(_ReplayNotice(method=REPLAY, params=ReplayTable(table))), len(table)


def is_replay_notice(message: rpc.Message) -> bool:
    return isinstance(message, rpc.Notification) and message.method == REPLAY


class WorkerReplay:
    """The worker's side: answers the agent's requests from a table while they match, then hands over."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the host's and the agent's reader threads both come here
        self._table: list[tuple[int, str, msgspec.Raw]] = []
        self._active = False
        self._over = False  # a request of the agent's has reached the host: no table is taken after that
        self.answered = 0

    def load(self, body: bytes) -> bool:
        """Take the host's table (the body of a `keel/replay` notification); False when it comes too late
        (a request of the agent's already went to the host) or is malformed: then the host answers all."""
        try:
            table = _notice.decode(body).params.entries
        except msgspec.DecodeError:
            return False
        with self._lock:
            if self._over or self._active:
                return False
            self._table, self._active = table, True
            return True

    def answer(self, message: rpc.Message) -> bytes | None:
        """The response body to send the agent for this frame of its own, or None: the frame goes to the
        host (after `handover()`'s notice, when there is one)."""
        with self._lock:
            if self._active and isinstance(message, rpc.Request) and self.answered < len(self._table):
                seq, fp, result = self._table[self.answered]
                row = _Row(fp) if seq == self._table[0][0] + self.answered else None
                if by_position(row, request_fingerprint(message.method, message.params)) is Act.ANSWER:
                    self.answered += 1
                    return _encoder.encode(_Answer(id=message.id, result=result))
            return None

    def handover(self, message: rpc.Message) -> bytes | None:
        """Called before a frame of the agent's goes to the host: the `keel/replayed` body to send first,
        once, if this worker answered anything; from now on every frame goes to the host."""
        with self._lock:
            if isinstance(message, rpc.Request):  # the host numbers it: a table now would number it again
                self._over = True
            if not self._active:
                return None
            self._active, self._table = False, []
            if self.answered == 0:
                return None
            return rpc.encode(rpc.Notification(method=REPLAYED, params={"count": self.answered}))


def replayed_count(params: Any) -> int:
    """The count a `keel/replayed` notification carries, or -1 when it carries none."""
    count = params.get("count") if isinstance(params, dict) else None
    return count if isinstance(count, int) and not isinstance(count, bool) else -1
