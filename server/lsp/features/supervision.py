"""Host supervision: re-attach to live hosts on start, restart hosts that died while their mission was
running (crash recovery through `resume`, with backoff, bounded), flag stranded missions.

An `offline` mission whose probing host died (it is still recorded: a host that left on its own clears
itself) is restarted the same way when its `models.auto_resume` allows: the new host (`--wait-online`)
probes and resumes by itself when a provider answers. A person's pause is never overridden: a pause
recorded for an offline mission that its host did not act on before it died is applied instead
(`offline.honour_pause`: the mission becomes paused) and no host is started.

Each mission has a small state machine, driven by a tick every 0.1 s over the hub's views (a host can die
without writing to the store, so changes alone would not notice it). Each tick checks the host of a mission
that needs one directly (its pid, and whether anyone holds its host lock: two cheap system calls), not the
watcher's last picture. A live host on this machine is also watched through a pidfd (`hostexits.py`): its exit
wakes the loop at once, and a host whose exit its pidfd told is replaced without a grace period, as soon as a
picture read after the exit still says its mission needs one. A host found gone otherwise (no pidfd, a pid found
missing) is replaced a grace period (0.1 s) after that; a tick falls due exactly when a grace period or a backoff
ends. Only an exit wakes the loop; a slow host never does:

    WATCHING → SUSPECT (running, no live host) → RESTARTING → BACKOFF → (host alive) WATCHING
                                                              BACKOFF → (attempts spent) STRANDED
A live host (or a mission that stopped running) returns any state to WATCHING. An answered question whose
host had already left counts as running: the restart applies the answer. A mission is "dead" only
when neither its recorded host is alive nor its host lock is held, for longer than a short grace period.
A host that is merely slow (stopped, swapping, stuck in a long step) still holds its lock and is never
replaced. A host found gone is suspected only once a picture read after that still says its mission needs
one (the watcher reads one at once): a host that completed the mission, or paused it, wrote that before it
exited, and the picture from before would have it suspected again and again. Before a restart the mission
is read again from the store: a host that stopped on its own (a
pause, a question) has already recorded that, and the restart is dropped, so a person's pause is never
undone by a stale picture. The restart starts the host itself: a fork of the server's host starter
(hoststarter.py), or a new interpreter (`control.spawn_host`) where the server has none; no command in between.
"""

from __future__ import annotations

import enum
import logging
import os
import time
from collections.abc import Iterable

import msgspec
from lsprotocol import types

from keel.protocol.errors import KeelError
from keel.protocol.records import MissionRecord
from keel.protocol.states import MissionState
from keel.server.engine import control, hostlock, offline
from keel.server.engine.files import places
from keel.server.engine.hostlock import HostLock, host_ttl
from keel.server.lsp.features.hostexits import HostExits
from keel.server.lsp.server import KeelServer
from keel.server.lsp.snapshot import MissionView
from keel.storage import Txn
from keel.storage import missions as m
from keel.storage.reach import Reach, gap_for

log = logging.getLogger(__name__)
TICK_S = 0.1
MIN_WAIT_S = 0.005  # the shortest wait between ticks
GRACE_S = 0.1
BACKOFF_S = 1.0
MAX_RESTARTS = 3


class Phase(enum.StrEnum):
    WATCHING = "watching"
    SUSPECT = "suspect"
    RESTARTING = "restarting"
    BACKOFF = "backoff"
    STRANDED = "stranded"


P = Phase
TRANSITIONS = {
    P.WATCHING: frozenset({P.SUSPECT}),
    P.SUSPECT: frozenset({P.WATCHING, P.RESTARTING}),
    P.RESTARTING: frozenset({P.BACKOFF, P.WATCHING}),  # WATCHING: a person's pause came first
    P.BACKOFF: frozenset({P.WATCHING, P.RESTARTING, P.STRANDED}),
    P.STRANDED: frozenset({P.WATCHING}),
}


