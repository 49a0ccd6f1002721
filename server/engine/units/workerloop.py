"""The loops of a unit's worker process (subagent.py starts it and its agent, then runs `serve`): frames both
ways between the host and the agent, replay answered next to the agent, the lease's heartbeat, the unit's
completion recorded under its epoch, and every way out. What each does, and why, is subagent.py's docstring.
Depends on storage, protocol and the engine's files, step and units/runtree modules; never on the host.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO, cast

from keel.protocol import rpc
from keel.protocol.agent import AGENT_ERROR, ERR_DISK_FULL
from keel.protocol.errors import DiskFullError, KeelError, ProtocolError
from keel.protocol.framing import frame, read_frame
from keel.protocol.records import Event
from keel.server.engine.files.merge import clear_stale_locks, commit_unit
from keel.server.engine.files.trees import Snapshotter
from keel.server.engine.step.replay import REPLAYED, WorkerReplay, is_replay_notice
from keel.server.engine.units import runtree
from keel.server.engine.units.agentfork import AgentChild
from keel.storage import Store, Txn, leases
from keel.storage import missions as m

EXIT_ORPHANED, EXIT_LEASE_LOST, EXIT_AGENT_GONE, EXIT_DISK_FULL = 70, 71, 72, 73
EXIT_NO_STORE = 74  # the store could not be opened (no password, a role refused): its last stderr line says why
# a worker that finds its lease lost waits this long before it exits, so that a completion its agent already
# sent is still tried and its rejection recorded (lease/rejected); a fenced worker can make no effect meanwhile:
# the host no longer answers it and every journal write of its epoch is refused
GRACE_S = 5.0
_READ_BUFFER = 64 * 1024


class Worker:
    def __init__(self, store: Store, args: argparse.Namespace, agent: AgentChild) -> None:
        self.store = store
        self.mission: str = args.mission
        self.unit: str = args.unit
        self.epoch: int = args.epoch
        self.sandbox = Path(args.sandbox)
        self.ttl: float = args.ttl
        self.out: BinaryIO = sys.stdout.buffer
        self.parent = os.getppid()
        self.run_id: Any = None
        self.exit_code: int | None = None
        self.finished = threading.Event()
        self._out_lock = threading.Lock()
        self._in_lock = threading.Lock()  # the agent's stdin: frames from the host, and replayed answers
        self.replay = WorkerReplay()
        self.stopped_by_host = False  # the host sent `shutdown` (a pause, a question, the mission's end)
        self.completed = False  # the unit's completion is recorded (its lease is done)
        self.agent_ended = False  # the agent closed its output: its exit is what this worker reports
        self.agent = agent

    # -- the three loops ------------------------------------------------------------------------------
    def run(self) -> int:
        """Take the lease (pid, machine, heartbeat) under its epoch, then pass frames both ways until the
        unit ends. The agent, started before the store was opened, has had nothing from the host yet."""
        try:
            self.store.write(
                lambda t: leases.started(
                    t, self.mission, self.unit, self.epoch, pid=os.getpid(), hostname=os.uname().nodename
                )
            )
            for target in (self._from_host, self._from_agent, self._heartbeat):
                threading.Thread(target=target, daemon=True).start()
            self.finished.wait()
        except leases.StaleLeaseError as exc:
            self._log(exc.message)
            return EXIT_LEASE_LOST
        except DiskFullError as exc:  # the host sees the full disk when this worker dies (unitrun.py)
            self._log(exc.message)
            return EXIT_DISK_FULL
        finally:
            self._stop_agent()
        return self.exit_code or 0

    def _finish(self, code: int) -> None:
        if self.exit_code is None:
            self.exit_code = code
        self.finished.set()

    def _from_host(self) -> None:
        assert self.agent.stdin is not None
        stdin = sys.stdin.buffer
        try:
            while (body := read_frame(stdin)) is not None:
                message = rpc.decode(body)
                if is_replay_notice(message):  # for this worker, never the agent
                    if not self.replay.load(body):
                        self._log("replay table refused: the agent already sent the host a request")
                    continue
                if isinstance(message, rpc.Request) and message.method == "unit/run":
                    self.run_id = message.id
                if isinstance(message, rpc.Notification) and message.method == "shutdown":
                    self.stopped_by_host = True  # the agent's exit that follows is this worker's stop
                try:
                    self._to_agent(body)
                except (OSError, ValueError) as exc:  # the agent's end, not the host's: its exit is what is reported
                    if not self.finished.is_set():  # else this worker is stopping and closed the agent's stdin
                        self._agent_stopped_reading(exc)
                    return
        except (OSError, KeelError, ValueError) as exc:
            self._log(f"host connection ended: {exc}")
        if not self.agent_ended:  # else the agent's own end is reported (_from_agent), not this one
            self._orphaned("its parent closed the pipe")

    def _from_agent(self) -> None:
        assert self.agent.stdout is not None
        # Buffered: a frame's headers and body come in a read(2) or two, not a read(2) per header byte.
        stdout = io.BufferedReader(cast(io.RawIOBase, self.agent.stdout), buffer_size=_READ_BUFFER)
        try:
            while (body := read_frame(stdout)) is not None:
                message = rpc.decode(body)
                if (reply := self.replay.answer(message)) is not None:
                    self._to_agent(reply)
                    continue
                if (handed_over := self.replay.handover(message)) is not None:
                    self._to_host(handed_over)
                if isinstance(message, rpc.Notification) and message.method == REPLAYED:
                    self._log(f"dropped the agent's {REPLAYED} notification: only a worker sends it")
                    continue
                finishing = isinstance(message, rpc.Response) and self.run_id is not None and message.id == self.run_id
                try:
                    if finishing and not self._complete(message.result):  # type: ignore[union-attr]
                        self._finish(EXIT_LEASE_LOST)
                        return
                except DiskFullError as exc:
                    self._log(f"cannot record the unit's completion: {exc.message}")
                    self._send(rpc.ErrorResponse(id=self.run_id, error=rpc.ErrorObject(ERR_DISK_FULL, exc.message)))
                    self._finish(EXIT_DISK_FULL)
                    return
                self._to_host(body)
        except ProtocolError as exc:  # the agent is gone before the host hears why, as a frame of its own
            self._log(f"agent wrote garbage: {exc.message}")
            self._kill_agent_group()
            notice = rpc.Notification(method=AGENT_ERROR, params={"message": exc.message})
            with self._out_lock, contextlib.suppress(OSError):
                self.out.write(frame(rpc.encode(notice)))
                self.out.flush()
        except (OSError, KeelError, ValueError) as exc:
            self._log(f"agent connection ended: {exc}")
        self.agent_ended = True
        if self.stopped_by_host and not self.completed:  # recorded as when the host goes away: not "running"
            self._orphaned("its host stopped it")
            return
        self._finish(self._agent_exit_code())

    def _agent_stopped_reading(self, exc: OSError | ValueError) -> None:
        """The agent's input is closed (it exited, or closed its stdin): let it exit by itself for a moment,
        then stop it, so that `_from_agent` sees its output end and reports its own exit code."""
        self._log(f"the agent stopped reading its input: {exc}")
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.agent.wait(timeout=1.0)
        self._kill_agent_group()

    def _agent_exit_code(self) -> int:
        """The agent's own exit code, so that the host reports what the agent did."""
        try:
            code = self.agent.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            return EXIT_AGENT_GONE
        return code if code >= 0 else 128 - code

    def _heartbeat(self) -> None:
        while not self.finished.wait(max(0.05, self.ttl / 4)):
            if os.getppid() != self.parent:
                self._orphaned("its parent process is gone")
                return
            try:
                self.store.write(lambda t: leases.beat(t, self.mission, self.unit, self.epoch))
            except leases.StaleLeaseError as exc:
                self._log(f"lease lost: {exc.message}")
                if not self.finished.wait(GRACE_S):
                    self._finish(EXIT_LEASE_LOST)
                return
            except DiskFullError as exc:
                self._log(f"heartbeat skipped: {exc.message}")

    # -- completion and parent death --------------------------------------------------------------------
    def _complete(self, result: Any) -> bool:
        """Record the unit's completion once, fenced by this worker's epoch."""
        try:
            self.store.read(lambda t: leases.check(t, self.mission, self.unit, self.epoch))
            commit = commit_unit(self.sandbox, self.unit)
            payload = result.get("result") if isinstance(result, dict) else None
            # the result's files are kept, not only their digest: another machine or a restore can make them
            files = Snapshotter()
            scan = files.scan(self.sandbox)

            def write(t: Txn) -> None:
                done = files.store_txn(t, self.sandbox, scan)
                leases.complete(t, self.mission, self.unit, self.epoch, result=payload, commit=commit, tree=done)

            self.store.write(write)
            self.completed = True
            return True
        except leases.StaleLeaseError as exc:
            self._log(f"completion rejected: {exc.message}")
            event = Event(
                kind="lease",
                at=time.time(),
                unit=self.unit,
                state="rejected",
                message=f"late completion of epoch {self.epoch} rejected (pid {os.getpid()}): {exc.message}",
            )
            self.store.write(lambda t: m.add_event(t, self.mission, event))
            return False

    def _orphaned(self, why: str) -> None:
        if self.finished.is_set():
            return
        if self.completed:  # the host closes the pipe once the completion is recorded: the worker's normal end
            self._finish(0)
            return
        self._log(f"stopping: {why}")

        def write(txn: Txn) -> None:
            leases.orphan(txn, self.mission, self.unit, self.epoch)

        try:
            self.store.write(write)
        except KeelError as exc:
            self._log(f"could not record the orphaned lease: {exc.message}")
        self._finish(EXIT_ORPHANED)

    def _stop_agent(self) -> None:
        """Let the agent end by itself (stdin closed) for a moment, then kill its process group, and then every
        process left below this worker (a subreaper: also what left the group), on every way out of it."""
        agent = self.agent
        if agent.stdin is not None:
            with contextlib.suppress(OSError):
                agent.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            agent.wait(timeout=0.8)
        self._kill_agent_group()
        with contextlib.suppress(subprocess.TimeoutExpired):
            agent.wait(timeout=5)
        runtree.end_descendants(spare=agent.pid)  # what the agent started and left, however it detached

    def _to_agent(self, body: bytes) -> None:
        assert self.agent.stdin is not None
        with self._in_lock:
            self.agent.stdin.write(frame(body))
            self.agent.stdin.flush()

    def _to_host(self, body: bytes) -> None:
        with self._out_lock:
            self.out.write(frame(body))
            self.out.flush()

    def _send(self, message: rpc.Message) -> None:
        with self._out_lock, contextlib.suppress(OSError):
            self.out.write(frame(rpc.encode(message)))
            self.out.flush()

    def _kill_agent_group(self) -> None:
        kill_group(self.agent)

    def _log(self, text: str) -> None:
        with contextlib.suppress(OSError):  # the log's own disk may be the full one
            sys.stderr.write(f"keel subagent {self.mission}/{self.unit} epoch {self.epoch}: {text}\n")
            sys.stderr.flush()


def kill_group(agent: AgentChild) -> None:
    """SIGKILL the agent's process group: the agent and whatever it started."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(agent.pid, signal.SIGKILL)


def serve(args: argparse.Namespace, agent: AgentChild) -> int:
    """The worker's life once its agent is started: the sandbox's stale git locks cleared (nothing has reached
    the agent yet, so nothing runs git there), the store opened, the lease taken, the loops run."""
    clear_stale_locks(Path(args.sandbox))  # a worker killed in `git commit` here left its index.lock
    try:
        store = Store.open(args.store, create=False)
    except KeelError as exc:
        kill_group(agent)
        sys.stderr.write(f"keel subagent {args.mission}/{args.unit}: cannot open the store: {exc.message}\n")
        sys.stderr.flush()
        return EXIT_NO_STORE
    try:
        worker = Worker(store, args, agent)
        store.wait_out_outages(worker._log)  # a store that is away is a pause for this unit, never a failure
        return worker.run()
    finally:
        store.close()
