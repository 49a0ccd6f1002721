"""`$/progress`: one work-done progress per running mission, token `keel/mission/<id>/<run>`.

Each mission's progress is a small state machine (IDLE → CREATING → ACTIVE → IDLE): the token is created
with `window/workDoneProgress/create` (asynchronous), and changes that arrive meanwhile are kept, so the
`begin` carries the newest view and a mission that already stopped gets its `end` right after. Only for
clients that announce `window.workDoneProgress`; the others (eglot 1.9 in Emacs 28) get a
`window/logMessage` (Info) whenever a mission's state or percentage changes.
"""

from __future__ import annotations

import enum
import logging

from lsprotocol import types

from keel.protocol.states import MissionState
from keel.server.lsp import convert
from keel.server.lsp.server import KeelServer
from keel.server.lsp.snapshot import MissionView

log = logging.getLogger(__name__)
ACTIVE_STATES = frozenset({MissionState.RUNNING, MissionState.PAUSING})


class Phase(enum.StrEnum):
    IDLE = "idle"
    CREATING = "creating"
    ACTIVE = "active"


TRANSITIONS = {
    Phase.IDLE: frozenset({Phase.CREATING}),
    Phase.CREATING: frozenset({Phase.ACTIVE, Phase.IDLE}),
    Phase.ACTIVE: frozenset({Phase.IDLE}),
}


class MissionProgress:
    def __init__(self, server: KeelServer, mission_id: str) -> None:
        self.server = server
        self.mission_id = mission_id
        self.runs = 0
        self.token = ""
        self.phase = Phase.IDLE
        self.latest: MissionView | None = None
        self.shown: tuple[str, int] | None = None  # the last (message, percentage) sent

    def _set_state(self, new: Phase) -> None:
        if new not in TRANSITIONS[self.phase]:
            raise RuntimeError(f"progress {self.token}: illegal {self.phase} -> {new}")
        log.debug("progress %s: %s -> %s", self.token, self.phase, new)
        self.phase = new

    def update(self, view: MissionView) -> None:
        self.latest = view
        active = view.record.state in ACTIVE_STATES
        if self.phase is Phase.IDLE and active:
            self._set_state(Phase.CREATING)
            self.runs += 1  # a fresh token per run: clients may not reuse one after `end`
            self.token = f"keel/mission/{self.mission_id}/{self.runs}"
            self.server.spawn(self._create(), f"progress for mission {view.record.id}")
        elif self.phase is Phase.ACTIVE:
            if active:
                self._report(view)
            else:
                self._end(view)

    async def _create(self) -> None:
        try:
            await self.server.work_done_progress.create_async(self.token)
        except Exception:
            self._set_state(Phase.IDLE)
            raise
        view = self.latest
        assert view is not None
        self._set_state(Phase.ACTIVE)
        self.shown = (convert.progress_message(view), convert.summary(view).percentage)
        self.server.work_done_progress.begin(
            self.token,
            types.WorkDoneProgressBegin(
                title=f"keel: {view.record.spec.name}",
                cancellable=False,
                message=self.shown[0],
                percentage=self.shown[1],
            ),
        )
        if view.record.state not in ACTIVE_STATES:
            self._end(view)

    def _report(self, view: MissionView) -> None:
        shown = (convert.progress_message(view), convert.summary(view).percentage)
        if shown != self.shown:
            self.shown = shown
            self.server.work_done_progress.report(
                self.token, types.WorkDoneProgressReport(message=shown[0], percentage=shown[1])
            )

    def _end(self, view: MissionView) -> None:
        self._set_state(Phase.IDLE)
        self.shown = None
        self.server.work_done_progress.end(self.token, types.WorkDoneProgressEnd(message=convert.state_text(view)))
        self.server.work_done_progress.tokens.pop(self.token, None)


def register(server: KeelServer) -> None:
    bars: dict[str, MissionProgress] = {}

    def on_change(old: MissionView | None, new: MissionView) -> None:
        window = server.client_capabilities.window
        if window is None or not window.work_done_progress:
            _log_progress(server, old, new)
            return
        bar = bars.get(new.record.id)
        if bar is None:
            if new.record.state not in ACTIVE_STATES:
                return
            bar = bars[new.record.id] = MissionProgress(server, new.record.id)
        bar.update(new)

    server.hub.subscribe(on_change)


def _log_progress(server: KeelServer, old: MissionView | None, new: MissionView) -> None:
    """Progress for clients without `$/progress`: `keel: two (m1…) running · b second · 1/2 (50%)` at each
    change of state or of units done, as a `window/showMessage`: a client that does not announce
    `window.workDoneProgress` ignores `$/progress` (eglot 1.9, Emacs 28's, and its `window/logMessage`
    too), but shows a message."""
    if old is None:  # found when the server started, or new: its first change is logged
        return
    percentage = convert.summary(new).percentage
    if old.record.state == new.record.state and convert.summary(old).percentage == percentage:
        return
    r = new.record
    where = convert.progress_message(new) if r.state in ACTIVE_STATES else convert.state_text(new)
    server.show(f"keel: {r.spec.name} ({r.id}) {where} ({percentage}%)", types.MessageType.Info)
