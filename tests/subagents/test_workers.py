"""Units run by `keel worker`s (`workers = true`): the product equals a mission whose host runs its units.

Each test runs a mission whose host offers its units, with real `keel worker` processes claiming them, and
checks the product: every effect (a line a `run` command appends to a side log outside every sandbox)
made exactly once, the mission sandbox's files equal to those of the same mission run by its host alone,
each unit succeeded once, the store verifies. The strikes come on a condition: a worker killed (with its
worker process and agent) after its unit's first effect ran; a unit that asks a person; a pause while a
worker runs a unit.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import files, keel, mission_id_of, read, record, start_keel, unit_events, wait_for, write_mission
from subagent_helpers import lease, writes_blocked_by

from keel.protocol.states import LeaseState, MissionState
from keel.storage import leases
from keel.storage import missions as m

pytestmark = [pytest.mark.usefixtures("store_backend"), pytest.mark.timeout(240)]  # each test on LMDB and on PostgreSQL
ENV = {"KEEL_LEASE_TTL_S": "2"}
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


def _units(side: Path, *, ask: bool = False, linger: float = 0, gate: Path | None = None) -> list[dict[str, Any]]:
    """Units a and b (an effect, a pause, another effect), then c; `linger`: a's first command goes on for
    that long after its effect, so that a strike can land while its outcome is not recorded; `gate`: a's
    pause between its effects lasts until that file exists (a window no machine's speed can close)."""

    def unit(uid: str, after: list[str]) -> dict[str, Any]:
        lingering = f"; sleep {linger}" if linger and uid == "a" else ""
        between = {"wait_file": str(gate)} if gate is not None and uid == "a" else {"sleep": 0.6}
        steps: list[dict[str, Any]] = [
            {"tool": "write_file", "args": {"path": f"{uid}.txt", "content": f"{uid} 1\n"}},
            {"tool": "run", "args": {"cmd": f"echo {uid}-1 >> {side}{lingering}"}},
            {"now": True},
            between,
            {"tool": "run", "args": {"cmd": f"echo {uid} 2 >> {uid}.txt; echo {uid}-2 >> {side}"}},
        ]
        if ask and uid == "b":
            steps.insert(2, {"ask": "Ship b?", "choices": ["yes", "no"]})
        return {"id": uid, "after": after, "params": {"steps": steps}}

    cmd = f"cat a.txt b.txt > c.txt; echo c-1 >> {side}"
    last = {"id": "c", "after": ["a", "b"], "params": {"steps": [{"tool": "run", "args": {"cmd": cmd}}]}}
    return [unit("a", []), unit("b", []), last]


def _reference(folder: Path, *, ask: bool = False) -> dict[str, Any]:
    """The same mission with its units run by its host."""
    folder.mkdir()
    side = folder / "side.log"
    store = folder / "store"
    mission = write_mission(folder, _units(side, ask=ask), max_parallel=2)
    proc = keel("run", str(mission), "--json", store=store, timeout=120)
    mid = json.loads(proc.stdout.splitlines()[0])["mission"]
    if ask:
        assert record(store, mid).state == MissionState.WAITING_INPUT
        keel("answer", mid, "yes", "--no-resume", store=store, check_rc=0)
        keel("resume", mid, store=store, timeout=120, check_rc=0)
    assert record(store, mid).state == MissionState.COMPLETED
    return {"side": sorted(side.read_text().split()), "files": files(Path(record(store, mid).sandbox))}


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., dict[str, Any]]:
    """`_reference`, run once per module and kind (on LMDB, whatever the test's backend: the product is the
    same) instead of once per test."""
    made: dict[bool, dict[str, Any]] = {}

    def reference(*, ask: bool = False) -> dict[str, Any]:
        if ask not in made:
            made[ask] = _reference(tmp_path_factory.mktemp("reference") / "run", ask=ask)
        return made[ask]

    return reference


def _host(folder: Path, side: Path, store: Path, linger: float = 0) -> subprocess.Popen[str]:
    mission = write_mission(folder, _units(side, linger=linger), max_parallel=2, workers=True)
    return start_keel("run", str(mission), store=store, env=ENV)


