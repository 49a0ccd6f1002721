"""Subagents with real processes: a zombie worker, parent death, lost and tampered sandboxes, merging
into the mission branch, and the person's checkout left alone."""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import (
    files,
    keel,
    kill,
    mission_id_of,
    read,
    record,
    start_keel,
    stop_process,
    unit_events,
    wait_for,
    write_mission,
)
from subagent_helpers import (
    alive,
    all_leases,
    checkout_fingerprint,
    git,
    lease,
    uncertain_effect,
    wait_gone,
    writes_blocked_by,
)

from keel.protocol.states import MissionState
from keel.storage import missions as m

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL

FAST_LEASES = {"KEEL_LEASE_TTL_S": "1.0"}


def _events(store: Path, mid: str, kind: str) -> list[Any]:
    return [e for _, e in read(store, lambda t: m.events_after(t, mid)) if e.kind == kind]


def _evidence(store: Path, mid: str, kind: str) -> list[Any]:
    return [e for _, e in read(store, lambda t: list(m.evidence_after(t, mid))) if e.kind == kind]


def _stop_outside_a_commit(store: Path, pid: int) -> None:
    """SIGSTOP the worker, but not while it holds LMDB's write lock (that would stop every writer)."""
    for _ in range(50):
        stop_process(pid)
        if not writes_blocked_by(store, pid):
            return
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.05)
    raise AssertionError("the worker always held the write lock")


def _slow(gate: Path) -> dict[str, Any]:
    """A unit that writes slow.txt, journals a step, and works until `gate` exists (its worker is stopped
    before it ends)."""
    steps = [
        {"tool": "write_file", "args": {"path": "slow.txt", "content": "slow\n"}},
        {"now": True},
        {"wait_file": str(gate)},
    ]
    return {"id": "slow", "params": {"steps": steps}}


