"""The mission control API that the CLI and the language server call: start, pause, resume, answer.

Every request is a durable Control record in the store (a host that crashes after a pause was requested
still honours it on restart) plus, where needed, a mission host started as a detached process. Nothing
here blocks for long: hosts run in their own processes. Depends on storage and the engine's own modules;
never on the language server.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from keel.protocol.errors import ErrorCode, InvalidTransitionError, KeelError, NotFoundError
from keel.protocol.missionfile import load_mission_file
from keel.protocol.records import Control, MissionRecord
from keel.protocol.states import TERMINAL_MISSION_STATES, MissionState, PauseReason, can
from keel.server import background
from keel.server.engine.files import places
from keel.server.engine.hostlock import HostBusyError, HostLock, host_alive, lease_holder_dead
from keel.server.engine.units.unitgc import remove_mission_sandbox
from keel.storage import Store, Txn, hostlease
from keel.storage import missions as m
from keel.storage.location import prepare_keel_dir
from keel.storage.reach import silence


class AnswerError(KeelError):
    code = ErrorCode.USAGE


def create_mission(store: Store, mission_file: Path) -> MissionRecord:
    """Read and check the mission file, record the mission (state created), return its record."""
    mission_file = mission_file.resolve()
    spec = load_mission_file(mission_file)
    workspace = (mission_file.parent / spec.workspace).resolve()
    if not workspace.is_dir():
        raise NotFoundError(f"{mission_file}: workspace {workspace} is not a folder")
    now = time.time()
    record = MissionRecord(
        id=places.new_mission_id(now),
        spec=spec,
        state=MissionState.CREATED,
        created_at=now,
        updated_at=now,
        workspace=str(workspace),
        mission_file=str(mission_file),
        machine=os.uname().nodename,
    )
    store.write(lambda txn: m.put_mission(txn, record))
    return record


def _detached_only(detach: bool) -> None:
    """This module never imports the host (it stays light for the language server): a host in the calling
    process is `host.run_host_blocking`, which `keel run` calls itself."""
    if not detach:
        raise ValueError("control starts mission hosts detached; run one here with host.run_host_blocking")


Starter = Callable[[Path, str], int]  # starts a mission's host detached: (store, mission id) -> its pid


def host_argv(store_path: Path, mission_id: str) -> list[str]:
    """The command line of a detached host (after `keel`): it waits out a network loss by itself
    (`--wait-online`, docs/providers.md)."""
    return ["resume", mission_id, "--store", str(store_path), "--plain", "--wait-online"]


def spawn_host(store_path: Path, mission_id: str) -> int:
    """Start `keel resume ID` as a detached process (own session, output to .keel/logs/<id>.log)."""
    log = places.log_path(store_path, mission_id)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "keel.server.cli", *host_argv(store_path, mission_id)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
            close_fds=True,
        )
    background.lower(proc.pid)  # a detached host is background work (background.py)
    return proc.pid


def start_mission(store_path: Path, mission_file: Path, *, detach: bool, start: Starter = spawn_host) -> str:
    """Create a mission and run it in a detached host, started by `start`; returns at once (`detach` must be
    True)."""
    _detached_only(detach)
    prepare_keel_dir(store_path)
    with Store.open(store_path) as store:
        record = create_mission(store, mission_file)
    start(store_path, record.id)
    return record.id


def queue_mission(store: Store, mission_file: Path) -> MissionRecord:
    """Record a mission running with no host (`keel run --queue`): the first `keel supervise` of the store that
    looks hosts it."""
    record = create_mission(store, mission_file)
    queued: MissionRecord = store.write(lambda t: m.set_mission_state(t, record.id, MissionState.RUNNING))
    return queued


def request_pause(store: Store, mission_id: str, source: str) -> MissionRecord:
    """Record a pause; a running host acknowledges it (state pausing) within ~50 ms and stops at a
    consistent point. A mission whose host is gone is marked paused directly (an offline one too: it
    must then never be resumed by a prober); a host waiting out a network loss sees the control itself.
    A mission just created is left to the host its `keel run` is starting: marked paused before that host
    looked, it would be taken for one a person resumed, and run; its host pauses it first thing instead
    (so does any host that next starts it, should that `keel run` have died first)."""

    def txn_fn(txn: Txn) -> MissionRecord:
        seq = m.add_control(txn, mission_id, Control(action="pause", at=time.time(), source=source))
        record = m.get_mission(txn, mission_id)
        if can(record.state).pause and record.state != MissionState.CREATED and not host_alive(record):
            record = m.set_mission_state(
                txn, mission_id, MissionState.PAUSED, pause_reason=PauseReason.OPERATOR, control_seen=seq, host=None
            )
        return record

    return store.write(txn_fn)


def request_cancel(store: Store, mission_id: str, source: str, *, store_path: Path | None = None) -> MissionRecord:
    """Record a cancel: a running host stops its units at a consistent point and ends the mission
    `cancelled`; a mission whose host is gone (paused, waiting for input, offline, not started) is
    cancelled here. A finished mission cannot be cancelled (InvalidTransitionError says why). With
    `store_path`, a host of this machine on its way out (it paused, or began to, a moment ago) is waited
    out first: it acts on no control any more, so the cancel would wait for the next resume."""
    left = False  # its host, in a state it leaves from, let go of the mission's lock: it reads no control
    if store_path is not None and store.read(lambda t: m.get_mission(t, mission_id)).state in _LEAVING:
        wait_for_stopping_host(store, store_path, mission_id)
        left = not HostLock(places.lock_path(store_path, mission_id), mission_id).held_elsewhere()

    def txn_fn(txn: Txn) -> MissionRecord:
        record = m.get_mission(txn, mission_id)
        if not can(record.state).cancel:
            raise InvalidTransitionError(f"mission {mission_id} is {record.state.value}; there is nothing to cancel")
        seq = m.add_control(txn, mission_id, Control(action="cancel", at=time.time(), source=source))
        if host_alive(record) and not (left and record.state in _LEAVING):
            return record
        return m.set_mission_state(
            txn, mission_id, MissionState.CANCELLED, control_seen=seq, host=None, question=None, pause_reason=None
        )

    return store.write(txn_fn)


def delete_mission(store: Store, store_path: Path, mission_id: str) -> MissionRecord:
    """Forget a finished (completed, failed or cancelled) mission: its records in one transaction, then its
    sandbox worktree. Its branch `keel/<id>` stays (the work is not lost); blobs no other mission reaches
    go with the next `keel gc`. A host that finished the mission a moment ago still writes its last records
    (the final checkpoint, its lease given up): a host of this machine is waited out first, so nothing it
    writes comes back after the delete; one that does not let go, or one on another machine, is refused."""

    def finished(txn: Txn) -> MissionRecord:
        record = m.get_mission(txn, mission_id)
        if record.state not in TERMINAL_MISSION_STATES:
            raise InvalidTransitionError(
                f"mission {mission_id} is {record.state.value}; only a completed, failed or cancelled mission "
                "can be deleted (cancel it first)"
            )
        return record

    def still_held(why: str) -> InvalidTransitionError:
        return InvalidTransitionError(f"mission {mission_id} is {why}; delete it once that host has exited")

    store.read(finished)
    wait_for_stopping_host(store, store_path, mission_id)
    if HostLock(places.lock_path(store_path, mission_id), mission_id).held_elsewhere():
        raise still_held(f"still held by its host after {STOPPING_WAIT_S:g} s")

    def txn_fn(txn: Txn) -> MissionRecord:
        record = finished(txn)
        held = hostlease.live(txn, mission_id)
        if held is not None and not lease_holder_dead(held):
            raise still_held(f"still held by its host (pid {held.pid} on {held.hostname or '?'})")
        m.delete_mission_records(txn, mission_id)
        return record

    record = store.write(txn_fn)
    remove_mission_sandbox(store_path, record)
    return record


def pause_all(store: Store, source: str) -> list[str]:
    """Pause every mission that is running (or about to); returns their ids."""
    ids = [r.id for r in store.read(m.list_missions) if can(r.state).pause]
    for mission_id in ids:
        request_pause(store, mission_id, source)
    return ids


STOPPING_WAIT_S = 30.0
# a host still alive in these states is stopping: it ends without reading another control
_LEAVING = frozenset({MissionState.PAUSING, MissionState.PAUSED, MissionState.WAITING_INPUT})


def _stopping(txn: Txn, record: MissionRecord) -> bool:
    """Whether the mission's host, if one runs, is on its way out: it has left `running` (paused,
    waiting for an answer, finished) or a pause it has not acted on yet is recorded."""
    if record.state not in (MissionState.RUNNING, MissionState.CREATED):
        return True
    return any(c.action == "pause" for _, c in m.controls_after(txn, record.id, record.control_seen))


def wait_for_stopping_host(store: Store, store_path: Path, mission_id: str, timeout: float = STOPPING_WAIT_S) -> None:
    """Let a host of this machine that is stopping finish stopping, so `keel pause ID; keel resume ID`
    resumes instead of finding the lock still held for the host's last milliseconds. Returns at once when
    no host of this machine holds the mission's lock or the one that does is not stopping (the caller
    then refuses as before), and after `timeout` at most. Another machine's host is never waited for:
    its live lease refuses at once, as it says who holds it."""
    lock = HostLock(places.lock_path(store_path, mission_id), mission_id)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and lock.held_elsewhere():
        if not store.read(lambda t: _stopping(t, m.get_mission(t, mission_id))):
            return
        time.sleep(0.05)


def resume(store_path: Path, mission_id: str, *, detach: bool = True, start: Starter = spawn_host) -> int:
    """Continue a paused, failed or crashed mission in a detached host (started by `start`); returns its pid.
    A host still stopping (paused a moment ago) is waited out first."""
    _detached_only(detach)
    with Store.open(store_path, create=False) as store:
        record = store.read(lambda t: m.get_mission(t, m.resolve_mission_id(t, mission_id)))
        wait_for_stopping_host(store, store_path, record.id)
        record = store.read(lambda t: m.get_mission(t, record.id))
        held, now = store.read(lambda t: (hostlease.live(t, record.id), t.clock()))
    if held is not None and not lease_holder_dead(held):  # a host on another machine sharing the store
        raise hostlease.HostLeaseHeldError(held, now - held.heartbeat)
    if HostLock(places.lock_path(store_path, record.id), record.id).held_elsewhere():
        raise HostBusyError(f"mission {record.id} is already running; pause it with `keel pause {record.id}`")
    if not can(record.state).host:
        raise InvalidTransitionError(f"mission {record.id} was cancelled; it cannot be resumed")
    return start(store_path, record.id)


SUPERVISED = frozenset({MissionState.RUNNING, MissionState.PAUSING})


def needs_host(txn: Txn, record: MissionRecord, since: float = 0.0) -> str:
    """Why a supervisor should start a host for this mission ("" when it needs none): it is running, and
    its host lease went silent past its ttl by the store's clock (the host's machine died, froze or lost
    the network), was given up by a host that stopped without finishing, or is held by a host of this
    machine that no longer runs. A live lease is never taken, however slow its host is. Silence counts only
    from `since`, the store's clock since which the caller has reached the store without a gap
    (storage/reach.py): while the store was away nobody could beat, so an outage is no evidence."""
    if record.state not in SUPERVISED:
        return ""
    lease = hostlease.get(txn, record.id)
    if lease is None:
        return "" if host_alive(record) else "no host runs it"
    who = f"host pid {lease.pid} on {lease.hostname or '?'}"
    if lease.heartbeat == 0.0:
        return f"its {who} stopped without finishing it"
    silent = silence(lease.heartbeat, txn.clock(), since)
    if silent > lease.ttl_s:
        return f"its {who} has been silent for {silent:.1f} s (its lease lasts {lease.ttl_s:g} s)"
    return f"its {who} is gone" if lease_holder_dead(lease) else ""


def answer(
    store_path: Path, mission_id: str, text: str, source: str, resume: bool = True, start: Starter = spawn_host
) -> MissionRecord:
    """Record the person's answer to the mission's question durably, then resume it (detached)."""
    with Store.open(store_path, create=False) as store:

        def txn_fn(txn: Txn) -> MissionRecord:
            mid = m.resolve_mission_id(txn, mission_id)
            record = m.get_mission(txn, mid)
            question = record.question
            if record.state != MissionState.WAITING_INPUT or question is None:
                raise AnswerError(f"mission {mid} is {record.state.value}; it is not waiting for an answer")
            if question.choices and text not in question.choices:
                raise AnswerError(
                    f"mission {mid} asks {question.text!r}: answer one of {', '.join(question.choices)} (got {text!r})"
                )
            m.add_control(txn, mid, Control(action="answer", at=time.time(), text=text, source=source))
            return record

        record = store.write(txn_fn)
    if resume and not HostLock(places.lock_path(store_path, record.id), record.id).held_elsewhere():
        start(store_path, record.id)
    return record
