"""A mission outlives the machine it runs on: two machines (network namespaces) share one PostgreSQL store.

Machine A runs the mission; machine B runs `keel supervise`, with a clone of the same git workspace.
The strike comes on a condition: a unit's first effect has run on A (its marker is in the side log, a file
outside every sandbox standing for the world), the mission is unfinished, and A's host holds the host
lease. Then either A is killed whole (every process in its namespace SIGKILLed, its link removed:
`kill`) or its link is cut while everything on it keeps running (`cut`). In `cut-at-intent`, A's host
stops right after the intent of a unit's command is durable (a fault point holds it there, before the
command starts) and its link is cut then; once the mission completed on B, A's host is let go while still
cut off, then its link comes back: it must not make that effect (its lease is B's host's: the renewal an
effect starts under ends it, fenced).
B's supervisor must see the lease go silent, start a host on B, which makes the mission's sandboxes on B
from the store and completes the mission, each unit carrying on from its journal in a sandbox made from
the store (none starts again from scratch). For both cuts, A's link then comes back: A's host must find
its lease taken and stop without writing (exit 7). In `kill-mover`, B's first host is killed too, after it has moved one
unit's lease but before the mission record names B: the next host on B must move it again.

Checked, on the product: the mission completes on B; every effect ran exactly once (an effect whose
outcome a machine's death left unknown is a question, answered as a person would from the side log);
the mission branch's files on B equal an undisturbed run's; each unit succeeded exactly once; the
store verifies. The time from the strike to B's host holding the lease is written to
test-artifacts/failover-<strike>.txt.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import files, keel, read, record, unit_events, wait_for, write_mission
from lsprotocol import types
from pytest_lsp import make_test_lsp_client

from keel.protocol.states import MissionState
from keel.storage import hostlease, leases
from keel.storage import missions as m
from tests.pgserver import PgServer
from tests.postgres.machines import (
    Machine,
    answer_from_side_log,
    can_make_machines,
    git,
    git_workspace,
    markers,
    store_folder,
)

pytestmark = pytest.mark.skipif(bool(can_make_machines()), reason=can_make_machines() or "")

UNITS = {"a": [], "b": [], "c": [], "d": ["a", "b"], "e": ["c", "d"]}
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
TTL_S = "6"  # the host lease: a silent host is taken over after this long (a busy machine reads slowly)


def _units(side: Path) -> list[dict[str, Any]]:
    def unit(uid: str) -> dict[str, Any]:
        diff = f"--- a/{uid}.py\n+++ b/{uid}.py\n@@ -1 +1 @@\n-{uid.upper()} = 1\n+{uid.upper()} = 2\n"
        return {
            "id": uid,
            "after": UNITS[uid],
            "params": {
                "steps": [
                    {"tool": "write_file", "args": {"path": f"{uid}.py", "content": f"{uid.upper()} = 1\n"}},
                    {"tool": "run", "args": {"cmd": f"sleep 0.3; echo {uid}-1 >> {side}"}},
                    {"now": True},
                    {"sleep": 0.5},
                    {"tool": "apply_diff", "args": {"path": f"{uid}.py", "diff": diff}},
                    {"tool": "run", "args": {"cmd": f"echo {uid}-2 >> {side}"}},
                    {"save_state": {"unit": uid}},
                    {"tool": "read_file", "args": {"path": f"{uid}.py"}},
                ]
            },
        }

    return [unit(uid) for uid in UNITS]


def _reference(folder: Path, server: PgServer) -> dict[str, Any]:
    side = folder / "side.log"
    git_workspace(folder / "ws")
    mission = write_mission(folder, _units(side), max_parallel=3)
    store = store_folder(folder / "ws", server.store_url(server.new_schema()))
    done = keel("run", str(mission), "--json", store=store, timeout=120, check_rc=0)
    mid = json.loads(done.stdout.splitlines()[0])["mission"]
    return {"side": sorted(markers(side)), "files": files(Path(record(store, mid).sandbox))}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, pg_server: PgServer) -> dict[str, Any]:
    """The mission run undisturbed on one machine: its effects and files, which every strike must end with."""
    return _reference(tmp_path_factory.mktemp("reference"), pg_server)


class TwoMachines:
    """Machine A with the mission's workspace, machine B with a clone of it, one store; `observer` is the
    same store read by this process over 127.0.0.1."""

    def __init__(self, tmp_path: Path, server: PgServer, reference: dict[str, Any]) -> None:
        self.root = tmp_path
        self.reference = reference
        schema = server.new_schema()
        self.a, self.b = Machine("machine-a", server.port), Machine("machine-b", server.port)
        self.side = tmp_path / "side.log"
        git_workspace(tmp_path / "a" / "ws")
        self.mission = write_mission(tmp_path / "a", _units(self.side), max_parallel=3)
        git(tmp_path, "clone", "-q", str(tmp_path / "a" / "ws"), str(tmp_path / "b" / "ws"))
        self.a.hide, self.b.hide = [tmp_path / "b"], [tmp_path / "a"]  # each machine has its own disk
        self.store_a = store_folder(tmp_path / "a" / "ws", self.a.url(schema))
        self.store_b = store_folder(tmp_path / "b" / "ws", self.b.url(schema))
        self.observer = store_folder(tmp_path / "observer", server.store_url(schema))
        self.env = {"KEEL_HOST_LEASE_TTL_S": TTL_S}
        self.mover_mark: Path | None = None
        self.procs: list[subprocess.Popen[str]] = []

    def strike_mover(self) -> None:
        """Make B's hosts stop for a second after moving each unit, so that the test can kill the first."""
        self.mover_mark = self.root / "mover.pid"
        self.env["KEEL_FAULT_MOVE_UNIT"] = f"{self.mover_mark}:1"

    def remove(self) -> None:
        for machine in (self.a, self.b):
            machine.remove()
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=10)

    def lose_a(self, strike: str) -> str:
        """Run the mission on A, strike A on the condition, see it finish on B, check the product.
        Returns what the artifact says about the timing."""
        a, here, side = self.a, self.observer, self.side
        hold = self.root / "intent.pid"  # cut-at-intent: A's host waits there until the file is gone
        held = {"KEEL_FAULT_INTENT_RUN": f"{hold}:hold"} if strike == "cut-at-intent" else {}
        host = a.keel(
            "run", str(self.mission), "--json", "--store", str(self.store_a),
            env={**self.env, **held}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        self.procs.append(host)
        assert host.stdout is not None
        mid = json.loads(host.stdout.readline())["mission"]

        deadline = time.monotonic() + 60
        while "a-1" not in markers(side) and "b-1" not in markers(side) and not (held and hold.exists()):
            assert host.poll() is None and time.monotonic() < deadline, "the mission ended before the strike"
            time.sleep(0.005)
        in_doubt: list[str] = []  # cut-at-intent: the markers of the commands whose intents A recorded last
        if held:
            _until_text(hold)  # A's host is there (it wrote its pid)
            in_doubt = [
                str(e.result.get("cmd", "")).rsplit("echo ", 1)[1].split(" ")[0]
                for x in read(here, lambda t: leases.list_leases(t, mid))
                for e in read(here, lambda t, lane=x.lane: list(m.journal_scan(t, mid, lane)))
                if e.phase == "intent" and "echo" in str(e.result.get("cmd", ""))
            ]
            assert in_doubt and not set(in_doubt) & set(markers(side)), f"no command held at its intent: {in_doubt}"
        lease = read(here, lambda t: hostlease.get(t, mid))
        assert record(here, mid).state == MissionState.RUNNING, "the mission is not running: nothing to strike"
        assert lease is not None and lease.hostname == "machine-a", f"machine A's host holds no lease: {lease}"
        before = len(markers(side))
        struck_at = time.monotonic()
        if strike == "kill":
            killed = a.kill()
            assert host.pid in killed or host.poll() is not None
        else:
            a.cut()
            assert host.poll() is None, "machine A's host ended before its link was cut"

        if self.mover_mark is not None:  # B's first host is killed half-way through moving the mission
            pid = int(_until_text(self.mover_mark))
            moved = [
                x for x in read(here, lambda t: leases.list_leases(t, mid)) if str(self.root / "b") in x.place.sandbox
            ]
            assert record(here, mid).machine == "machine-a" and moved, "B's host is not in the middle of a move"
            os.kill(pid, signal.SIGKILL)
            self.mover_mark.unlink()

        moved_after = None
        deadline = time.monotonic() + 300
        while (state := record(here, mid).state) != MissionState.COMPLETED:
            assert time.monotonic() < deadline, f"the mission did not complete on machine B (it is {state})"
            held = read(here, lambda t: hostlease.get(t, mid))
            if moved_after is None and held is not None and held.hostname == "machine-b":
                moved_after = time.monotonic() - struck_at
            if state == MissionState.WAITING_INPUT:
                answer_from_side_log(self.b, self.store_b, here, mid, side)
            time.sleep(0.05)
        assert moved_after is not None or read(here, lambda t: hostlease.get(t, mid)).hostname == "machine-b"

        if strike.startswith("cut"):  # A's host, cut off all along, hears of the store again: it must stop, fenced
            hold.unlink(missing_ok=True)  # cut-at-intent: A's host goes on from its intent, still cut off
            a.mend()
            _, err = host.communicate(timeout=90)
            assert host.returncode == 7, f"machine A's host was not fenced ({host.returncode}): {err[-2000:]}"
            assert "taken over" in err, err[-2000:]
            wait_for(lambda: not _commands_running(side), timeout=60)  # a command A started has ended

        final = record(here, mid)
        assert final.machine == "machine-b" and final.state == MissionState.COMPLETED
        assert Path(final.sandbox).is_relative_to(self.root / "b" / "ws")
        counts = collections.Counter(markers(side))
        assert before < len(markers(side)), "the mission had run all its effects before the strike"
        assert all(n == 1 for n in counts.values()), f"an effect ran twice: {markers(side)}"
        assert sorted(counts) == self.reference["side"], f"effects lost: {sorted(counts)}"
        assert files(Path(final.sandbox)) == self.reference["files"]
        events = unit_events(here, mid)
        for unit in UNITS:
            states = [s for u, s in events if u == unit]
            assert states.count("succeeded") == 1 and states[-1] == "succeeded", (unit, states)
        evidence = [e.kind for _, e in read(here, lambda t: list(m.evidence_after(t, mid)))]
        assert "reexecuted" not in evidence, "a unit started again from scratch: its sandbox did not move"
        keel("verify", store=here, check_rc=0)
        if moved_after is None:
            return f"{strike}: completed before the lease was seen on machine B"
        return f"{strike}: machine B's host held the lease {moved_after:.2f} s after the strike (ttl {TTL_S} s)"


def _commands_running(side: Path) -> bool:
    """Whether a unit's command (every one appends to the side log) still runs, on either machine."""
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and str(side).encode() in (proc / "cmdline").read_bytes():
                return True
        except OSError:
            pass
    return False


def _until_text(path: Path, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while not (path.exists() and (text := path.read_text().strip())):
        assert time.monotonic() < deadline, f"{path.name} was not written"
        time.sleep(0.005)
    return text


@pytest.mark.slow
@pytest.mark.timeout(700)
@pytest.mark.parametrize("strike", ["kill", "cut", "kill-mover", "cut-at-intent"])
def test_mission_moves_to_another_machine_when_its_machine_is_lost(
    tmp_path: Path, pg_server: PgServer, reference: dict[str, Any], strike: str
) -> None:
    machines = TwoMachines(tmp_path, pg_server, reference)
    if strike == "kill-mover":
        machines.strike_mover()
    try:
        supervise = ("supervise", "--store", str(machines.store_b), "--interval", "0.2")
        machines.procs.append(
            machines.b.keel(*supervise, env=machines.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        )
        timing = machines.lose_a(strike.removesuffix("-mover"))
    finally:
        machines.remove()
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / f"failover-{strike}.txt").write_text(f"{timing} (keel supervise, interval 0.2 s)\n")


@pytest.mark.slow
@pytest.mark.timeout(400)
async def test_keel_serve_that_takes_over_moves_a_lost_machines_mission(
    tmp_path: Path, pg_server: PgServer, reference: dict[str, Any]
) -> None:
    """The same with `keel serve` on machine B, started with `initializationOptions.takeOver`."""
    machines = TwoMachines(tmp_path, pg_server, reference)
    client = make_test_lsp_client()
    serve = machines.b.command(sys.executable, "-m", "keel.server.cli", "serve", "--store", str(machines.store_b))
    await client.start_io(*serve, env={**os.environ, **machines.env})
    try:
        await client.initialize_session(
            types.InitializeParams(
                capabilities=types.ClientCapabilities(),
                root_uri=(tmp_path / "b" / "ws").as_uri(),
                initialization_options={"takeOver": True},
            )
        )
        await asyncio.to_thread(machines.lose_a, "kill")
        assert any("host is gone" in msg.message for msg in client.log_messages), "keel serve did not restart it"
        await client.shutdown_session()
    finally:
        machines.remove()


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_keel_worker_that_takes_over_moves_a_lost_machines_mission(
    tmp_path: Path, pg_server: PgServer, reference: dict[str, Any]
) -> None:
    """The same with `keel worker --take-over` on machine B instead of `keel supervise`."""
    machines = TwoMachines(tmp_path, pg_server, reference)
    try:
        worker = ("worker", "--store", str(machines.store_b), "--take-over")
        proc = machines.b.keel(*worker, env=machines.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        machines.lose_a("kill")
    finally:
        machines.remove()  # every process on B too
    said = proc.communicate(timeout=30)[0]
    assert "host started here" in said, f"keel worker did not start the host: {said}"
