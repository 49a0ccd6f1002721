"""What a killed process leaves behind never makes a mission repeat an effect or get stuck: a command still
running after its host died, a detached child of an agent's own command after its host or its worker died,
a stale `index.lock` in a unit's worktree, a worktree locked half-made by a killed `git worktree add`. Real
hosts, real SIGKILL, real git."""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import pytest
from engine_helpers import keel, kill, mission_id_of, read, record, start_keel, wait_for, write_mission
from subagent_helpers import command_running, git, lease, wait_gone

from keel.protocol.states import MissionState
from keel.server.engine.files import places
from keel.storage import missions as m

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL


def _git_workspace(folder: Path) -> None:
    ws = folder / "ws"
    ws.mkdir()
    (ws / "README.md").write_text("hello\n")
    git(ws, "init", "-q", "-b", "main")
    git(ws, "add", "-A")
    git(ws, "commit", "-q", "-m", "init")


def test_a_command_of_a_killed_host_is_stopped_before_its_effect_is_judged(tmp_path: Path) -> None:
    side, hold = tmp_path / "side.log", tmp_path / "hold"
    hold.touch()  # the command makes its effect only once the hold is gone: never before the test says so
    command = f"while [ -e {hold} ]; do sleep 0.05; done; echo a-1 >> {side}"
    units = [{"id": "a", "params": {"steps": [{"tool": "run", "args": {"cmd": command}}]}}]
    store = tmp_path / "store"
    host = start_keel("run", str(write_mission(tmp_path, units)), store=store)
    mid = mission_id_of(host)
    wait_for(
        lambda: (
            (e := read(store, lambda t: m.journal_get(t, mid, "a", 1))) is not None
            and e.phase == "intent"
            and command_running(str(side))  # its command line names the side log: this test's alone
        )
    )
    kill(host)  # the command's process group lives on: it would append its marker once the hold goes
    keel("resume", mid, store=store, check_rc=3)
    question = record(store, mid).question
    assert question is not None and question.kind == "uncertain-effect", question
    assert not command_running(str(side)), "recovery judged the effect while the killed host's command still ran"
    hold.unlink()
    assert not side.exists(), "the killed host's command made its effect after recovery had judged it"
    keel("answer", mid, "rerun", "--no-resume", store=store, check_rc=0)
    keel("resume", mid, store=store, check_rc=0)
    assert side.read_text().split() == ["a-1"]


def _running_argv(last: str) -> bool:
    """A process whose last argument is `last` (a test's own command text: no other test's matches)."""
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "cmdline").read_bytes().split(b"\0")[-2:-1] == [last.encode()]:
                return True
        except OSError:
            pass
    return False


# where a machine lets keel make cgroups (this one, as root), and where it does not: the run's tag and a subreaper
CONTAINMENT = [pytest.param({}, id="cgroup"), pytest.param({"KEEL_CGROUP_ROOT": ""}, id="no-cgroup")]


