"""An appending agent's lane read back by its recorder (units/recorder.py): a page at a time into its
`Lookback`, never held whole, and judged by the pages `Recorder.page` gives exactly as the whole lane would
judge it, an earlier model answer read back from the store."""

from __future__ import annotations

import asyncio
import tracemalloc
from pathlib import Path
from typing import Any, cast

import msgspec
import pytest

from keel.protocol.records import JournalEntry
from keel.server.engine.interface import Host
from keel.server.engine.step.core import Request, next_step
from keel.server.engine.step.effects import Effect
from keel.server.engine.units.recorder import PAGE, Recorder
from keel.server.engine.units.workerproc import history_line
from keel.storage import Store
from keel.storage import missions as m

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL

MISSION, UNIT = "mlookback", "u"
ENTRIES = 6 * PAGE + 17
EFFECTS = [Effect("run", f"make t{n}") for n in range(50)]


class _Port:
    """What a recorder reads of its host while it loads a lane: the store, the mission, the sandbox."""

    def __init__(self, store: Store, sandbox: Path) -> None:
        self.store, self.mission_id, self.sandbox = store, MISSION, sandbox


def _entry(seq: int) -> JournalEntry:
    if seq % 5 < 3:  # a paid model request: an 8 KB answer
        result: dict[str, Any] = {
            "session": "s",
            "ordinal": seq % 7,
            "body": f"event: message_stop {seq} " + "x" * 8000,
        }
        return JournalEntry(seq=seq, kind="model/forward", fingerprint=f"fp{seq % 11}", result=result)
    mark = EFFECTS[seq % len(EFFECTS)].mark(f"f{seq % 4}")
    if seq % 5 == 3:
        mark = msgspec.structs.replace(mark, after=f"f{(seq + 1) % 4}")
    return JournalEntry(
        seq=seq, kind="effect/ask", fingerprint=f"e{seq}", phase="done" if seq % 5 == 3 else "intent", effect=mark
    )


def test_an_appending_agents_lane_is_read_a_page_at_a_time_and_judged_as_the_whole_lane(tmp_path: Path) -> None:
    with Store.open(tmp_path / "store") as store:
        for start in range(1, ENTRIES + 1, 500):
            store.write(
                lambda t, s=start: [
                    m.journal_put(t, MISSION, UNIT, _entry(n)) for n in range(s, min(s + 500, ENTRIES + 1))
                ]
            )
        whole = {e.seq: e for e in store.read(lambda t: m.journal_entries(t, MISSION, UNIT))}
        tracemalloc.start()
        kept = {e.seq: e for e in store.read(lambda t: m.journal_entries(t, MISSION, UNIT))}
        held = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        del kept

        async def load() -> tuple[Recorder, tuple[str, ...], int]:
            recorder = Recorder(cast(Host, _Port(store, tmp_path)), UNIT, UNIT)
            await recorder.open()
            recorder.appending = True
            tracemalloc.start()
            said = await recorder.load_all(history_line)
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            return recorder, said, peak

        recorder, said, peak = asyncio.run(load())
        assert said == tuple(history_line(whole[seq]) for seq in sorted(whole))
        assert recorder.loaded == ENTRIES
        assert set(recorder.entries) == {s for s, e in whole.items() if e.phase == "intent"}  # no answers held
        assert peak < held / 3, f"loading held {peak} bytes at once; the whole lane is {held}"

        requests = [Request(ENTRIES + 1, "model/forward", f"fp{n}", ordinal=o) for n in range(12) for o in range(8)]
        requests += [
            Request(ENTRIES + 1, "effect/ask", "new", effect, files=f"f{n}")
            for effect in EFFECTS[:10]
            for n in range(5)
        ]

        async def judged() -> None:
            for request in requests:
                page = await recorder.page(request)
                assert next_step(page, request, True) == next_step(whole, request, True), request

        asyncio.run(judged())
