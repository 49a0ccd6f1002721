"""A full disk under a running mission, on real tmpfs mounts: the store's filesystem, the sandboxes' (with
the workspace), and both at once (`--store` on the small disk). Each time `keel run` exits 3 with the
mission paused (`disk_full`) and a message naming the mount; no ENOSPC is journaled as a tool's result;
after the filler is removed `keel resume` completes with every effect exactly once and the files of an
undisturbed run, and `keel verify` passes."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from engine_helpers import files, keel, read, record, sandbox_of, start_keel, wait_for, write_mission

from keel.protocol.states import MissionState, PauseReason
from keel.server.engine import unitview
from keel.storage import missions as m
from tests import tmpfs

BIG = "x" * 100_000 + "\n"  # a write that surely needs fresh space (store pages or sandbox blocks)
MARKERS = ["a1", "a2", "b1", "b2", "c1"]
Mount = Callable[..., Path]


def _units(side: Path, gate: Path) -> list[dict]:
    """Effects: each `run` appends one marker to `side` (outside any tmpfs). Unit a's first command
    blocks until `gate` exists: the test fills the disk while it waits."""
    wait = f"while [ ! -e {gate} ]; do sleep 0.02; done"
    return [
        {
            "id": "a",
            "params": {
                "steps": [
                    {"tool": "write_file", "args": {"path": "a.txt", "content": "a\n"}},
                    {"tool": "run", "args": {"cmd": f"echo a1 >> {side}; {wait}"}},
                    {"tool": "write_file", "args": {"path": "big.txt", "content": BIG}},
                    {"tool": "run", "args": {"cmd": f"echo a2 >> {side}"}},
                    {"tool": "write_file", "args": {"path": "a2.txt", "content": "a two\n"}},
                ]
            },
        },
        {
            "id": "b",
            "params": {
                "steps": [
                    {"tool": "write_file", "args": {"path": "b.txt", "content": "b\n"}},
                    {"tool": "run", "args": {"cmd": f"echo b1 >> {side}"}},
                    {"sleep": 0.2},
                    {"tool": "run", "args": {"cmd": f"echo b2 >> {side}"}},
                ]
            },
        },
        {
            "id": "c",
            "after": ["a", "b"],
            "params": {
                "steps": [
                    {"tool": "run", "args": {"cmd": f"echo c1 >> {side}"}},
                    {"tool": "write_file", "args": {"path": "c.txt", "content": "c\n"}},
                ]
            },
        },
    ]


def _git_workspace(ws: Path) -> None:
    ws.mkdir(parents=True, exist_ok=True)
    (ws / "README").write_text("the person's project\n")
    git = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q", "-b", "main"], cwd=ws, check=True)
    subprocess.run([*git, "add", "."], cwd=ws, check=True)
    subprocess.run([*git, "commit", "-qm", "init"], cwd=ws, check=True)


def _mission(folder: Path, ws: Path, side: Path, gate: Path) -> Path:
    _git_workspace(ws)
    return write_mission(folder, _units(side, gate), workspace=str(ws), max_parallel=2)


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[Mount]:
    """mount(dir, size) mounts a real tmpfs there; every one is unmounted afterwards."""
    mounted: list[Path] = []

    def do(where: Path, size: str = "3m") -> Path:
        mounted.append(tmpfs.mount(where, size))
        return where

    try:
        yield do
    finally:
        for where in reversed(mounted):
            tmpfs.unmount(where)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The mission sandbox's files after an undisturbed run on an ordinary disk."""
    root = tmp_path_factory.mktemp("reference")
    gate = root / "gate"
    gate.touch()
    mission = _mission(root, root / "ws", root / "side.log", gate)
    store = root / "keel" / "store"
    mid = json.loads(keel("run", str(mission), "--json", store=store, check_rc=0).stdout.splitlines()[0])["mission"]
    assert sorted((root / "side.log").read_text().split()) == sorted(MARKERS)
    return files(sandbox_of(store, mid))


def _run_until_full(mission: Path, store: Path, side: Path, gate: Path, mnt: Path, leave: int = 0) -> tuple[str, Path]:
    """`keel run`; once the first effect is in the side log, fill the disk (but about `leave` bytes) and let
    the unit go on."""
    proc = start_keel("run", str(mission), store=store)
    try:
        assert proc.stdout is not None
        mid = json.loads(proc.stdout.readline())["mission"]
        wait_for(lambda: side.exists() and "a1" in side.read_text().split(), timeout=60)
        filler = tmpfs.fill(mnt, leave)
        gate.touch()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert proc.returncode == 3, f"keel run -> {proc.returncode}\n{out}\n{err}"
    assert "Traceback" not in err and "Traceback" not in out
    last = json.loads(out.splitlines()[-1])
    assert (
        last["event"] == "log"
        and f"mission {mid} paused (disk_full): disk full: the filesystem mounted at {mnt} " in last["message"]
    ), last
    assert "\n" not in last["message"]
    return mid, filler


