"""Random sequences of restore (with and without files), fork and resume over a mission's points: each
mission ends in the tree of an undisturbed run, and every command a resume runs is one the journal records
as run by that resume (a replay runs nothing).

The units' commands converge when run again on their own output (a restore without files leaves the files
as they are and runs the steps after the point again), and each appends a line to a log outside the
workspace, which no restore can rewind. `KEEL_REWIND_EXAMPLES` sets the number of examples (default 3,
derandomised; any other number draws fresh sequences)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keel.protocol.records import JournalEntry
from keel.storage import DB
from keel.storage.keys import mission_prefix
from tests.bundles.kit import git_workspace, keel, ok, read, record, toml
from tests.rewind.kit import points, sandbox_files

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL

EXAMPLES = int(os.environ.get("KEEL_REWIND_EXAMPLES", "3"))


def _units(side: Path) -> list[dict[str, Any]]:
    def run(tag: str, cmd: str) -> dict[str, Any]:
        return {"tool": "run", "args": {"cmd": f"echo {tag} >> {side}; {cmd}"}}

    return [
        {"id": "a", "params": {"steps": [{"tool": "write_file", "args": {"path": "a.txt", "content": "a\n"}}]}},
        {"id": "b", "params": {"steps": [run("b", "echo b > b.txt")]}},
        {
            "id": "c",
            "params": {
                "steps": [
                    {"tool": "write_file", "args": {"path": "c.txt", "content": "c1\n"}},
                    run("c1", "rm -f old.txt && printf 'c1\\nc2\\n' > c.txt"),
                    {"tool": "write_file", "args": {"path": "c2.txt", "content": "two\n"}},
                    run("c2", "printf 'c1\\nc2\\nc3\\n' > c.txt"),
                ]
            },
        },
        {
            "id": "d",
            "after": ["a", "b", "c"],
            "params": {
                "steps": [
                    {"tool": "write_file", "args": {"path": "d.txt", "content": "d\n"}},
                    run("d", "cat a.txt b.txt c.txt d.txt > all.txt"),
                ]
            },
        },
    ]


def _run_mission(tmp: Path, store: Path) -> tuple[str, Path]:
    git_workspace(tmp / "ws")
    side = tmp / "side.log"
    lines = ["[mission]", 'name = "prop"', 'agent = "python -m keel.agents.scripted"', 'workspace = "ws"']
    lines += ["", "[checkpoint]", 'policy = "every-step"']
    for unit in _units(side):
        lines += ["", "[[units]]"] + [f"{k} = {toml(v)}" for k, v in unit.items()]
    (tmp / "mission.toml").write_text("\n".join(lines) + "\n")
    ok(keel("run", str(tmp / "mission.toml"), "--plain", store=store))
    missions = json.loads(ok(keel("missions", "--json", store=store)).stdout)
    return str(missions[0]["id"]), side


def _run_entries(store: Path, mission_id: str) -> set[bytes]:
    """Keys of the journal entries that record a finished `run` command of the mission."""

    def scan(t: Any) -> set[bytes]:
        return {
            k
            for k, e in t.scan(DB.JOURNAL, mission_prefix(mission_id), JournalEntry)
            if e.summary.startswith("run ") and e.phase == "done"
        }

    return read(store, scan)  # type: ignore[no-any-return]


def _lines(side: Path) -> int:
    return len(side.read_text().splitlines()) if side.exists() else 0


def _resume(store: Path, mission_id: str, side: Path) -> None:
    """Resume to the end; the commands it ran are exactly the `run` entries it added to the journal."""
    before_entries, before_lines = _run_entries(store, mission_id), _lines(side)
    ok(keel("resume", mission_id, "--plain", store=store, timeout=120))
    assert record(store, mission_id).state.value == "completed"
    added = _run_entries(store, mission_id) - before_entries
    assert _lines(side) - before_lines == len(added), "a command ran that the journal does not record as run"


def _export(store: Path, mission_id: str, bundle: Path) -> None:
    """Export with the mission's own store: it carries the unfinished units' work into the mission sandbox
    and adds a point. Refused only when that work conflicts with the mission sandbox (after a restore
    without files, which can leave later files there): the mission stays paused."""
    done = keel("export", mission_id, "-o", str(bundle), store=store)
    if done.returncode == 5 and "cannot export mission" in done.stderr:
        assert record(store, mission_id).state.value == "paused", done.stderr
        return
    ok(done)


ACTION = st.one_of(
    st.tuples(st.just("restore"), st.floats(0, 1), st.booleans()),
    st.tuples(st.just("fork"), st.floats(0, 1), st.just(False)),
    st.tuples(st.just("resume"), st.just(0.0), st.just(False)),
    st.tuples(st.just("export"), st.just(0.0), st.just(False)),
)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize="KEEL_REWIND_EXAMPLES" not in os.environ,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(actions=st.lists(ACTION, min_size=1, max_size=4))
def test_random_restores_forks_and_resumes_end_in_the_undisturbed_tree(
    tmp_path_factory: pytest.TempPathFactory,
    store_folder: Callable[[Path], Path],
    actions: list[tuple[str, float, bool]],
) -> None:
    tmp = tmp_path_factory.mktemp("prop")
    store = store_folder(tmp / "store")
    mid, side = _run_mission(tmp, store)
    undisturbed = sandbox_files(Path(record(store, mid).sandbox))
    assert undisturbed["all.txt"] == b"a\nb\nc1\nc2\nc3\nd\n" and "old.txt" not in undisturbed
    current, touched = mid, {mid}
    for kind, where, files in actions:
        if kind == "resume":
            if record(store, current).state.value != "completed":
                _resume(store, current, side)
            continue
        if kind == "export":
            _export(store, current, tmp / "m.keelbundle")
            continue
        listed = sorted(points(store, current), key=lambda p: p["time"])
        point = listed[min(int(where * len(listed)), len(listed) - 1)]["id"]
        if kind == "restore":
            ok(keel("restore", current, point, *(["--files"] if files else []), store=store))
        else:
            out = json.loads(ok(keel("fork", current, point, "--json", store=store)).stdout)
            current = str(out["mission"])
            touched.add(current)
    for mission_id in sorted(touched):
        if record(store, mission_id).state.value != "completed":
            _resume(store, mission_id, side)
        assert sandbox_files(Path(record(store, mission_id).sandbox)) == undisturbed, (mission_id, actions)
    ok(keel("verify", store=store))