def _worker(store: Path, units: int = 1, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "keel.server.cli", "worker", "--store", str(store), "--units", str(units)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **ENV, **(env or {})},
        start_new_session=True,
    )


def _tree(pid: int) -> list[int]:
    """The process and every descendant of it."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children[int(fields[1])].append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        found.append(current := todo.pop())
        todo += children.get(current, [])
    return found


def _kill_tree(pid: int) -> None:
    """SIGKILL the process and every descendant of it; one that exits meanwhile is already gone."""
    for each in _tree(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(each, signal.SIGKILL)


def _stop(*procs: subprocess.Popen[str]) -> str:
    out = ""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            out += proc.communicate(timeout=30)[0] or ""
        except subprocess.TimeoutExpired:
            proc.kill()
            out += proc.communicate()[0] or ""
    return out


def _markers(side: Path) -> list[str]:
    """The effects made so far (none yet: no side log)."""
    return side.read_text().split() if side.exists() else []


def _check(store: Path, mid: str, side: Path, reference: dict[str, Any]) -> None:
    counts = collections.Counter(side.read_text().split())
    assert all(n == 1 for n in counts.values()), f"an effect ran twice: {side.read_text().split()}"
    assert sorted(counts) == reference["side"], f"effects lost: {sorted(counts)}"
    assert files(Path(record(store, mid).sandbox)) == reference["files"]
    events = unit_events(store, mid)
    for unit in ("a", "b", "c"):
        states = [s for u, s in events if u == unit]
        assert states.count("succeeded") == 1 and states[-1] == "succeeded", (unit, states)
    keel("verify", store=store, check_rc=0)


def _answer_until_done(store: Path, mid: str, side: Path, said: str) -> int:
    """An effect whose outcome the strike left unknown is a question the host asks (a worker hands it back):
    answered from the side log, as a person would, until the mission completes."""
    for answered in range(5):
        current = record(store, mid)
        if current.state == MissionState.COMPLETED:
            return answered
        question = current.question
        assert current.state == MissionState.WAITING_INPUT and question is not None, f"{current}\n{said}"
        assert question.kind == "uncertain-effect", f"unexpected question: {question}"
        lane, seq = question.lane, question.seq
        entry = read(store, lambda t, lane=lane, seq=seq: m.journal_get(t, mid, lane, seq))
        marker = str(entry.result.get("cmd", "")).rsplit("echo ", 1)[1].split(" ")[0]
        choice = "skip" if marker in _markers(side) else "rerun"
        keel("answer", mid, choice, "--no-resume", store=store, check_rc=0)
        resumed = keel("resume", mid, "--json", store=store, timeout=120, env=ENV)
        said = resumed.stdout + resumed.stderr
    raise AssertionError(f"the mission did not complete: {record(store, mid)}\n{said}")


def _host_steps(host_out: str) -> int:
    """The steps the mission host executed itself (its `host_exit` event's count)."""
    exits = [json.loads(line) for line in host_out.splitlines() if '"host_exit"' in line]
    return sum(int(e["executed"]) for e in exits)


def test_workers_run_every_unit_and_the_product_equals_a_host_run(
    references: Callable[..., dict[str, Any]], tmp_path: Path
) -> None:
    reference = references()
    side, store = tmp_path / "side.log", tmp_path / "store"
    host = _host(tmp_path, side, store)
    mid = mission_id_of(host)
    workers = [_worker(store), _worker(store)]
    try:
        out, err = host.communicate(timeout=120)
    finally:
        said = _stop(*workers)
    assert host.returncode == 0, f"{out}\n{err}\n{said}"
    assert record(store, mid).state == MissionState.COMPLETED
    assert _host_steps(out) == 0, "the mission host ran steps itself"
    for unit in ("a", "b", "c"):
        assert f"{mid}/{unit}: claimed" in said and f"{mid}/{unit}: succeeded" in said, said
    _check(store, mid, side, reference)
    # `keel status` names the worker that ran each unit, its process and its sandbox on that machine
    shown = keel("status", mid, store=store, check_rc=0).stdout
    for unit in ("a", "b", "c"):
        (line,) = [x for x in shown.splitlines() if x.strip().startswith(f"{unit} ") and "epoch" in x]
        worker = line.split("worker ", 1)[1].split(" ", 1)[0]
        assert worker.startswith("w-") and f"on {os.uname().nodename} (pid " in line and "pid 0" not in line, line
        assert f"/workers/{worker}/{mid}/{unit}." in line.split("sandbox there ", 1)[1], line


@pytest.mark.parametrize("strike", ["effect-recorded", "effect-in-doubt"])
def test_a_killed_worker_is_replaced_and_nothing_runs_twice(
    references: Callable[..., dict[str, Any]], tmp_path: Path, strike: str
) -> None:
    """The strike: unit a's first effect ran on the first worker, which still holds its lease; the worker,
    its worker process and its agent are SIGKILLed, either once the effect's result is journaled or while
    its command still runs (the effect made, its outcome not recorded). A second worker takes the unit when
    the lease lapses and carries it on from its journal in a sandbox made from the store; an effect in doubt
    goes back to the host as a question, answered from the side log as a person would. Nothing runs twice."""
    linger = 30.0 if strike == "effect-in-doubt" else 0
    reference = references()
    side, store = tmp_path / "side.log", tmp_path / "store"
    host = _host(tmp_path, side, store, linger)
    mid = mission_id_of(host)
    first = _worker(store, units=2)
    second: subprocess.Popen[str] | None = None
    try:
        wait_for(lambda: side.exists() and "a-1" in side.read_text().split(), timeout=60)

        def effect_entry() -> str:
            entry = read(store, lambda t: m.journal_get(t, mid, "a", 2))
            return entry.phase if entry is not None else ""

        if strike == "effect-recorded":
            wait_for(lambda: effect_entry() == "done")
        held = lease(store, mid, "a")
        assert held is not None and held.worker and held.state == LeaseState.RUNNING, held
        assert effect_entry() == ("done" if strike == "effect-recorded" else "intent"), effect_entry()
        assert record(store, mid).state == MissionState.RUNNING and "a-2" not in side.read_text().split()
        _kill_tree(first.pid)
        first.communicate(timeout=10)
        assert effect_entry() == ("done" if strike == "effect-recorded" else "intent"), "the strike came too late"
        second = _worker(store, units=2)
        out, err = host.communicate(timeout=120)
        _answer_until_done(store, mid, side, out + err)
    finally:
        said = _stop(*(p for p in (first, second, host) if p is not None))
    assert record(store, mid).state == MissionState.COMPLETED, said
    events = read(store, lambda t: [e for _, e in m.events_after(t, mid) if e.kind == "lease"])
    assert any(e.unit == "a" and e.state == "expired" for e in events), "unit a was not offered again"
    if strike == "effect-in-doubt":
        evidence = read(store, lambda t: [e for _, e in m.evidence_after(t, mid)])
        assert any(e.kind == "answer" for e in evidence), "the effect in doubt was not asked about"
    _check(store, mid, side, reference)


def _freeze(store: Path, pids: list[int]) -> None:
    """SIGSTOP every process of a worker (a machine put to sleep), at a moment when none of them holds the
    LMDB store's writer lock (a frozen writer would hold up everyone; on PostgreSQL the server aborts a
    transaction left open)."""
    for _ in range(100):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        if not (store / "data.mdb").exists() or not any(writes_blocked_by(store, pid) for pid in pids):
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        time.sleep(0.05)
    raise AssertionError("the worker held the store's writer lock at every try")


def test_a_worker_frozen_between_an_effects_intent_and_the_effect_never_makes_it_once_its_unit_moved_on(
    references: Callable[..., dict[str, Any]],
    tmp_path: Path,
) -> None:
    """The strike: the first worker stops right after the intent of a unit's first command is durable (a fault
    point holds it there, before the command starts), and all its processes are frozen (SIGSTOP: a laptop
    put to sleep). The unit's lease lapses; a second worker takes the unit, the effect in doubt goes to a
    person, who answers from the side log (it never ran: rerun), and the mission completes. Then the first
    worker wakes, still holding what it was about to do: it must not make the effect, because its lease is
    another's now (the renewal an effect starts under is refused). Checked on the product: every effect
    once, files equal the host's own run."""
    reference = references()
    side, store, hold = tmp_path / "side.log", tmp_path / "store", tmp_path / "hold"
    host = _host(tmp_path, side, store)
    mid = mission_id_of(host)
    first = _worker(store, units=2, env={"KEEL_FAULT_INTENT_RUN": f"{hold}:hold"})
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(first.stdout or []), daemon=True)
    reader.start()
    second: subprocess.Popen[str] | None = None
    frozen: list[int] = []
    try:
        wait_for(lambda: hold.exists() and hold.read_text().strip() != "", timeout=90)
        assert int(hold.read_text()) == first.pid

        def in_doubt() -> list[str]:  # units whose first command's intent is durable and has no outcome
            entries = read(store, lambda t: {u: m.journal_get(t, mid, u, 2) for u in ("a", "b")})
            return [u for u, e in entries.items() if e is not None and e.phase == "intent"]

        (unit,) = in_doubt()
        held = lease(store, mid, unit)
        assert held is not None and held.state == LeaseState.RUNNING and held.worker, held
        frozen = _tree(first.pid)
        _freeze(store, frozen)
        assert in_doubt() == [unit] and f"{unit}-1" not in _markers(side)
        second = _worker(store, units=2)
        out, err = host.communicate(timeout=180)
        _answer_until_done(store, mid, side, out + err)
        assert record(store, mid).state == MissionState.COMPLETED, out + err
        assert read(store, lambda t: leases.get(t, mid, unit)).epoch > held.epoch

        hold.unlink()  # the first worker wakes where it stopped: the intent recorded, the command not started
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        ended = f"{mid}/{unit}: "
        wait_for(lambda: sum(ended in line and "claimed" not in line for line in lines) >= 1, timeout=90)
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        hold.unlink(missing_ok=True)
        said = _stop(*(p for p in (second, host) if p is not None))
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=30)
        reader.join(timeout=10)
    woke = [line for line in lines if f"{mid}/{unit}: " in line and "claimed" not in line]
    assert woke == [f"keel worker: {mid}/{unit}: expired\n"], f"{woke}\n{said}"  # fenced, its effect not made
    _check(store, mid, side, reference)