def _assert_paused_for_disk_full(store: Path, mid: str, mnt: Path) -> None:
    rec = record(store, mid)
    assert rec.state == MissionState.PAUSED and rec.pause_reason == PauseReason.DISK_FULL, rec
    assert f"the filesystem mounted at {mnt} " in rec.error, rec.error
    assert rec.host is None


def _no_space_journaled(store: Path, mid: str) -> list[str]:
    """Journal entries (any unit, any lane) whose result or error mentions a full disk."""

    def scan(txn: object) -> list[str]:
        found = []
        for unit in ("a", "b", "c"):
            for entry in m.journal_entries(txn, mid, unit):  # type: ignore[arg-type]
                text = json.dumps(entry.result, default=str) + entry.error
                if "No space left" in text or "Input/output error" in text or "disk full" in text:
                    found.append(f"{unit}/{entry.seq} {entry.phase}: {text[:200]}")
        return found

    return read(store, scan)  # type: ignore[no-any-return]


def _resume_and_check(store: Path, mid: str, side: Path, reference: dict[str, bytes]) -> None:
    keel("resume", mid, store=store, timeout=180, check_rc=0)
    assert record(store, mid).state == MissionState.COMPLETED
    assert sorted(side.read_text().split()) == sorted(MARKERS), side.read_text()
    assert files(sandbox_of(store, mid)) == reference
    keel("verify", store=store, timeout=180, check_rc=0)
    assert _no_space_journaled(store, mid) == []


def _fill_pause_and_resume(
    mission: Path, store: Path, side: Path, gate: Path, mnt: Path, reference: dict[str, bytes]
) -> None:
    """The disk at `mnt` fills mid-mission: paused `disk_full` naming it, nothing journaled about it, and
    once the filler is removed `keel resume` completes with the files of an undisturbed run."""
    mid, filler = _run_until_full(mission, store, side, gate, mnt)
    _assert_paused_for_disk_full(store, mid, mnt)
    assert _no_space_journaled(store, mid) == []
    filler.unlink()
    _resume_and_check(store, mid, side, reference)


def test_store_disk_fills_mid_mission(tmp_path: Path, mount: Mount, reference: dict[str, bytes]) -> None:
    """(a) Only the store is on the small disk (the sandboxes are next to it, on an ordinary one)."""
    side, gate = tmp_path / "side.log", tmp_path / "gate"
    store = mount(tmp_path / "keel" / "store")
    mission = _mission(tmp_path, tmp_path / "ws", side, gate)
    mid, filler = _run_until_full(mission, store, side, gate, store)
    _assert_paused_for_disk_full(store, mid, store)
    assert _no_space_journaled(store, mid) == []
    assert not (store / "reserve").exists()  # spent to record the steps in flight and the pause
    again = keel("resume", mid, store=store, timeout=60)  # still full: refused, nothing runs, nothing written
    assert again.returncode == 3 and again.stderr.startswith(f"keel: disk full: the filesystem mounted at {store} ")
    assert len(again.stderr.strip().splitlines()) == 1
    assert record(store, mid).state == MissionState.PAUSED
    filler.unlink()
    _resume_and_check(store, mid, side, reference)
    assert (store / "reserve").stat().st_size == 1024 * 1024  # made again once there was room


def test_sandbox_disk_fills_mid_mission(tmp_path: Path, mount: Mount, reference: dict[str, bytes]) -> None:
    """(b) The workspace and the sandboxes are on the small disk; the store is not."""
    side, gate = tmp_path / "side.log", tmp_path / "gate"
    mnt = mount(tmp_path / "mnt", "4m")  # the git workspace and its worktrees need a little more
    (tmp_path / "keel").mkdir()
    (mnt / "sandboxes").mkdir()
    (tmp_path / "keel" / "sandboxes").symlink_to(mnt / "sandboxes")
    store = tmp_path / "keel" / "store"
    mission = _mission(tmp_path, mnt / "ws", side, gate)
    _fill_pause_and_resume(mission, store, side, gate, mnt, reference)


def test_store_and_sandboxes_share_the_full_disk(tmp_path: Path, mount: Mount, reference: dict[str, bytes]) -> None:
    """(c) `--store` on the small disk: store, sandboxes and workspace fill up together. A failed write
    there may reach keel as LMDB's EIO or as an ENOSPC from a tool: neither is ever journaled."""
    side, gate = tmp_path / "side.log", tmp_path / "gate"
    mnt = mount(tmp_path / "mnt", "4m")  # the git workspace and its worktrees need a little more
    store = mnt / "keel" / "store"
    mission = _mission(tmp_path, mnt / "ws", side, gate)
    _fill_pause_and_resume(mission, store, side, gate, mnt, reference)


