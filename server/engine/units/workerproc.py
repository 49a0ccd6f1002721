"""The worker process of one unit's run, as its host drives it: started with its agent behind it,
initialized, handed the replay table, sent `unit/run`, and closed with every process of its run.

`WorkerProcess` knows processes and messages only; what the agent's requests get is the unit's session's
(`unitrun.UnitSession.handle`, the handler it is started with). Closing it kills every process of its run
(runtree.py): whatever its agent started, also what left the agent's process group or session, is gone
before the unit goes on or is judged. Depends on protocol and the engine's agentproc, files, interface,
step and units/runtree, units/subagent modules.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from keel.protocol import agent as ap
from keel.protocol.records import JournalEntry
from keel.protocol.spec import UnitSpec
from keel.server.engine.agentproc import AgentError, AgentProcess, Handler, resolve_command
from keel.server.engine.files import places
from keel.server.engine.interface import Host
from keel.server.engine.step.effects import effect_outcome
from keel.server.engine.step.replay import replay_notice
from keel.server.engine.units import forkedworker
from keel.server.engine.units.runtree import TAG_VAR, RunTree, unit_key

INIT_TIMEOUT_S = 60  # an agent that does not answer `initialize` within this is not one


class WorkerProcess:
    def __init__(self, host: Host, unit: UnitSpec, lane: str) -> None:
        self.host = host
        self.unit = unit
        self.lane = lane
        self.proc: AgentProcess | None = None
        self.tree = RunTree(unit_key(host.store_path, host.mission_id, unit.id), 0)  # the run's processes
        self.handed = 0  # entries 1..handed were sent to the worker to answer (replay.py), until it reports

    async def start(
        self,
        epoch: int,
        sandbox: Path,
        ttl: float,
        handler: Handler,
        on_notice: Callable[[str, Any], None],
        hide_env: frozenset[str],
    ) -> AgentProcess:
        """Start the worker under lease `epoch`, in its run's cgroup, with the unit's agent behind it."""
        host = self.host
        self.tree = RunTree(self.tree.key, epoch)
        self.handed = 0
        cgroup = await asyncio.to_thread(self.tree.prepare)
        args = (
            *("--store", str(host.store_path), "--mission", host.mission_id, "--unit", self.unit.id),
            *("--epoch", str(epoch), "--sandbox", str(sandbox), "--ttl", str(ttl), "--cgroup", str(cgroup or "")),
            "--",
            *resolve_command(host.spec.agent),
        )
        self.proc = await AgentProcess.start(
            (sys.executable, "-m", "keel.server.engine.units.subagent", *args),
            cwd=sandbox,
            env={**host.spec.env, TAG_VAR: self.tree.tag},
            handler=handler,
            name=self.unit.id,
            hide_env=hide_env,
            opens_store=True,
            log=places.agent_log_path(host.store_path, host.mission_id, self.unit.id),
            on_notice=on_notice,
            fork=forkedworker.fork_worker,  # a fork of this host process's worker starter, once it is ready
        )
        return self.proc

    async def initialize(self, proc: AgentProcess, sandbox: Path) -> ap.InitializeResult:
        host = self.host
        init = ap.InitializeParams(
            protocol_version=ap.PROTOCOL_VERSION, mission_id=host.mission_id, goal=host.spec.goal, sandbox=str(sandbox)
        )
        hello = await asyncio.wait_for(proc.request("initialize", init), timeout=INIT_TIMEOUT_S)
        return msgspec.convert(hello, ap.InitializeResult)

    async def hand_replay(
        self, proc: AgentProcess, entries: list[JournalEntry], after: int, numbered: Callable[[], int]
    ) -> None:
        """Send the worker the table of answers it may give the agent itself (replay.py): entries after+1
        on, `after` being where the agent's requests start; unless they are already being numbered here
        (`numbered()` > 0). The table's bytes are not held past the send."""
        notice, handed = await asyncio.to_thread(replay_notice, entries, after)
        if notice and numbered() == 0:
            self.handed = handed
            proc.send_body(notice)

    async def run_unit(
        self,
        proc: AgentProcess,
        attempt: int,
        state: Any,
        top: int,
        history: tuple[str, ...],
        resumed_at: int = 0,
    ) -> Any:
        """Send `unit/run` and wait for its answer, within the unit's timeout_s (TimeoutError past it);
        `history`: an appending agent's journal in words (`history_line`), oldest first; `resumed_at`: the entry a
        resuming agent's `state` was saved at."""
        host = self.host
        home = places.unit_home_path(host.store_path, host.mission_id, self.lane)
        await asyncio.to_thread(home.mkdir, parents=True, exist_ok=True)
        params = ap.UnitRunParams(
            unit=self.unit,
            attempt=attempt,
            state=state,
            replaying=top > resumed_at,
            resumed_at=resumed_at,
            home=str(home),
            history=history,
            tools=tuple(host.spec.permissions.tools),
        )
        return await asyncio.wait_for(proc.request("unit/run", params), timeout=self.unit.timeout_s)

    def expire(self) -> AgentProcess | None:
        """The lease was taken over: stop waiting for this worker (it is fenced, not killed); the caller
        keeps the returned process to kill when the host stops."""
        proc, self.proc = self.proc, None
        if proc is not None:
            proc._fail(AgentError(f"the lease of unit {self.unit.id} expired", died=True))
        return proc

    def fail(self, error: AgentError) -> None:
        if self.proc is not None:
            self.proc._fail(error)

    async def close(self) -> None:
        """Stop the worker, and every process of its run with it (runtree.py)."""
        if self.proc is not None:
            proc, self.proc = self.proc, None
            await proc.close(grace=1.0)
            await asyncio.to_thread(self.tree.end)

    async def end_others(self) -> None:
        """Before an effect in doubt is judged or made again: every process of the unit's other runs on this
        machine (an earlier worker's leftovers, a fenced worker's) is gone, so none makes it afterwards."""
        await asyncio.to_thread(self.tree.end_others)


def saved_state(saved: JournalEntry | None) -> Any:
    """The agent state the newest `state/save` entry holds, for `unit/run`."""
    return saved.result.get("state") if saved is not None and isinstance(saved.result, dict) else None


def history_line(entry: JournalEntry) -> str:
    """One journal entry in words, for an appending agent picking up its unit again; an effect with its
    outcome as recorded."""
    if entry.effect is not None:
        return f"{entry.seq} {entry.kind}: {entry.effect.text} - {effect_outcome(entry)}"
    state = "" if entry.phase == "done" else " (started, no result recorded)"
    return f"{entry.seq} {entry.kind}: {entry.summary or entry.error or ''}{state}".strip()