def test_a_unit_that_asks_a_person_goes_back_to_its_host(
    references: Callable[..., dict[str, Any]], tmp_path: Path
) -> None:
    """Unit b asks a question after its first effect: its worker hands it back, the host asks; the answer
    resumes the mission, the unit is offered again and finishes on a worker from its journal."""
    reference = references(ask=True)
    side, store = tmp_path / "side.log", tmp_path / "store"
    mission = write_mission(tmp_path, _units(side, ask=True), max_parallel=2, workers=True)
    host = start_keel("run", str(mission), store=store, env=ENV)
    mid = mission_id_of(host)
    worker = _worker(store, units=2)
    try:
        out, err = host.communicate(timeout=120)
        question = record(store, mid).question
        assert record(store, mid).state == MissionState.WAITING_INPUT and question is not None, f"{out}\n{err}"
        assert question.text == "Ship b?" and question.unit == "b"
        assert "b-1" in side.read_text().split() and "b-2" not in side.read_text().split()
        keel("answer", mid, "yes", "--no-resume", store=store, check_rc=0)
        resumed = keel("resume", mid, "--json", store=store, timeout=120, env=ENV)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    finally:
        said = _stop(worker)
    assert "goes back to its mission host: a question for a person" in said, said
    assert record(store, mid).state == MissionState.COMPLETED
    _check(store, mid, side, reference)


