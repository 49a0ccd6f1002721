"""Keeping a keel process's secrets out of `/proc/<pid>/environ`, where any process of the same user (a
unit's command, an agent) could read them from its keel parent.

The kernel shows a process's environment as it was at exec: the block of `NAME=value` strings between the
`env_start` and `env_end` addresses of `/proc/self/stat`. Changing `os.environ` does not touch that block,
so `blank_secrets` overwrites the values of secret names in it with NUL bytes (through `/proc/self/mem`),
after pointing the C library's `environ` at fresh copies (`os.putenv`): keel itself, and a library that
calls getenv (libpq reads PGPASSWORD), still see every value; `/proc/<pid>/environ` shows the name only.
Unlike prctl(PR_SET_DUMPABLE, 0) this holds for a reader running as root too. `retitle` writes the argument
block, just before it, the same way: what `/proc/<pid>/cmdline` and ps show of a forked process; and
`show_in_block` one variable's value (a forked unit worker's tag). Linux only;
elsewhere both do nothing. Depends on the standard library only.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Collection, Iterator
from typing import BinaryIO

# a name that looks like a secret's: never handed to agents or commands, never left readable in the block
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)
_ALSO = frozenset({"DATABASE_URL", "KEEL_STORE"})  # a URL may carry a password


def is_secret(name: str) -> bool:
    """A secret's name, a store setting (libpq's PG*) or a URL that may carry a password."""
    return bool(SECRET_NAME.search(name)) or name in _ALSO or (name.startswith("PG") and name[2:3].isupper())


def blank_secrets(also: Collection[str] = ()) -> int:
    """Overwrite the values of secret variables (and of the names in `also`: the providers' `api_key_env`,
    whatever they are called) in this process's exec-time environment block; how many were blanked (0 where
    /proc offers no way: another kernel, a process without /proc mounted)."""
    try:
        with _values() as (values, mem):
            blanked = 0
            for at, name, value in values:
                if value.strip(b"\0") and (is_secret(name) or name in also):
                    current = os.environ.get(name)
                    if current is not None:
                        os.putenv(name, current)  # the C library's environ no longer points into the block
                    mem.seek(at)
                    mem.write(b"\0" * len(value))
                    blanked += 1
            return blanked
    except (OSError, ValueError, IndexError):
        return 0


def show_in_block(name: str, value: str) -> bool:
    """Write `value` over the value of `name` in this process's exec-time block (a forked process shows what it
    is, as a process started with it would: a unit's tag). The value it had keeps the room: False when `value`
    does not fit, or `name` is not there."""
    try:
        with _values() as (values, mem):
            for at, found, room in values:
                text = value.encode()
                if found == name and len(text) <= len(room):
                    mem.seek(at)
                    mem.write(text + b"\0" * (len(room) - len(text)))
                    return True
            return False
    except (OSError, ValueError, IndexError):
        return False


@contextlib.contextmanager
def _values() -> Iterator[tuple[list[tuple[int, str, bytes]], BinaryIO]]:
    """The block's `NAME=value` entries as (address of the value, name, value bytes), and /proc/self/mem open
    for writing over them."""
    start, end = _block()
    with open("/proc/self/mem", "r+b", buffering=0) as mem:
        mem.seek(start)
        found, offset = [], start
        for entry in mem.read(end - start).split(b"\0"):
            name, eq, value = entry.partition(b"=")
            if eq:
                found.append((offset + len(name) + 1, name.decode(errors="replace"), value))
            offset += len(entry) + 1
        yield found, mem


def _block() -> tuple[int, int]:
    with open("/proc/self/stat", "rb") as f:
        fields = f.read().rpartition(b")")[2].split()
    return int(fields[47]), int(fields[48])  # env_start and env_end: fields 50 and 51 of proc(5)


STORE_ENV_VAR = "KEEL_STORE_ENV"  # in a subagent's environment: the names it got for the store only


def without_store_env(environ: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    """The environment a subagent hands its agent: its own without what it was given for the store
    (storage/location.py's `with_store_env` names those in STORE_ENV_VAR)."""
    names = set(environ.get(STORE_ENV_VAR, "").split(",")) | {STORE_ENV_VAR}
    return {k: v for k, v in environ.items() if k not in names}


def retitle(argv: list[str]) -> bool:
    """Show `argv` as this process's command line (`/proc/<pid>/cmdline`, ps): a forked process otherwise shows
    the one it was forked from. Written over the exec-time argument block, so it is cut to that block's length;
    False where /proc offers no way."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start and arg_end: fields 48 and 49 of proc(5)
        title = "\0".join(argv).encode()[: end - start - 1]
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(start)
            mem.write(title + b"\0" * (end - start - len(title)))
        return True
    except (OSError, ValueError, IndexError):
        return False
