"""A process frozen (SIGSTOP, a closed laptop lid) inside a write transaction: readers carry on, writers
give up after the write-lock time limit and name it.

LMDB's writer mutex cannot be waited on with a time limit, and py-lmdb's open_db begins a write
transaction, so before keel's writer lock every command, even `keel missions`, hung behind the frozen one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from keel.storage import Store
from tests.cli.test_cli import keel, one_line_error
from tests.storage.test_verify import make_mission

HOLDER = """
import sys, time
from pathlib import Path
from keel.storage import Store

def hold(txn):
    Path(sys.argv[2]).write_text("in")
    time.sleep(600)

Store.open(sys.argv[1], create=False).write(hold)
"""


def _wait_for(path: Path, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while not path.exists():
        assert proc.poll() is None, "the holder exited early"
        assert time.monotonic() < deadline, "the holder never took the write lock"
        time.sleep(0.05)


def test_frozen_writer_blocks_no_reader_and_writers_name_it(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with Store.open(store) as s:
        make_mission(s, "m1")
    ready = tmp_path / "ready"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(store), str(ready)])
    try:
        _wait_for(ready, holder)
        os.kill(holder.pid, signal.SIGSTOP)
        for verb in (["missions"], ["status"], ["status", "m1"], ["points", "m1"]):
            proc = keel(*verb, "--store", str(store))
            assert (proc.returncode, proc.stderr) == (0, ""), (verb, proc.stderr)
        assert "m1" in keel("missions", "--store", str(store)).stdout
        started = time.monotonic()
        proc = keel("pause", "m1", "--store", str(store), env={"KEEL_WRITE_LOCK_TIMEOUT_S": "1.5"})
        waited = time.monotonic() - started
        line = one_line_error(proc)
        assert proc.returncode == 7, line
        assert f"the store's write lock is held by pid {holder.pid} (stopped: SIGSTOP/frozen)" in line
        assert waited < 30
    finally:
        os.kill(holder.pid, signal.SIGCONT)
        holder.kill()
        holder.wait(timeout=30)
    proc = keel("pause", "m1", "--store", str(store))  # the killed holder's lock went with it
    assert proc.returncode == 0, proc.stderr


def test_a_running_holder_is_named_as_running(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with Store.open(store) as s:
        make_mission(s, "m1")
    ready = tmp_path / "ready"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(store), str(ready)])
    try:
        _wait_for(ready, holder)
        proc = keel("pause", "m1", "--store", str(store), env={"KEEL_WRITE_LOCK_TIMEOUT_S": "0.5"})
        assert proc.returncode == 7
        assert f"held by pid {holder.pid} (running)" in one_line_error(proc)
    finally:
        holder.kill()
        holder.wait(timeout=30)
