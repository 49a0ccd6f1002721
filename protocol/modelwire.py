"""What of a model request in a provider's own format is the same between two identical runs.

Outside agents (Claude Code, Codex, Gemini CLI) send the whole history with every request, and the bodies
of two identical runs differ only in a few known places: Anthropic's `metadata.user_id` (a session id),
OpenAI's `prompt_cache_key` and client metadata, Gemini's function-call ids minted from a clock, a
"Today's date is …" line, and timings in tool output (`0.003s`, a process group id, a chunk id, a wall
time). `normalise` masks exactly those, so a journaled answer is reused only for the request it answered.

Each request repeats the conversation so far, so a text's masked form is remembered (`_Texts`, bounded):
a request costs a regex pass over what is new in it, not over its whole history. Pure functions (the
memory changes no result); depends on nothing else in keel.
"""

from __future__ import annotations

import re
import threading
from typing import Any

_DROP = frozenset({"metadata", "prompt_cache_key", "client_metadata", "user"})
_VOLATILE_TEXT = (
    (re.compile(r"Today's date is [^\n.]*"), "Today's date is <date>"),
    (re.compile(r"\b\d+(\.\d+)?\s?(ms|s)\b"), "<time>"),
    (re.compile(r"Process Group PGID: \d+"), "Process Group PGID: <pgid>"),
    (re.compile(r"Chunk ID: [0-9a-fA-F]+"), "Chunk ID: <id>"),
    (re.compile(r"Wall time: [^\n]*"), "Wall time: <time>"),
)
_ANY_VOLATILE = re.compile("|".join(f"(?:{pattern.pattern})" for pattern, _ in _VOLATILE_TEXT))
_CLOCK_ID = re.compile(r"^([A-Za-z_][\w-]*?)_\d{10,}_\d+$")  # Gemini CLI: read_file_1796237027840_0


def normalise(body: Any) -> Any:
    """The body with its volatile fields removed or masked (a new value; the body is not changed)."""
    return _walk(body, top=True)


def _walk(value: Any, top: bool = False) -> Any:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if top and key in _DROP:
                continue
            if key == "id" and isinstance(item, str) and _CLOCK_ID.match(item):
                out[key] = _CLOCK_ID.sub(r"\1_<id>", item)
                continue
            out[key] = _walk(item)
        return out
    if isinstance(value, list):
        return [_walk(item) for item in value]
    if isinstance(value, str):
        return _TEXTS.masked(value)
    return value


def _mask(text: str) -> str:
    if _ANY_VOLATILE.search(text) is None:  # no pattern matches: no substitution can change it
        return text
    for pattern, replacement in _VOLATILE_TEXT:
        text = pattern.sub(replacement, text)
    return text


class _Texts:
    """The masked form of texts seen lately, least recently used dropped past `limit` characters. Texts
    shorter than `least` are masked each time: remembering them costs about what masking does."""

    def __init__(self, limit: int = 32 << 20, least: int = 256) -> None:
        self.limit = limit
        self.least = least
        self.size = 0
        self._known: dict[str, str] = {}
        self._lock = threading.Lock()

    def masked(self, text: str) -> str:
        if len(text) < self.least:
            return _mask(text)
        with self._lock:  # a worker fingerprints on its threads
            known = self._known.pop(text, None)
            if known is None:
                known = _mask(text)
                self.size += len(text)
                while self.size > self.limit and self._known:
                    oldest = next(iter(self._known))
                    self.size -= len(oldest)
                    del self._known[oldest]
            self._known[text] = known  # last in order: the most recently used
        return known


_TEXTS = _Texts()
