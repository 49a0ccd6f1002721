"""The subagent tests share the engine tests' helpers (mission files, the CLI as a subprocess)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "engine"))
