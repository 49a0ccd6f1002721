"""Fault points for crash tests: named places where a test can make a process stop and wait to be killed.

`pause_here("CHECKPOINT")` does nothing unless KEEL_FAULT_CHECKPOINT="FILE:SECONDS" is set in the
environment; then it writes the pid to FILE and sleeps, so a test that waits for FILE can SIGKILL the
process at exactly that point (some points sit inside a write transaction on purpose). With "FILE:hold"
it waits there until the test removes FILE (a process frozen at that point for as long as the test
needs, then let go). Tests only: no production setting reaches here. Depends on the standard library only.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def pause_here(name: str) -> None:
    """With KEEL_FAULT_<NAME>="FILE:SECONDS" set, write our pid to FILE and sleep SECONDS; with "FILE:hold",
    write it and wait until FILE is gone."""
    spec = os.environ.get(f"KEEL_FAULT_{name}")
    if not spec:
        return
    marker, _, seconds = spec.rpartition(":")
    Path(marker).write_text(str(os.getpid()))
    if seconds != "hold":
        time.sleep(float(seconds))
        return
    while Path(marker).exists():
        time.sleep(0.01)
