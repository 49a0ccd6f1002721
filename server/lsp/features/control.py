"""Mission control commands (`workspace/executeCommand`): start, pause, resume, cancel, delete, pause
all, answer, restore, verify. Pauses go straight to the store (durable Control records); operations that open the
store by path or start hosts run through enginecall in a child process. Each returns a MissionSummary
(or the documented object) once the server's picture includes the action; pause, resume and answer wait
(at most ACK_S) for the mission to move — the host's acknowledgement (`pausing`, `running`…) — so the answer
is never the state the person just asked to leave."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from keel.protocol.records import MissionRecord
from keel.protocol.states import MissionState, can
from keel.server.engine import control as engine
from keel.server.lsp import enginecall
from keel.server.lsp.errors import arg_dict, arg_str, describe, invalid, no_more_args
from keel.server.lsp.features.missions import summary_json
from keel.server.lsp.server import KeelServer, handler
from keel.server.lsp.snapshot import MissionView, read_view, resolve
from keel.storage import Store
from keel.storage.verify import verify_all

SOURCE = "lsp"
START, PAUSE, RESUME, PAUSE_ALL = "keel.startMission", "keel.pause", "keel.resume", "keel.pauseAll"
ANSWER, RESTORE, VERIFY = "keel.answer", "keel.restore", "keel.verifyStore"
CANCEL, DELETE = "keel.cancel", "keel.delete"
MISSION_ID = "a mission id"
ACK_S = 10.0  # how long pause, resume and answer wait for the host to take the request up
PAUSABLE = frozenset(state for state in MissionState if can(state).pause)
# a resume moves it on: it waits for one, or it is not finished (a host that crashed is replaced)
RESUMABLE = frozenset(state for state in MissionState if can(state).resume or not can(state).terminal)
CANCELLABLE = frozenset(state for state in MissionState if can(state).cancel)
STAY_RUNNING = frozenset({MissionState.RUNNING, MissionState.PAUSING, MissionState.OFFLINE})


def _mission_file(root: Path, text: str) -> Path:
    path = Path(text).expanduser()
    path = path if path.is_absolute() else root / path
    if not path.is_file():
        raise invalid(f"{START}: mission file {path} does not exist")
    return path


def register(server: KeelServer) -> None:
    @server.command(START)
    @handler(server, START)
    async def start(ls: KeelServer, *args: Any) -> Any:
        text = arg_str(START, args, 0, "a mission file path")
        no_more_args(START, args, 1)
        assert text is not None
        path = await asyncio.to_thread(_mission_file, ls.workspace_root, text)
        ls.require_store()  # create it here, so the watcher sees the mission appear
        mission_id = await ls.blocking(enginecall.call, ls.store_path, "start", str(path))
        return await summary_after(ls, mission_id)

    @server.command(PAUSE)
    @handler(server, PAUSE)
    async def pause(ls: KeelServer, *args: Any) -> Any:
        return await _record_control(ls, _one_id(PAUSE, args), engine.request_pause, PAUSABLE)

    @server.command(RESUME)
    @handler(server, RESUME)
    async def resume(ls: KeelServer, *args: Any) -> Any:
        before = (await ls.blocking(read_view, ls.require_store(), _one_id(RESUME, args))).record
        await ls.blocking(enginecall.call, ls.store_path, "resume", before.id)
        return await summary_after(ls, before.id, moved_from=before if before.state in RESUMABLE else None)

    @server.command(CANCEL)
    @handler(server, CANCEL)
    async def cancel(ls: KeelServer, *args: Any) -> Any:
        cancel = functools.partial(engine.request_cancel, store_path=ls.store_path)
        return await _record_control(ls, _one_id(CANCEL, args), cancel, CANCELLABLE)

    @server.command(DELETE)
    @handler(server, DELETE)
    async def delete(ls: KeelServer, *args: Any) -> Any:
        text = _one_id(DELETE, args)

        def run() -> str:
            store = ls.require_store()
            return engine.delete_mission(store, ls.store_path, resolve(store, text)).id

        mid = await ls.blocking(run)
        if ls.watcher is not None:  # answered once this server's views (`keel/missions`) no longer hold it
            await ls.watcher.current()
        return {"deleted": mid}

    @server.command(PAUSE_ALL)
    @handler(server, PAUSE_ALL)
    async def pause_all(ls: KeelServer, *args: Any) -> Any:
        no_more_args(PAUSE_ALL, args, 0)
        ids = await ls.blocking(engine.pause_all, ls.require_store(), SOURCE)
        ls.changed()
        return {"paused": list(ids)}

    @server.command(ANSWER)
    @handler(server, ANSWER)
    async def answer(ls: KeelServer, *args: Any) -> Any:
        text = arg_str(ANSWER, args, 0, MISSION_ID)
        reply = args[1] if len(args) > 1 else None
        if not isinstance(reply, str):
            got = "" if len(args) < 2 else f", got {describe(reply)}"
            raise invalid(f"{ANSWER} expects the answer text string as argument 2{got}")
        no_more_args(ANSWER, args, 2)
        assert text is not None
        return await answer_mission(ls, text, reply)

    @server.command(RESTORE)
    @handler(server, RESTORE)
    async def restore(ls: KeelServer, *args: Any) -> Any:
        text = arg_str(RESTORE, args, 0, MISSION_ID)
        point = arg_str(RESTORE, args, 1, "a restore point id (like p3)")
        options = arg_dict(RESTORE, args, 2, 'an options ({"files": bool})')
        no_more_args(RESTORE, args, 3)
        assert text is not None and point is not None
        files = options.get("files", False)
        if not isinstance(files, bool):
            raise invalid(f'{RESTORE} expects "files" to be a boolean in argument 3, got {describe(files)}')
        mid = await ls.blocking(resolve, ls.require_store(), text)
        await ls.blocking(enginecall.restore, ls.store_path, mid, point, files)
        return await summary_after(ls, mid)

    @server.command(VERIFY)
    @handler(server, VERIFY)
    async def verify(ls: KeelServer, *args: Any) -> Any:
        no_more_args(VERIFY, args, 0)
        store = ls.store()
        if store is None:
            return {"ok": True, "records": 0, "problems": []}
        report = await ls.blocking(verify_all, store)
        problems = [{"db": p.db, "key": p.key, "message": p.message} for p in report.problems]
        return {"ok": report.ok, "records": report.records, "problems": problems}


async def answer_mission(ls: KeelServer, text: str, reply: str) -> Any:
    """Record an answer and resume (shared by keel.answer and the showMessageRequest path)."""
    before = (await ls.blocking(read_view, ls.require_store(), text)).record
    await ls.blocking(enginecall.call, ls.store_path, "answer", before.id, reply)
    return await summary_after(ls, before.id, moved_from=before)


async def _record_control(
    ls: KeelServer, text: str, request: Callable[[Store, str, str], object], movable: frozenset[MissionState]
) -> Any:
    """A pause or cancel: a durable control record written straight to the store (in a thread); the answer
    is the state the mission moved to when it was in one of `movable`."""

    def run() -> MissionRecord:
        store = ls.require_store()
        before = read_view(store, text).record
        request(store, before.id, SOURCE)
        return before

    before = await ls.blocking(run)
    return await summary_after(ls, before.id, moved_from=before if before.state in movable else None)


def _one_id(name: str, args: tuple[Any, ...]) -> str:
    text = arg_str(name, args, 0, MISSION_ID)
    no_more_args(name, args, 1)
    assert text is not None
    return text


async def summary_after(ls: KeelServer, mission_id: str, *, moved_from: MissionRecord | None = None) -> Any:
    """The mission's summary once the server's picture includes what was just recorded; with `moved_from`,
    once the mission has moved on from that record (`_moved`), for at most ACK_S."""
    if ls.watcher is not None:
        await ls.watcher.current()
        if moved_from is not None:
            await ls.hub.until(mission_id, functools.partial(_moved, moved_from), ACK_S)
    view = ls.hub.views.get(mission_id)
    if view is None:  # not watching (yet): read it
        view = await ls.blocking(read_view, ls.require_store(), mission_id)
    return summary_json(ls, view)


def _moved(before: MissionRecord, view: MissionView) -> bool:
    """A new state; or, for a mission that stays running (a resumed one whose host had died), a new host."""
    new = view.record
    return new.state != before.state or (new.state in STAY_RUNNING and new.host != before.host and view.host_alive)
