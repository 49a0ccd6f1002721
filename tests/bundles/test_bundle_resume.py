"""A mission paused midway on one machine, exported, imported into another store and a fresh clone,
resumed there: it completes with the same files and unit results as a run that was never interrupted.
The bundle carries nothing of the exporting machine (paths, user name, host name). The two stores are
on different backends: exported from LMDB into PostgreSQL, and from PostgreSQL into LMDB."""

from __future__ import annotations

import getpass
import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from tests.bundles.kit import (
    BINARY,
    files,
    git,
    git_workspace,
    head,
    keel,
    ok,
    record,
    store_snapshot,
    unit_results,
    wait_for,
    write_mission,
)
from tests.pgserver import PgServer

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL

UNITS = [
    {
        "id": "u1",
        "params": {
            "steps": [
                {"tool": "write_file", "args": {"path": "a.txt", "content": "alpha\n"}},
                {"tool": "write_file", "args": {"path": "sub/b.py", "content": "x = 1\n"}},
                {"tool": "run", "args": {"cmd": "rm old.txt && printf 'tail' >> data.bin"}},
            ]
        },
    },
    {
        "id": "u2",
        "after": ["u1"],
        "params": {
            "steps": [
                {"tool": "write_file", "args": {"path": "c.txt", "content": "gamma\n"}},
                {"sleep": 1.5},
                {"tool": "write_file", "args": {"path": "c2.txt", "content": "after the pause\n"}},
            ]
        },
    },
    {
        "id": "u3",
        "after": ["u2"],
        "params": {
            "steps": [
                {"tool": "write_file", "args": {"path": "d.txt", "content": "delta\n"}},
            ]
        },
    },
]


def _start(machine: Path) -> tuple[Path, str]:
    git_workspace(machine / "ws")
    return write_mission(machine, UNITS), ""


def test_export_pause_import_resume_matches_uninterrupted_run(
    tmp_path: Path, backend: str, store_folder: Callable[[Path], Path], pg_server: PgServer
) -> None:
    # the reference: an uninterrupted run
    ref = tmp_path / "ref"
    mission, _ = _start(ref)
    ok(keel("run", str(mission), "--plain", store=ref / "store"))
    ref_id = _only_mission(ref / "store")
    ref_files, ref_results = files(Path(record(ref / "store", ref_id).sandbox)), unit_results(ref / "store", ref_id)

    # machine A: run, pause in the middle of u2
    a = tmp_path / "a"
    mission, _ = _start(a)
    store_folder(a / "store")  # this test's backend; machine B has the other one
    proc = subprocess.Popen(
        [sys.executable, "-m", "keel.server.cli", "run", str(mission), "--json", "--store", str(a / "store")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        mission_id = json.loads(proc.stdout.readline())["mission"]

        def u1_done() -> bool:
            manifest = head(a / "store", mission_id)
            return (
                manifest is not None
                and manifest.units.get("u1") is not None
                and manifest.units["u1"].state.value == "succeeded"
            )

        wait_for(u1_done)
        ok(keel("pause", mission_id, "--wait", "20", store=a / "store"))
        out, err = proc.communicate(timeout=30)  # drains the pipes while the host stops
        assert proc.returncode == 3, f"{out}\n{err}"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)
    assert record(a / "store", mission_id).state.value == "paused"
    assert unit_results(a / "store", mission_id)["u3"][0] != "succeeded"

    bundle = tmp_path / "m.keelbundle"
    out = ok(keel("export", mission_id, "-o", str(bundle), "--json", store=a / "store"))
    summary = json.loads(out.stdout)
    assert summary["workspace"] == "git" and summary["signed"] is False
    data = bundle.read_bytes()
    assert str(tmp_path).encode() not in data and b"/tmp/" not in data
    for name in {getpass.getuser(), socket.gethostname(), os.uname().nodename}:
        # as a whole token (a short host name like "vm" may occur inside a base32 mission id)
        token = re.compile(rb"(?<![A-Za-z0-9])" + re.escape(name.encode()) + rb"(?![A-Za-z0-9])")
        assert not token.search(data) and msgspec.msgpack.encode(name) not in data, f"bundle contains {name!r}"

    # machine B: a clone of the base commit, another store
    b = tmp_path / "b"
    b.mkdir()
    if backend == "lmdb":
        pg_server.store_folder(b / "store")
    git(b, "clone", "-q", str(a / "ws"), "ws")
    refused = keel("import", str(bundle), "--workspace", str(b / "ws"), store=b / "store")
    assert refused.returncode == 5 and "not signed" in refused.stderr
    assert store_snapshot(b / "store") == []
    ok(keel("import", str(bundle), "--workspace", str(b / "ws"), "--allow-unsigned", store=b / "store"))
    imported = record(b / "store", mission_id)
    assert imported.workspace == str((b / "ws").resolve()) and str(b) in imported.sandbox
    assert (Path(imported.sandbox) / "a.txt").read_text() == "alpha\n"
    assert (Path(imported.sandbox) / "data.bin").read_bytes() == BINARY + b"tail"
    assert not (Path(imported.sandbox) / "old.txt").exists()
    ok(keel("verify", store=b / "store"))

    ok(keel("resume", mission_id, "--plain", store=b / "store"))
    assert record(b / "store", mission_id).state.value == "completed"
    assert files(Path(record(b / "store", mission_id).sandbox)) == ref_files
    assert unit_results(b / "store", mission_id) == ref_results

    again = keel("import", str(bundle), "--workspace", str(b / "ws"), "--allow-unsigned", store=b / "store")
    assert again.returncode == 5 and "already exists" in again.stderr


def _only_mission(store: Path) -> str:
    from keel.storage import missions as m
    from tests.bundles.kit import read

    missions = read(store, m.list_missions)
    assert len(missions) == 1
    return str(missions[0].id)


def test_a_mission_that_changed_no_file_exports_and_imports(tmp_path: Path) -> None:
    """A git sandbox with nothing changed against its base (a mission paused before its first merge, or one
    whose units only read): its bundle carries no patch, and the import takes it as it is."""
    a, b = tmp_path / "a", tmp_path / "b"
    git_workspace(a / "ws")
    units = [{"id": "u1", "params": {"steps": [{"tool": "read_file", "args": {"path": "README.md"}}]}}]
    ok(keel("run", str(write_mission(a, units)), "--plain", store=a / "store"))
    mission_id = _only_mission(a / "store")
    bundle = tmp_path / "m.keelbundle"
    summary = json.loads(ok(keel("export", mission_id, "-o", str(bundle), "--json", store=a / "store")).stdout)
    assert summary["workspace"] == "git"
    b.mkdir()
    git(b, "clone", "-q", str(a / "ws"), "ws")
    ok(keel("import", str(bundle), "--workspace", str(b / "ws"), "--allow-unsigned", store=b / "store"))
    assert record(b / "store", mission_id).state.value == "completed"
    assert files(Path(record(b / "store", mission_id).sandbox)) == files(Path(record(a / "store", mission_id).sandbox))
    ok(keel("verify", store=b / "store"))
