"""Exit codes of the `keel` CLI, and the one mapping from typed errors to them."""

from __future__ import annotations

import enum

from keel.protocol.errors import ErrorCode, KeelError


class Exit(enum.IntEnum):
    OK = 0
    FAILURE = 1
    USAGE = 2
    PAUSED = 3
    MISSION_FAILED = 4
    INTEGRITY = 5
    NOT_FOUND = 6
    BUSY = 7
    REFUSED = 8


_BY_CODE = {
    ErrorCode.USAGE: Exit.USAGE,
    ErrorCode.MISSION_FILE: Exit.USAGE,
    ErrorCode.PROTOCOL: Exit.USAGE,
    ErrorCode.NOT_FOUND: Exit.NOT_FOUND,
    ErrorCode.CORRUPT_RECORD: Exit.INTEGRITY,
    ErrorCode.BUNDLE: Exit.INTEGRITY,
    ErrorCode.STORE_TOO_NEW: Exit.FAILURE,
    ErrorCode.STORE_FULL: Exit.PAUSED,
    ErrorCode.STORE_BUSY: Exit.BUSY,
    ErrorCode.STORE_REFUSED: Exit.REFUSED,
    ErrorCode.DISK_FULL: Exit.PAUSED,
    ErrorCode.OFFLINE: Exit.PAUSED,
    ErrorCode.INVALID_STATE: Exit.USAGE,
}


def exit_for(error: KeelError) -> Exit:
    return _BY_CODE.get(error.code, Exit.FAILURE)