def test_a_pause_stops_a_workers_unit_and_the_resume_finishes_it(
    references: Callable[..., dict[str, Any]], tmp_path: Path
) -> None:
    reference = references()
    side, store = tmp_path / "side.log", tmp_path / "store"
    host = _host(tmp_path, side, store)
    mid = mission_id_of(host)
    worker = _worker(store, units=2)
    try:
        wait_for(lambda: side.exists() and "a-1" in side.read_text().split(), timeout=60)
        assert "a-2" not in side.read_text().split(), "unit a finished before the pause"
        keel("pause", mid, store=store, check_rc=0)
        host.communicate(timeout=60)
        assert record(store, mid).state == MissionState.PAUSED
        held = lease(store, mid, "a")
        assert held is not None and held.state != LeaseState.RUNNING, f"a paused unit's lease reads {held}"
        at_pause = side.read_text()  # a step in flight when the pause came finishes first; then nothing more
        time.sleep(1.5)
        assert side.read_text() == at_pause, "the worker carried on after the pause"
        resumed = keel("resume", mid, "--json", store=store, timeout=120, env=ENV)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    finally:
        said = _stop(worker)
    assert record(store, mid).state == MissionState.COMPLETED, said
    _check(store, mid, side, reference)


def test_a_host_killed_while_workers_run_its_units_is_resumed_without_redoing_them(
    references: Callable[..., dict[str, Any]], tmp_path: Path
) -> None:
    """The strike: the host is SIGKILLed while a worker runs unit a (its first effect made). The workers
    carry on; the next host takes over what they finished (merging it from the store) and follows the rest."""
    reference = references()
    side, store = tmp_path / "side.log", tmp_path / "store"
    host = _host(tmp_path, side, store)
    mid = mission_id_of(host)
    worker = _worker(store, units=2)
    try:
        wait_for(lambda: side.exists() and "a-1" in side.read_text().split(), timeout=60)
        held = lease(store, mid, "a")
        assert held is not None and held.worker and held.state == LeaseState.RUNNING, held
        assert "a-2" not in side.read_text().split(), "unit a finished before the strike"
        host.send_signal(signal.SIGKILL)
        host.communicate(timeout=10)
        assert record(store, mid).state == MissionState.RUNNING
        wait_for(lambda: "a-2" in side.read_text().split(), timeout=60)  # the worker went on without a host
        resumed = keel("resume", mid, "--json", store=store, timeout=120, env=ENV)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        assert _host_steps(resumed.stdout) == 0, "the resumed host ran steps itself"
    finally:
        said = _stop(worker)
    assert record(store, mid).state == MissionState.COMPLETED, said
    _check(store, mid, side, reference)