class HostWatch:
    """One mission's supervision state."""

    def __init__(self, server: KeelServer, mission_id: str, grace_s: float, backoff_s: float) -> None:
        self.server = server
        self.grace_s = grace_s
        self.backoff_s = backoff_s
        self.mission_id = mission_id
        self.phase = P.WATCHING
        self.since = time.monotonic()
        self.attempts = 0
        self.last_error = ""
        self.gone_at: float | None = None  # when (time.monotonic) its host was first found gone

    def _set_state(self, new: Phase) -> None:
        if new not in TRANSITIONS[self.phase]:
            raise RuntimeError(f"supervision of {self.mission_id}: illegal {self.phase} -> {new}")
        log.info("supervision of %s: %s -> %s", self.mission_id, self.phase, new)
        self.phase = new
        self.since = time.monotonic()
        if new is P.WATCHING:
            self.gone_at = None
        self.server.hub.set_stranded(self.mission_id, new is P.STRANDED)

    def step(self, view: MissionView, now: float, silent: bool = False, exited: bool = False) -> None:
        """`silent`: the mission's host is on another machine and its host lease went silent (only when
        this server takes missions over, `takeOver`). `exited`: its pidfd told of the recorded host's exit,
        so no grace period is waited out (the restart still reads the mission again first)."""
        dead = _needs_host(view) and (silent or (not hostlock.host_alive(view.record) and not self._locked()))
        if dead and self.phase is P.WATCHING and not self._seen_since_gone(now):
            return
        if not dead:
            self.gone_at = None
            if self.phase in (P.SUSPECT, P.BACKOFF, P.STRANDED):
                if self.attempts:
                    self.server.log_line(f"[{self.mission_id}] host is running again", types.MessageType.Info)
                self.attempts = 0
                self._set_state(P.WATCHING)
            return
        waited = now - self.since
        if self.phase is P.WATCHING:
            self._set_state(P.SUSPECT)
            waited = 0.0
        if self.phase is P.SUSPECT:
            if exited or waited >= self.grace_s:
                self._restart(view)
        elif self.phase is P.BACKOFF and waited >= self.grace_s + self.backoff_s * 2 ** (self.attempts - 1):
            if self.attempts >= MAX_RESTARTS:
                self._set_state(P.STRANDED)
                self.server.show(
                    f"keel: mission {self.mission_id} is stranded: it is {view.record.state.value} "
                    f"but its host is gone and {self.attempts} restarts failed "
                    f"({self.last_error or 'host exited'})"
                    f" — run `keel resume {self.mission_id}`",
                    types.MessageType.Error,
                )
            else:
                self._restart(view)

    def _seen_since_gone(self, now: float) -> bool:
        """Whether the mission's picture was read after its host was found gone. A host that ended on its
        own (the mission completed, paused, asked) wrote that before it exited, and a picture read earlier
        still says running: only one read later says whether the mission still needs a host."""
        if self.gone_at is None:
            self.gone_at = now
        if self.server.hub.read_at > self.gone_at:
            return True
        if self.server.watcher is not None:
            self.server.watcher.read_again()
        return False

    def due(self, now: float) -> float | None:
        """Seconds until this watch acts next by itself (its grace period or backoff ends, or the picture it
        waits for after its host was found gone may have come), if it waits."""
        if self.phase is P.WATCHING and self.gone_at is not None and now - self.gone_at < TICK_S * 10:
            return 0.0  # the watcher reads the store again at once (`_seen_since_gone`): look again shortly
        if self.phase is P.SUSPECT:
            return self.since + self.grace_s - now
        if self.phase is P.BACKOFF:
            return self.since + self.grace_s + self.backoff_s * 2.0 ** (self.attempts - 1) - now
        return None

    def _locked(self) -> bool:
        lock = HostLock(places.lock_path(self.server.store_path, self.mission_id), self.mission_id)
        return lock.held_elsewhere()

    def _restart(self, view: MissionView) -> None:
        self._set_state(P.RESTARTING)
        self.attempts += 1
        self.server.spawn(self._resume(view), f"restarting mission {self.mission_id}'s host")

    async def _resume(self, view: MissionView) -> None:
        state = view.record.state
        if not await self._still_dead(view) or (state == MissionState.OFFLINE and await self._paused_while_offline()):
            self.attempts = 0
            self._set_state(P.WATCHING)
            return
        self.server.log_line(
            f"[{self.mission_id}] host is gone while {state.value}; restarting it "
            f"(attempt {self.attempts} of {MAX_RESTARTS})",
            types.MessageType.Info,
        )
        try:
            await self.server.blocking(self.server.start_host, self.server.store_path, self.mission_id)
        except (KeelError, OSError) as exc:
            self.last_error = exc.message if isinstance(exc, KeelError) else str(exc)
            self.server.log_line(f"[{self.mission_id}] restart failed: {self.last_error}", types.MessageType.Warning)
        finally:
            self._set_state(P.BACKOFF)

    async def _still_dead(self, view: MissionView) -> bool:
        """The mission as the store has it now still needs the host that is gone: same state, same recorded
        host, nobody holding its lock. Anything else (it stopped on its own, another host took it) wins."""
        store = self.server.require_store()
        record, why = await self.server.blocking(
            store.read, lambda txn: (r := m.get_mission(txn, self.mission_id), control.needs_host(txn, r))
        )
        same = record.state == view.record.state and record.host == view.record.host
        if same and _elsewhere(record):
            return bool(why) and _takes_over(self.server)
        return same and not hostlock.host_alive(record) and not self._locked()

    async def _paused_while_offline(self) -> bool:
        """Apply a pause its dead host left unseen (the mission becomes paused); True when the mission is
        no longer offline, so no host is started for it. Read from the store as it is now, not the view."""
        store = self.server.require_store()
        now = await self.server.blocking(store.write, lambda txn: _honour_pause(txn, self.mission_id))
        if now == MissionState.OFFLINE:
            return False
        self.server.log_line(
            f"[{self.mission_id}] host is gone while offline, but the mission is {now.value} "
            f"(a person paused it): not restarting it",
            types.MessageType.Info,
        )
        return True