def test_a_zombie_workers_late_completion_is_rejected(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    units = [
        _slow(gate),
        {"id": "long", "params": {"steps": [{"sleep": 8.0}]}},
    ]
    store = tmp_path / "store"
    host = start_keel("run", str(write_mission(tmp_path, units)), store=store, env=FAST_LEASES)
    zombie = None
    try:
        mid = mission_id_of(host)
        wait_for(lambda: (x := lease(store, mid, "slow")) is not None and x.pid > 0 and x.place.last_checkpoint >= 2)
        zombie = lease(store, mid, "slow")
        assert zombie is not None
        _stop_outside_a_commit(store, zombie.pid)
        gate.touch()
        # the lease expires, the unit is taken over under epoch 2 and completes there
        wait_for(lambda: (x := lease(store, mid, "slow")) is not None and x.state == "done", timeout=120)
        winner = lease(store, mid, "slow")
        assert winner is not None and winner.epoch > zombie.epoch and winner.pid != zombie.pid
        assert alive(zombie.pid), "the host must fence the old worker, not rely on killing it"
        os.kill(zombie.pid, signal.SIGCONT)  # its agent answered unit/run meanwhile: it tries to complete
        wait_gone(zombie.pid, timeout=15)
        host.communicate(timeout=30)
        assert host.returncode == 0
    finally:
        kill(host)
        if zombie is not None and alive(zombie.pid):  # a failed check left it stopped: it must not linger
            os.kill(zombie.pid, signal.SIGKILL)
    rejected = _events(store, mid, "lease")
    assert any(e.state == "expired" and e.unit == "slow" for e in rejected), rejected
    assert any(e.state == "rejected" and f"epoch {zombie.epoch}" in e.message for e in rejected), rejected
    final = lease(store, mid, "slow")
    assert final is not None and (final.epoch, final.pid, final.state) == (winner.epoch, winner.pid, "done")
    assert unit_events(store, mid).count(("slow", "succeeded")) == 1
    assert record(store, mid).state == MissionState.COMPLETED


def test_a_zombie_that_completes_before_the_next_start_is_taken_over_not_run_again(tmp_path: Path) -> None:
    """A fenced worker may still record its unit's completion until a new epoch is granted. When it does,
    while the host is about to start the unit again (held at the fault point `UNIT_START`), the host takes
    the completion over as a recovering host does: the unit's files are merged from its own sandbox and its
    agent is not started again (no new epoch)."""
    gate, mark = tmp_path / "gate", tmp_path / "unit-start.mark"
    units = [
        _slow(gate),
        {"id": "after", "after": ["slow"], "params": {"steps": [{"tool": "read_file", "args": {"path": "slow.txt"}}]}},
    ]
    store = tmp_path / "store"
    env = {**FAST_LEASES, "KEEL_FAULT_UNIT_START": f"{mark}:hold"}
    host = start_keel("run", str(write_mission(tmp_path, units)), store=store, env=env)
    zombie = None
    try:
        mid = mission_id_of(host)
        wait_for(mark.exists, timeout=120)  # slow's first start
        mark.unlink()
        wait_for(lambda: (x := lease(store, mid, "slow")) is not None and x.pid > 0 and x.place.last_checkpoint >= 2)
        zombie = lease(store, mid, "slow")
        assert zombie is not None
        _stop_outside_a_commit(store, zombie.pid)
        gate.touch()
        wait_for(mark.exists, timeout=120)  # taken over: slow is about to start again
        held = lease(store, mid, "slow")
        assert held is not None and (held.epoch, held.state) == (zombie.epoch, "expired"), held
        os.kill(zombie.pid, signal.SIGCONT)  # its agent answered unit/run meanwhile: it completes
        wait_for(lambda: (x := lease(store, mid, "slow")) is not None and x.state == "done", timeout=60)
        mark.unlink()
        wait_for(mark.exists, timeout=120)  # `after` starts
        mark.unlink()
        out, err = host.communicate(timeout=120)
        assert host.returncode == 0, f"{out}\n{err}"
    finally:
        kill(host)
        if zombie is not None and alive(zombie.pid):
            os.kill(zombie.pid, signal.SIGKILL)
    final = lease(store, mid, "slow")
    assert final is not None and (final.epoch, final.state) == (zombie.epoch, "done"), "slow was started again"
    assert unit_events(store, mid).count(("slow", "succeeded")) == 1
    assert unit_events(store, mid).count(("after", "succeeded")) == 1
    assert record(store, mid).state == MissionState.COMPLETED
    assert files(Path(record(store, mid).sandbox)).get("slow.txt") == b"slow\n"


def test_parent_death_stops_subagents_within_two_seconds_and_resume_finishes(tmp_path: Path) -> None:
    units = [{"id": u, "params": {"steps": [{"now": True}, {"sleep": 4.0}, {"random": True}]}} for u in ("a", "b")]
    store = tmp_path / "store"
    host = start_keel("run", str(write_mission(tmp_path, units)), store=store)
    mid = mission_id_of(host)
    wait_for(  # one read: `all` over a read made before the leases were granted is true
        lambda: (
            len(found := all_leases(store, mid)) == 2 and all(x.pid > 0 and x.place.last_checkpoint >= 1 for x in found)
        )
    )
    workers = [x.pid for x in all_leases(store, mid)]
    kill(host)
    took = [wait_gone(pid, timeout=2.0) for pid in workers]
    assert max(took) < 2.0
    assert {x.state for x in all_leases(store, mid)} == {"orphaned"}
    keel("resume", mid, store=store, check_rc=0)
    head = read(store, lambda t: m.head_checkpoint(t, mid))
    assert {u: mk.state.value for u, mk in head.units.items()} == {"a": "succeeded", "b": "succeeded"}
    assert {x.state for x in all_leases(store, mid)} == {"done"}


def test_a_pause_leaves_no_unit_lease_reading_running(tmp_path: Path) -> None:
    """The host stops its workers for a pause (`shutdown`, then their stdin closed): each records its lease
    orphaned, whichever comes first, its agent's exit or the closed pipe. A lease left `running` would show
    a live unit in the editor's Subagents view until it expired."""
    units = [{"id": u, "params": {"steps": [{"now": True}, {"sleep": 30.0}, {"random": True}]}} for u in "abc"]
    store = tmp_path / "store"
    host = start_keel("run", str(write_mission(tmp_path, units, max_parallel=3)), store=store)
    mid = mission_id_of(host)
    wait_for(lambda: len(found := all_leases(store, mid)) == 3 and all(x.place.last_checkpoint >= 1 for x in found))
    try:
        keel("pause", mid, store=store, check_rc=0)
        host.communicate(timeout=30)
    finally:
        kill(host)
    assert record(store, mid).state == MissionState.PAUSED
    assert {x.unit: x.state for x in all_leases(store, mid)} == dict.fromkeys("abc", "orphaned")


@pytest.mark.parametrize("damage", ["deleted", "tampered"])
def test_a_lost_or_tampered_sandbox_with_effects_is_a_question_never_a_silent_rerun(
    tmp_path: Path, damage: str
) -> None:
    side = tmp_path / "side.log"
    units = [
        {
            "id": "a",
            "params": {
                "steps": [
                    {"tool": "write_file", "args": {"path": "a.txt", "content": "A\n"}},
                    {"tool": "run", "args": {"cmd": f"echo ran >> {side}"}},
                    {"sleep": 30},
                ]
            },
        }
    ]
    store = tmp_path / "store"
    host = start_keel("run", str(write_mission(tmp_path, units)), store=store)
    mid = mission_id_of(host)
    wait_for(lambda: (e := read(store, lambda t: m.journal_get(t, mid, "a", 2))) is not None and e.phase == "done")
    held = lease(store, mid, "a")
    assert held is not None
    kill(host)
    wait_gone(held.pid, timeout=2.0)
    sandbox = Path(held.place.sandbox)
    if damage == "deleted":
        shutil.rmtree(sandbox)
    else:
        (sandbox / "a.txt").write_text("edited by someone else\n")
    keel("resume", mid, store=store, check_rc=3)
    question = record(store, mid).question
    assert question is not None and question.kind == "reexecute" and question.unit == "a", question
    assert "2 effect(s)" in question.text and "echo ran" in question.text
    assert question.choices == (("rerun", "fail") if damage == "deleted" else ("continue", "rerun"))
    assert side.read_text().split() == ["ran"]  # nothing ran again before the person answered
    resumed = start_keel("answer", mid, "rerun", store=store)
    wait_for(lambda: len(side.read_text().split()) == 2)  # the person chose to run it again, effect and all
    kill(resumed)
    evidence = _evidence(store, mid, "reexecuted")
    assert len(evidence) == 1 and "a person chose to run it again" in evidence[0].summary, evidence
    assert lease(store, mid, "a").lane == "a#1"  # type: ignore[union-attr]
    head = read(store, lambda t: m.head_checkpoint(t, mid))
    assert head.units["a"].epoch == 1
    keel("pause", mid, "--wait", "60", store=store, check_rc=0)  # the host `answer` started: not left running


def test_a_tampered_sandbox_the_person_keeps_resumes_from_the_journal(tmp_path: Path) -> None:
    side = tmp_path / "side.log"
    units = [
        {
            "id": "a",
            "params": {
                "steps": [
                    {"tool": "run", "args": {"cmd": f"echo ran >> {side}"}},
                    {"tool": "write_file", "args": {"path": "a.txt", "content": "A\n"}},
                    {"sleep": 1.5},
                    {"tool": "read_file", "args": {"path": "a.txt"}},
                ]
            },
        }
    ]
    store = tmp_path / "store"
    host = start_keel("run", str(write_mission(tmp_path, units)), store=store)
    mid = mission_id_of(host)
    wait_for(lambda: (e := read(store, lambda t: m.journal_get(t, mid, "a", 2))) is not None and e.phase == "done")
    held = lease(store, mid, "a")
    assert held is not None
    kill(host)
    wait_gone(held.pid, timeout=2.0)
    (Path(held.place.sandbox) / "a.txt").write_text("edited by someone else\n")
    keel("resume", mid, store=store, check_rc=3)
    keel("answer", mid, "continue", "--no-resume", store=store, check_rc=0)
    keel("resume", mid, store=store, check_rc=0)
    assert side.read_text().split() == ["ran"]
    assert not _evidence(store, mid, "reexecuted")
    assert record(store, mid).state == MissionState.COMPLETED


def test_a_lost_sandbox_without_effects_starts_again_by_itself(tmp_path: Path) -> None:
    units = [{"id": "a", "params": {"steps": [{"random": True}, {"now": True}, {"sleep": 30}]}}]
    store = tmp_path / "store"
    host = start_keel("run", str(write_mission(tmp_path, units)), store=store)
    mid = mission_id_of(host)
    wait_for(lambda: (e := read(store, lambda t: m.journal_get(t, mid, "a", 2))) is not None and e.phase == "done")
    held = lease(store, mid, "a")
    assert held is not None
    kill(host)
    wait_gone(held.pid, timeout=2.0)
    shutil.rmtree(held.place.sandbox)
    resumed = start_keel("resume", mid, store=store)
    wait_for(lambda: bool(_evidence(store, mid, "reexecuted")))
    kill(resumed)
    assert "is missing" in _evidence(store, mid, "reexecuted")[0].summary
    assert record(store, mid).question is None


def test_a_skipped_uncertain_effect_that_changed_files_is_not_mistaken_for_tampering(tmp_path: Path) -> None:
    side = tmp_path / "side.log"
    units = [
        {
            "id": "a",
            "params": {
                "steps": [
                    {"tool": "write_file", "args": {"path": "a.txt", "content": "A\n"}},
                    {"tool": "run", "args": {"cmd": f"echo made > made.txt && echo ran >> {side} && sleep 2"}},
                    {"tool": "read_file", "args": {"path": "made.txt"}},
                ]
            },
        }
    ]
    store, mid = uncertain_effect(tmp_path, units, side)
    keel("answer", mid, "skip", "--no-resume", store=store, check_rc=0)
    keel("resume", mid, store=store, check_rc=0)
    assert side.read_text() == "ran\n"  # never run again: neither the effect nor the unit from scratch
    assert _evidence(store, mid, "reexecuted") == []
    assert files(Path(record(store, mid).sandbox)) == {"a.txt": b"A\n", "made.txt": b"made\n"}


def test_the_persons_checkout_is_unchanged_and_units_merge_in_dependency_order(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    git(ws, "init", "-q", "-b", "main")
    (ws / "base.txt").write_text("base\n")
    (ws / "notes.txt").write_text("uncommitted\n")  # the person's own work in progress
    git(ws, "add", "base.txt")
    git(ws, "commit", "-q", "-m", "base")
    (ws / "base.txt").write_text("base, edited but not committed\n")

    def writes(uid: str) -> dict[str, Any]:
        return {"tool": "write_file", "args": {"path": f"{uid}.txt", "content": f"{uid}\n"}}

    units = [
        {"id": "a", "params": {"steps": [writes("a")]}},
        {"id": "b", "params": {"steps": [writes("b")]}},
        {
            "id": "c",
            "after": ["a", "b"],
            "params": {"steps": [{"tool": "read_file", "args": {"path": "a.txt"}}, writes("c")]},
        },
    ]
    before = checkout_fingerprint(ws)
    store = tmp_path / "store"
    keel("run", str(write_mission(tmp_path, units)), store=store, check_rc=0)
    assert checkout_fingerprint(ws) == before
    mid = read(store, m.list_missions)[0].id
    sandbox = Path(record(store, mid).sandbox)
    assert {k: v for k, v in files(sandbox).items()} == {
        "base.txt": b"base\n",
        "a.txt": b"a\n",
        "b.txt": b"b\n",
        "c.txt": b"c\n",
    }
    merges = git(sandbox, "log", "--merges", "--format=%s", f"keel/{mid}").splitlines()
    assert merges[0] == "keel: merge unit c" and sorted(merges[1:]) == ["keel: merge unit a", "keel: merge unit b"]
    assert {x.unit: x.place.merged for x in all_leases(store, mid)} == {"a": True, "b": True, "c": True}


def test_a_merge_conflict_asks_the_person_and_rerun_resolves_it(tmp_path: Path) -> None:
    units = [
        {
            "id": u,
            "params": {
                "steps": [
                    {"tool": "write_file", "args": {"path": "same.txt", "content": f"{u}\n"}},
                    {"sleep": 0.3 if u == "b" else 0},
                ]
            },
        }
        for u in ("a", "b")
    ]
    store = tmp_path / "store"
    keel("run", str(write_mission(tmp_path, units)), store=store, check_rc=3)
    mid = read(store, m.list_missions)[0].id
    question = record(store, mid).question
    assert record(store, mid).state == MissionState.WAITING_INPUT
    assert question is not None and question.kind == "merge-conflict" and "same.txt" in question.text
    loser = question.unit
    keel("answer", mid, "rerun", "--no-resume", store=store, check_rc=0)
    keel("resume", mid, store=store, check_rc=0)
    assert record(store, mid).state == MissionState.COMPLETED
    assert files(Path(record(store, mid).sandbox))["same.txt"] == f"{loser}\n".encode()
    assert [e.unit for e in _evidence(store, mid, "merge-conflict")] == [loser]
    assert [e.unit for e in _evidence(store, mid, "reexecuted")] == [loser]
    assert unit_events(store, mid).count((loser, "succeeded")) == 1


def test_a_sandbox_removed_under_a_running_unit_fails_it_and_records_nothing_for_its_next_call(
    tmp_path: Path,
) -> None:
    """A unit's sandbox folder removed while its agent runs: the next tool call is not run, its failure is
    not recorded as the call's result (a replay would only give it back), and the unit stops with an error
    naming the sandbox; the resume finds a lost sandbox with effects and asks, as after a crash."""
    side = tmp_path / "side.log"
    units = [
        {
            "id": "a",
            "params": {
                "steps": [
                    {"tool": "write_file", "args": {"path": "a.txt", "content": "A\n"}},
                    {"tool": "run", "args": {"cmd": f"echo ran >> {side}"}},
                    {"sleep": 3},
                    {"tool": "run", "args": {"cmd": f"echo again >> {side}"}},
                ]
            },
        }
    ]
    store = tmp_path / "store"
    host = start_keel("run", str(write_mission(tmp_path, units)), store=store)
    mid = mission_id_of(host)
    wait_for(lambda: (e := read(store, lambda t: m.journal_get(t, mid, "a", 2))) is not None and e.phase == "done")
    held = lease(store, mid, "a")
    assert held is not None
    shutil.rmtree(held.place.sandbox)
    out, err = host.communicate(timeout=60)
    assert host.returncode != 0 and f"sandbox {held.place.sandbox} is gone" in out + err, out + err
    journal = read(store, lambda t: m.journal_entries(t, mid, "a"))
    assert not [e for e in journal if "again" in e.summary], journal  # the last call left no entry
    assert side.read_text().split() == ["ran"]
    keel("resume", mid, store=store, check_rc=3)
    question = record(store, mid).question
    assert question is not None and question.kind == "reexecute" and question.unit == "a", question
