"""A write that waits longer than its time limit for another process's write gives up with StoreBusyError
naming that process, on both backends (never a message saying the store is unreachable)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from keel.storage import DB, Store
from keel.storage.errors import StoreBusyError

HOLDER = """
import sys
from keel.storage import DB, Store
with Store.open(sys.argv[1], create=False) as store:
    def hold(txn):
        txn.put(DB.META, b"held", "by the holder")
        print("holding", flush=True)
        sys.stdin.readline()  # until the test lets go
    store.write(hold)
"""


def test_a_write_kept_waiting_too_long_is_busy(tmp_path: Path, store_folder: Callable[[Path], Path]) -> None:
    folder = store_folder(tmp_path / "store")
    with Store.open(folder) as store:  # opened first: an LMDB store opened for writing takes the lock too
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(folder)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
            with pytest.raises(StoreBusyError) as busy:
                store.write(lambda t: t.put(DB.META, b"mine", "by the test"), timeout=0.3)
            assert str(holder.pid) in str(busy.value), busy.value
        finally:
            holder.communicate("\n", timeout=30)
    with Store.open(folder, create=False) as store:  # the holder's write committed; the test's never did
        assert store.read(lambda t: (t.get(DB.META, b"held", str), t.get(DB.META, b"mine", str))) == (
            "by the holder",
            None,
        )
