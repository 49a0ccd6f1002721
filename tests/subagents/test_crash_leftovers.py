"""What a killed process leaves behind never makes a mission repeat an effect or get stuck: a command still
running after its host died, a stale `index.lock` in a unit's worktree, a worktree locked half-made by a
killed `git worktree add`. Real hosts, real SIGKILL, real git."""

from __future__ import annotations

import shutil
from pathlib import Path

from engine_helpers import keel, kill, mission_id_of, read, record, start_keel, wait_for, write_mission
from subagent_helpers import command_running, git, lease, wait_gone

from keel.server.engine.files import places
from keel.storage import missions as m


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
