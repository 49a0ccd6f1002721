"""Restore with files: tools and shell commands alike are rewound, verified, and resumable; diff shows
exactly what changed; the person's checkout is never touched; a tampered sandbox is an error."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.bundles.kit import keel, ok, record, wait_for
from tests.rewind.kit import (
    AFTER_U1,
    AFTER_U2,
    checkout,
    mission,
    mission_records,
    point_after,
    points,
    sandbox_files,
)

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL


def test_restore_files_rewinds_tool_and_shell_edits_then_resumes(tmp_path: Path) -> None:
    ws, store, mid = mission(tmp_path)
    sandbox = Path(record(store, mid).sandbox)
    assert sandbox_files(sandbox) == AFTER_U2
    assert os.access(sandbox / "sub/s.txt", os.X_OK)
    person = checkout(ws)
    p_u1 = point_after(store, mid, "unit succeeded: u1")

    out = ok(keel("restore", mid, p_u1, "--files", store=store))
    assert "with its files" in out.stdout
    assert sandbox_files(sandbox) == AFTER_U1  # sed -i, echo >, rm and apply_diff all undone
    assert os.access(sandbox / "sub/s.txt", os.X_OK)
    assert record(store, mid).state.value == "paused"
    assert checkout(ws) == person

    # resuming runs u2 again on the restored files and ends where the first run ended
    assert record(store, mid).error == ""
    ok(keel("resume", mid, "--plain", store=store))
    assert sandbox_files(sandbox) == AFTER_U2
    assert record(store, mid).state.value == "completed"
    assert checkout(ws) == person


def test_diff_between_points_and_against_the_sandbox(tmp_path: Path) -> None:
    _, store, mid = mission(tmp_path)
    p_u1, p_u2 = point_after(store, mid, "unit succeeded: u1"), point_after(store, mid, "unit succeeded: u2")
    text = ok(keel("diff", mid, p_u1, p_u2, store=store)).stdout
    assert text == (
        f"diff --keel {p_u1}/README.md {p_u2}/README.md\n"
        f"--- {p_u1}/README.md\n+++ {p_u2}/README.md\n@@ -1 +1 @@\n-hello\n+HELLO\n"
        f"diff --keel {p_u1}/a.txt {p_u2}/a.txt\n"
        f"--- {p_u1}/a.txt\n+++ {p_u2}/a.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n"
        f"diff --keel {p_u1}/b.txt {p_u2}/b.txt\n"
        f"--- /dev/null\n+++ {p_u2}/b.txt\n@@ -0,0 +1 @@\n+new\n"
        f"diff --keel {p_u1}/old.txt {p_u2}/old.txt\n"
        f"--- {p_u1}/old.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-to be deleted\n"
    )
    # against the sandbox as it is now (a change no checkpoint has seen yet)
    sandbox = Path(record(store, mid).sandbox)
    (sandbox / "b.txt").write_text("edited\n")
    text = ok(keel("diff", mid, p_u2, store=store)).stdout
    assert text == (
        f"diff --keel {p_u2}/b.txt sandbox/b.txt\n--- {p_u2}/b.txt\n+++ sandbox/b.txt\n@@ -1 +1 @@\n-new\n+edited\n"
    )
    assert ok(keel("diff", mid, p_u2, p_u2, store=store)).stdout == ""
    missing = keel("diff", mid, "p99", store=store)
    assert missing.returncode == 6 and "p99" in missing.stderr


def test_sandbox_changed_during_restore_is_an_error_and_nothing_is_recorded(tmp_path: Path) -> None:
    _, store, mid = mission(tmp_path)
    sandbox = Path(record(store, mid).sandbox)
    before = points(store, mid)
    marker = tmp_path / "at-verify"
    proc = subprocess.Popen(
        [sys.executable, "-m", "keel.server.cli", "restore", mid, "p2", "--files", "--store", str(store)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "KEEL_FAULT_RESTORE_VERIFY": f"{marker}:1.5"},
    )
    wait_for(marker.exists)
    (sandbox / "a.txt").write_text("changed behind keel's back\n")
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 5, (out, err)
    assert "a.txt: content differs" in err
    assert points(store, mid) == before  # no restore was recorded


def test_sandbox_tampered_after_restore_stops_the_resume(tmp_path: Path) -> None:
    _, store, mid = mission(tmp_path)
    sandbox = Path(record(store, mid).sandbox)
    ok(keel("restore", mid, point_after(store, mid, "unit succeeded: u1"), "--files", store=store))
    records = mission_records(store, mid)
    (sandbox / "sub/s.txt").write_text("tampered\n")
    (sandbox / "stray.txt").write_text("not in the snapshot\n")
    started = time.monotonic()
    resumed = keel("resume", mid, "--plain", store=store)
    assert resumed.returncode == 5, resumed.stderr
    assert "sub/s.txt: content differs" in resumed.stderr and "stray.txt: not in the snapshot" in resumed.stderr
    assert time.monotonic() - started < 20
    state = record(store, mid)
    assert state.state.value == "paused" and state.host is None
    assert "sub/s.txt: content differs" in state.error  # shown by the editor and `keel status`
    assert [r for r in mission_records(store, mid) if r[0] == "points"] == [r for r in records if r[0] == "points"]
    # restoring the files again makes it resumable
    ok(keel("restore", mid, point_after(store, mid, "unit succeeded: u1"), "--files", store=store))
    assert record(store, mid).error == ""
    ok(keel("resume", mid, "--plain", store=store))
    assert sandbox_files(sandbox) == AFTER_U2