def _git_dir_on(ws: Path, mnt: Path) -> None:
    """The workspace's .git moved onto the small disk (a link in its place): the workspace, the sandboxes
    and the store stay on an ordinary one, and only git's own writes (objects, index, refs) fill up."""
    shutil.move(ws / ".git", mnt / "git")
    (ws / ".git").symlink_to(mnt / "git")


def test_workspace_git_disk_fills_mid_mission(tmp_path: Path, mount: Mount, reference: dict[str, bytes]) -> None:
    """(d) Only the workspace's .git is on the small disk: a unit's commit or merge fails there ("Out of
    diskspace", an index that cannot be written). The host pauses `disk_full` naming that filesystem — never
    exits 1 leaving the mission `running` — and resume completes the mission."""
    side, gate = tmp_path / "side.log", tmp_path / "gate"
    mnt = mount(tmp_path / "mnt", "3m")
    mission = _mission(tmp_path, tmp_path / "ws", side, gate)
    _git_dir_on(tmp_path / "ws", mnt)
    store = tmp_path / "keel" / "store"
    _fill_pause_and_resume(mission, store, side, gate, mnt, reference)


def test_unit_whose_worktree_cannot_be_made_for_want_of_space_is_not_failed(tmp_path: Path, mount: Mount) -> None:
    """A unit's `git worktree add` fails because the workspace's .git is full (git may only say it
    "couldn't write" a ref or lock): the mission pauses `disk_full` naming that filesystem and the unit is not
    recorded failed, so the first `keel resume` after space is freed completes the mission."""
    side, gate = tmp_path / "side.log", tmp_path / "gate"
    mnt = mount(tmp_path / "mnt", "3m")
    wait = f"while [ ! -e {gate} ]; do sleep 0.02; done"
    units = [  # a changes no file: finishing it needs a few pages of .git at most; c's worktree needs more
        {"id": "a", "params": {"steps": [{"tool": "run", "args": {"cmd": f"echo a1 >> {side}; {wait}"}}]}},
        {"id": "c", "after": ["a"], "params": {"steps": [{"tool": "run", "args": {"cmd": f"echo c1 >> {side}"}}]}},
    ]
    _git_workspace(tmp_path / "ws")
    mission = write_mission(tmp_path, units, workspace=str(tmp_path / "ws"))
    _git_dir_on(tmp_path / "ws", mnt)
    store = tmp_path / "keel" / "store"
    mid, filler = _run_until_full(mission, store, side, gate, mnt, leave=16 * 1024)
    _assert_paused_for_disk_full(store, mid, mnt)
    assert "git worktree add" in record(store, mid).error  # the strike landed on c's worktree
    assert side.read_text().split() == ["a1"]
    filler.unlink()
    keel("resume", mid, store=store, timeout=180, check_rc=0)
    assert record(store, mid).state == MissionState.COMPLETED
    assert side.read_text().split() == ["a1", "c1"]


def _verifications(store: Path, mid: str) -> list[tuple[bool, str]]:
    """Every verification recorded for the mission: (passed, its output)."""
    evidence = read(store, lambda t: [e for _, e in m.evidence_after(t, mid)])
    return [(e.data["ok"], e.data["output"]) for e in evidence if e.kind == "verification"]


@pytest.mark.usefixtures("store_backend")  # its store is tmp_path/store: on each backend
def test_a_verification_failing_for_want_of_space_is_a_pause_and_runs_again_on_resume(
    tmp_path: Path, mount: Mount
) -> None:
    """A unit's verification fails (exit 2) because the sandbox's filesystem is full, and removes what it
    wrote, so that room is left once it has ended: its failure is the full disk's, not a result. The mission
    pauses `disk_full`; after the filler is removed one `keel resume` runs the verification again (it passes)
    and completes with the unit's files."""
    side, gate = tmp_path / "side.log", tmp_path / "gate"
    mnt = mount(tmp_path / "mnt", "3m")
    (mnt / "sandboxes").mkdir()
    (tmp_path / "sandboxes").symlink_to(mnt / "sandboxes")  # next to the store, on either backend
    wait = f"while [ ! -e {gate} ]; do sleep 0.02; done"
    check = (  # a build's output, removed when the build fails (as make's .DELETE_ON_ERROR does)
        f"if head -c 600000 /dev/zero > check.out; then rm check.out; echo checked >> {side}; "
        "else rm -f check.out; exit 2; fi"
    )
    units = [
        {
            "id": "a",
            "params": {
                "steps": [
                    {"tool": "write_file", "args": {"path": "a.txt", "content": "a\n"}},
                    {"tool": "run", "args": {"cmd": f"echo a1 >> {side}; {wait}"}},
                    {"tool": "run", "args": {"cmd": check, "verify": True}},
                ]
            },
        }
    ]
    _git_workspace(mnt / "ws")
    mission = write_mission(tmp_path, units, workspace=str(mnt / "ws"))
    store = tmp_path / "store"
    mid, filler = _run_until_full(mission, store, side, gate, mnt, leave=400 * 1024)
    _assert_paused_for_disk_full(store, mid, mnt)
    assert "exited with code 2: it said there is no space left" in record(store, mid).error  # the verification
    assert _verifications(store, mid) == []  # nothing of it is a result
    filler.unlink()
    keel("resume", mid, store=store, timeout=180, check_rc=0)
    assert record(store, mid).state == MissionState.COMPLETED
    assert side.read_text().split() == ["a1", "checked"]
    assert files(sandbox_of(store, mid)) == {"README": b"the person's project\n", "a.txt": b"a\n"}
    assert [ok for ok, _ in _verifications(store, mid)] == [True]
    assert _no_space_journaled(store, mid) == []