def _needs_host(view: MissionView) -> bool:
    """Running (or pausing) missions need a host; so does an answered question whose host already left
    (an answer that raced the host's exit is applied by the host the restart starts), and an offline
    mission that may resume by itself whose host died while probing (a host that stopped on its own, e.g.
    `keel run` without `--wait-online`, is no longer recorded and is not restarted)."""
    record = view.record
    if record.state == MissionState.OFFLINE:
        return record.host is not None and record.spec.models.auto_resume
    return record.state in control.SUPERVISED or (record.state == MissionState.WAITING_INPUT and view.pending_answer)


def _elsewhere(record: MissionRecord) -> bool:
    """The mission's recorded host runs on another machine (a store shared with it: PostgreSQL)."""
    return record.host is not None and bool(record.host.hostname) and record.host.hostname != os.uname().nodename


def _takes_over(server: KeelServer) -> bool:
    """`initializationOptions.takeOver`: this server also starts hosts for running missions of other
    machines whose host lease went silent (their sandboxes are then made here: server/engine/units/moving.py).
    Off by default: a teammate's mission should not move to your machine because their laptop slept."""
    return server.options.get("takeOver") is True


def _silent_elsewhere(server: KeelServer, views: list[MissionView], reach: Reach) -> set[str]:
    """The missions among `views` whose host is on another machine and whose host lease went silent while
    this server could reach the store (`reach`: an outage is no evidence)."""
    store = server.require_store()
    started = time.monotonic()

    def read(txn: Txn) -> set[str]:
        since = reach.note(started, txn.clock())
        return {v.record.id for v in views if control.needs_host(txn, m.get_mission(txn, v.record.id), since)}

    return store.read(read)


def _honour_pause(txn: Txn, mission_id: str) -> MissionState:
    """`offline.honour_pause`, and a pause applied here also forgets the dead host (as a pause made while
    no host runs does), so the paused mission names no host."""
    before = m.get_mission(txn, mission_id).state
    state = offline.honour_pause(txn, mission_id)
    if before == MissionState.OFFLINE and state == MissionState.PAUSED:
        m.put_mission(txn, msgspec.structs.replace(m.get_mission(txn, mission_id), host=None))
    return state


def register(server: KeelServer) -> None:
    watches: dict[str, HostWatch] = {}

    async def supervise() -> None:
        if server.options.get("supervise", True) is False:
            return
        grace_s = _option_s(server, "graceMs", GRACE_S)
        backoff_s = _option_s(server, "backoffMs", BACKOFF_S)
        first = True
        exits = HostExits()
        reach = Reach(gap_for(host_ttl()))
        try:
            while True:
                await exits.wait(_next_tick(watches.values(), time.monotonic()))
                now = time.monotonic()
                if first and server.hub.views:
                    first = False
                    live = [v.record.id for v in server.hub.views.values() if v.host_alive]
                    server.log_line(
                        f"keel: watching {len(server.hub.views)} missions; re-attached to {len(live)} with a live host",
                        types.MessageType.Info,
                    )
                views = list(server.hub.views.items())
                remote = [v for _, v in views if _elsewhere(v.record) and _needs_host(v)] if _takes_over(server) else []
                silent = await server.blocking(_silent_elsewhere, server, remote, reach) if remote else set()
                for mid, view in views:
                    watch = watches.get(mid) or watches.setdefault(mid, HostWatch(server, mid, grace_s, backoff_s))
                    if watch.phase is not P.RESTARTING:
                        watch.step(view, now, silent=mid in silent, exited=exits.exited(view.record.host))
                exits.watch(v for _, v in views if _needs_host(v))
        finally:
            exits.close()

    server.on_ready.append(supervise)


def _next_tick(watches: Iterable[HostWatch], now: float) -> float:
    """Seconds to the next tick: TICK_S, or sooner when a grace period or a backoff ends before that."""
    wait = TICK_S
    for watch in watches:
        due = watch.due(now)
        if due is not None:
            wait = min(wait, max(due, MIN_WAIT_S))
    return wait


def _option_s(server: KeelServer, name: str, default_s: float) -> float:
    value = server.options.get(name)
    return max(0.0, float(value) / 1000) if isinstance(value, int | float) else default_s