@pytest.mark.lmdb_only("which processes a run leaves is this machine's business; the store plays no part")
@pytest.mark.parametrize("env", CONTAINMENT)
@pytest.mark.parametrize("strike", ["host", "worker"])
def test_a_detached_child_of_an_agents_own_command_never_makes_its_effect_after_the_question(
    tmp_path: Path, strike: str, env: dict[str, str]
) -> None:
    """The agent runs a command itself (as Codex does, asked for first) whose effect a detached process makes
    (a double fork and setsid: out of the agent's process group and session) once HOLD is gone. A SIGKILL of
    the host, or of the unit's worker, while it runs leaves the effect in doubt; the person is asked, and
    answers as the side log says at that moment. The effect is then made exactly once."""
    side_dir = tmp_path / "side"  # outside the workspace: no restore can hide a repeat
    side_dir.mkdir()
    side, hold, done = side_dir / "effects.log", side_dir / "HOLD", side_dir / "done"
    hold.touch()
    detached = f"while [ -e {hold} ]; do sleep 0.05; done; echo ran >> {side}; touch {done}"
    command = f"( setsid sh -c '{detached}' >/dev/null 2>&1 & ); while [ ! -e {done} ]; do sleep 0.05; done; rm {done}"
    units = [{"id": "a", "params": {"steps": [{"shell": command}, {"now": True}]}}]
    store = tmp_path / "store"
    host = start_keel("run", str(write_mission(tmp_path, units)), store=store, env=env)
    try:
        mid = mission_id_of(host)
        wait_for(
            lambda: (
                (e := read(store, lambda t: m.journal_get(t, mid, "a", 1))) is not None
                and e.phase == "intent"
                and _running_argv(detached)
            )
        )
        held = lease(store, mid, "a")
        assert held is not None and held.pid > 0
        if strike == "host":
            kill(host)
            keel("resume", mid, store=store, check_rc=3, env=env)
        else:
            os.kill(held.pid, signal.SIGKILL)  # the host goes on: it starts the unit's worker again
            wait_for(lambda: record(store, mid).state == MissionState.WAITING_INPUT, timeout=60)
            host.communicate(timeout=60)
    finally:
        kill(host)
    question = record(store, mid).question
    assert question is not None and question.kind == "uncertain-effect", question
    left_running = _running_argv(detached)
    happened = side.exists()  # the truth when asked, as the person sees it
    hold.unlink()
    keel("answer", mid, "skip" if happened else "rerun", "--no-resume", store=store, check_rc=0)
    keel("resume", mid, store=store, check_rc=0, env=env)
    deadline = time.monotonic() + 10
    while _running_argv(detached) and time.monotonic() < deadline:  # a leftover makes its effect now
        time.sleep(0.05)
    assert side.read_text().split() == ["ran"], "the effect was made twice: a process of the struck run outlived it"
    assert not left_running, "the person was asked while a process of the run that started the effect still ran"
    assert record(store, mid).state == MissionState.COMPLETED


def test_a_stale_index_lock_in_a_unit_worktree_is_cleared(tmp_path: Path) -> None:
    _git_workspace(tmp_path)
    side = tmp_path / "side.log"
    units = [
        {
            "id": "a",
            "params": {
                "steps": [
                    {"tool": "write_file", "args": {"path": "a.txt", "content": "A\n"}},
                    {"tool": "run", "args": {"cmd": f"echo a-1 >> {side}"}},
                    {"sleep": 1.0},
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
    wait_gone(held.pid, timeout=3.0)
    gitdir = Path((Path(held.place.sandbox) / ".git").read_text().split(":", 1)[1].strip())
    (gitdir / "index.lock").write_text("")  # what a worker killed inside `git add`/`git commit` leaves
    keel("resume", mid, store=store, check_rc=0)
    assert side.read_text().split() == ["a-1"]
    sandbox = Path(record(store, mid).sandbox)
    assert (sandbox / "a.txt").read_text() == "A\n"
    assert "a.txt" in git(sandbox, "ls-files")


def test_a_worktree_left_locked_by_a_killed_worktree_add_is_taken_over(tmp_path: Path) -> None:
    _git_workspace(tmp_path)
    units = [
        {"id": "b", "params": {"steps": [{"now": True}, {"sleep": 2}]}},
        {
            "id": "a",
            "after": ["b"],
            "params": {"steps": [{"tool": "write_file", "args": {"path": "a.txt", "content": "A\n"}}]},
        },
    ]
    store = tmp_path / "store"
    host = start_keel("run", str(write_mission(tmp_path, units)), store=store)
    mid = mission_id_of(host)
    wait_for(lambda: read(store, lambda t: m.journal_get(t, mid, "b", 1)) is not None)
    kill(host)
    # unit a's worktree as a `git worktree add` killed half-way leaves it: registered, locked
    # "initializing", its folder missing ("a missing but locked worktree")
    target = places.unit_sandbox_path(store, mid, "a")
    mission_sandbox = Path(record(store, mid).sandbox)
    git(mission_sandbox, "worktree", "add", "-q", "-b", f"keel/{mid}-units/a", str(target), "HEAD")
    admin = Path((target / ".git").read_text().split(":", 1)[1].strip())
    (admin / "locked").write_text("initializing\n")
    shutil.rmtree(target)
    done = keel("resume", mid, store=store, timeout=90)
    assert done.returncode == 0, f"{done.stderr[-1500:]}\n{record(store, mid).error}"
    assert (Path(record(store, mid).sandbox) / "a.txt").read_text() == "A\n"