def test_a_unit_sandbox_that_cannot_be_checked_out_for_want_of_space_is_a_pause(tmp_path: Path, mount: Mount) -> None:
    """`--store` on a 3 MB tmpfs (the sandboxes next to it): unit c's sandbox cannot be made, since its
    600 KB file does not fit; git removes what it could not write and says only "unable to write file",
    so room is left. The mission pauses `disk_full` with c not failed, and the first `keel resume` after the
    filler is removed completes it."""
    side, gate = tmp_path / "side.log", tmp_path / "gate"
    mnt = mount(tmp_path / "mnt", "3m")
    wait = f"while [ ! -e {gate} ]; do sleep 0.02; done"
    units = [
        {"id": "a", "params": {"steps": [{"tool": "run", "args": {"cmd": f"echo a1 >> {side}; {wait}"}}]}},
        {"id": "c", "after": ["a"], "params": {"steps": [{"tool": "run", "args": {"cmd": f"echo c1 >> {side}"}}]}},
    ]
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "big.bin").write_bytes(bytes(range(256)) * 2400)  # 600 KB in every sandbox
    _git_workspace(ws)
    mission = write_mission(tmp_path, units, workspace=str(ws))
    store = mnt / "keel" / "store"
    mid, filler = _run_until_full(mission, store, side, gate, mnt, leave=400 * 1024)
    _assert_paused_for_disk_full(store, mid, mnt)
    assert f"sandboxes/{mid}-units/c: " in record(store, mid).error  # the strike landed on c's checkout
    states = read(store, lambda t: unitview.unit_states(t, mid))
    assert states["c"] != "failed", states
    filler.unlink()
    keel("resume", mid, store=store, timeout=180, check_rc=0)
    assert record(store, mid).state == MissionState.COMPLETED
    assert side.read_text().split() == ["a1", "c1"]
    assert files(sandbox_of(store, mid))["big.bin"] == (ws / "big.bin").read_bytes()


@pytest.mark.usefixtures("store_backend")  # its store is tmp_path/store: on each backend
def test_a_unit_home_that_cannot_be_made_for_want_of_space_is_a_pause(tmp_path: Path, mount: Mount) -> None:
    """The units' homes are on a tmpfs that has no inode left: making unit a's home fails with ENOSPC. The
    mission pauses `disk_full` naming that filesystem (the host neither fails the unit nor dies of the
    error), and once files are removed there the first `keel resume` completes it."""
    side = tmp_path / "side.log"
    mnt = mount(tmp_path / "mnt", "1m,nr_inodes=64")
    (tmp_path / "homes").symlink_to(mnt)  # next to the store, on either backend
    ballast = mnt / "ballast"
    ballast.mkdir()
    with pytest.raises(OSError, match="No space left on device"):
        for n in range(100):
            (ballast / str(n)).touch()
    units = [{"id": "a", "params": {"steps": [{"tool": "run", "args": {"cmd": f"echo a1 >> {side}"}}]}}]
    mission = write_mission(tmp_path, units)
    store = tmp_path / "store"
    run = keel("run", str(mission), "--json", store=store, timeout=120)
    assert run.returncode == 3, f"keel run -> {run.returncode}\n{run.stdout}\n{run.stderr}"
    assert "Traceback" not in run.stderr
    mid = json.loads(run.stdout.splitlines()[0])["mission"]
    _assert_paused_for_disk_full(store, mid, mnt)
    assert "unit a's files at" in record(store, mid).error
    assert not side.exists()
    shutil.rmtree(ballast)
    keel("resume", mid, store=store, timeout=120, check_rc=0)
    assert record(store, mid).state == MissionState.COMPLETED
    assert side.read_text().split() == ["a1"]
