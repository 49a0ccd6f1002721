"""What a person sees while a mission runs: a live line on a TTY, plain lines otherwise, or JSON lines.

Reporters only print; they never touch the store. Depends on the standard library only.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, TextIO


class Progress:
    """mode: "tty" (one redrawn status line plus event lines), "plain" (lines), "json" (one event a line)."""

    def __init__(self, mode: str, stream: TextIO | None = None, prefix: str = "") -> None:
        self.mode = mode
        self.prefix = prefix  # before every line (a process hosting many missions names each line's mission)
        self.stream = stream or sys.stdout
        self._status = ""
        self._last_draw = 0.0

    @classmethod
    def for_terminal(cls, json_mode: bool, plain: bool = False) -> Progress:
        if json_mode:
            return cls("json")
        return cls("tty" if sys.stdout.isatty() and not plain else "plain")

    def event(self, kind: str, **data: Any) -> None:
        """A mission event: state changes, unit starts and ends."""
        if self.mode == "json":
            self._write(json.dumps({"event": kind, "at": round(time.time(), 3), **data}, default=str) + "\n")
            return
        shown = {k: v for k, v in data.items() if v not in (None, "") and (k != "mission" or kind == "mission")}
        text = " ".join(f"{k}={v}" for k, v in shown.items())
        self._clear()
        self._write(f"[{time.strftime('%H:%M:%S')}] {self.prefix}{kind} {text}\n")
        self._redraw()

    def line(self, text: str) -> None:
        if self.mode == "json":
            self.event("log", message=text)
            return
        self._clear()
        self._write(self.prefix + text + "\n")
        self._redraw()

    def status(self, done: int, total: int, running: list[str], step: str) -> None:
        """The live line (TTY only): units done/total, running units, the current step."""
        if self.mode != "tty":
            return
        now = time.monotonic()
        if now - self._last_draw < 0.05:
            return
        self._last_draw = now
        width = 24
        filled = int(width * done / total) if total else 0
        bar = "#" * filled + "-" * (width - filled)
        self._status = f"[{bar}] {done}/{total} running: {', '.join(running) or '-'}  {step}"[:160]
        self._clear()
        self._redraw()

    def _clear(self) -> None:
        if self.mode == "tty" and self._status:
            self._write("\r\x1b[2K")

    def _redraw(self) -> None:
        if self.mode == "tty" and self._status:
            self._write(self._status)

    def finish(self) -> None:
        self._clear()
        self._status = ""

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (BrokenPipeError, ValueError):
            pass