def _worker_at(store: Path, mid: str, unit: str, entries: int) -> bool:
    """A worker holds the unit, which has journaled at least `entries` entries."""
    held = lease(store, mid, unit)
    running = held is not None and held.state == LeaseState.RUNNING and held.worker != ""
    return running and held is not None and held.place.last_checkpoint >= entries


CHAOS_ITERATIONS = int(os.environ.get("KEEL_WORKER_CHAOS_ITERATIONS", "6"))


@pytest.mark.timeout(600)
def test_kills_of_hosts_and_workers_on_conditions_never_lose_or_repeat_work(
    references: Callable[..., dict[str, Any]], tmp_path: Path, store_backend: str, store_folder: Callable[[Path], Path]
) -> None:
    """Chaos over a mission run by two workers. Each iteration strikes when a unit held by a worker has
    journaled a chosen number of entries (its effect made or not, in doubt or recorded), killing a random
    mix of the host and the two workers (each with everything it started); the killed ones are started
    again, an effect in doubt is answered from the side log, until the mission completes. Checked each
    time: the strike hit a live mission at its condition; every effect exactly once, the files equal the
    host's own run, every unit succeeded once, the store verifies."""
    reference = references()
    rng = random.Random(int(os.environ.get("KEEL_CHAOS_SEED", "7")))
    kills: collections.Counter[str] = collections.Counter()
    answered = 0
    for i in range(CHAOS_ITERATIONS):
        folder = tmp_path / f"i{i}"
        folder.mkdir()
        side, store = folder / "side.log", store_folder(folder / "store")  # on this test's backend
        unit, entries = rng.choice("ab"), rng.randint(1, 3)  # then a and b sleep, and make their last entry
        victims = rng.choice([{"host"}, {"w1"}, {"host", "w1"}, {"w1", "w2"}, {"host", "w1", "w2"}])
        host = _host(folder, side, store, linger=rng.choice([0, 1.0]))
        mid = mission_id_of(host)
        procs = {"host": host, "w1": _worker(store, units=2), "w2": _worker(store, units=2)}
        said = ""
        try:
            wait_for(functools.partial(_worker_at, store, mid, unit, entries), timeout=60)
            assert record(store, mid).state == MissionState.RUNNING, f"iteration {i}: nothing to strike"
            for name in victims:
                _kill_tree(procs[name].pid)
                said += procs[name].communicate(timeout=10)[0] or ""
            for name in victims - {"host"}:
                procs[name] = _worker(store, units=2)
            if "host" in victims:
                resumed = keel("resume", mid, "--json", store=store, timeout=180, env=ENV)
                said += resumed.stdout + resumed.stderr
            else:
                out, err = host.communicate(timeout=180)
                said += out + err
            answered += _answer_until_done(store, mid, side, said)
            kills.update(victims)
        finally:
            said += _stop(*(p for name, p in procs.items() if name != "host"), host)
        context = f"iteration {i}: {unit} at {entries}, killed {sorted(victims)}"
        assert record(store, mid).state == MissionState.COMPLETED, f"{context}\n{said}"
        try:
            _check(store, mid, side, reference)
        except AssertionError as exc:
            raise AssertionError(f"{context}: {exc}") from None
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / f"worker-chaos-{store_backend}.txt").write_text(
        f"worker chaos: {CHAOS_ITERATIONS} iterations, kills {dict(sorted(kills.items()))}, {answered} effects in "
        f"doubt answered; every iteration: effects once, files equal, units succeeded once\n"
    )


