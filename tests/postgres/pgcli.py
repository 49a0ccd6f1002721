"""The `keel` CLI as a real subprocess in a given folder, for the PostgreSQL tests that name their store by URL."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def keel_in(
    cwd: Path,
    *args: str,
    env: dict[str, str] | None = None,
    whole_env: dict[str, str] | None = None,
    timeout: float = 180,
) -> subprocess.CompletedProcess[str]:
    """`keel ARGS` run in `cwd`: this process's environment plus `env`, or exactly `whole_env`."""
    return subprocess.run(
        [sys.executable, "-m", "keel.server.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=whole_env if whole_env is not None else {**os.environ, **(env or {})},
    )
