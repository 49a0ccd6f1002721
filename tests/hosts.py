"""Stopping the detached mission hosts a test started: the editor tests' shared clean-up."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from keel.storage import Store
from keel.storage import missions as m
from keel.storage.location import store_exists


def kill_hosts(store_path: Path) -> None:
    """SIGKILL every mission host recorded in the store (and its agents: a host leads its process group)."""
    if not store_exists(store_path):
        return
    with Store.open(store_path) as store:
        records = store.read(m.list_missions)
    for record in records:
        if record.host is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(record.host.pid, signal.SIGKILL)