@pytest.mark.parametrize("run_by", ["workers", "host"])
def test_a_restore_to_the_point_of_a_pause_inside_a_unit_carries_on_from_it(
    references: Callable[..., dict[str, Any]], tmp_path: Path, run_by: str
) -> None:
    """A point taken while unit a runs (its first effect made and journaled) carries the unit's journal, on a
    worker as on the host; restored to that point (the newest: nothing of the unit happened after it) and
    resumed, unit a carries on in its own sandbox from its journal: its first effect is not made again and
    the file it wrote before the point is still there."""
    reference = references()
    side, store, gate = tmp_path / "side.log", tmp_path / "store", tmp_path / "gate"
    mission = write_mission(tmp_path, _units(side, gate=gate), max_parallel=2, workers=run_by == "workers")
    host = start_keel("run", str(mission), store=store, env=ENV)
    mid = mission_id_of(host)
    worker = _worker(store, units=2)
    try:
        held_by = functools.partial(_worker_at, store, mid, "a", 3) if run_by == "workers" else None
        wait_for(held_by or (lambda: (held := lease(store, mid, "a")) is not None and held.place.last_checkpoint >= 3))
        keel("pause", mid, store=store, check_rc=0)
        host.communicate(timeout=60)
        assert record(store, mid).state == MissionState.PAUSED and "a-2" not in side.read_text().split()
        gate.touch()  # the pause landed inside unit a: from here on it may make its second effect
        points = json.loads(keel("points", mid, "--json", store=store, check_rc=0).stdout)
        newest = max(points, key=lambda p: p["time"])["id"]
        keel("restore", mid, newest, store=store, check_rc=0)
        resumed = keel("resume", mid, "--json", store=store, timeout=120, env=ENV)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    finally:
        said = _stop(worker)
    assert record(store, mid).state == MissionState.COMPLETED, said
    _check(store, mid, side, reference)
