"""Error codes shared by every layer, and the protocol layer's own error.

Codes are stable: the CLI maps them to exit codes and the language server to JSON-RPC error codes,
each in one place.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.IntEnum):
    """Stable keel error codes (also used as JSON-RPC error codes, offset into -32100..)."""

    USAGE = 2
    PROTOCOL = 10
    MISSION_FILE = 11
    NOT_FOUND = 12
    INVALID_STATE = 13
    CORRUPT_RECORD = 20
    STORE = 21
    STORE_FULL = 22
    STORE_TOO_NEW = 23
    STORE_BUSY = 24
    STORE_REFUSED = 26
    DISK_FULL = 25
    NONDETERMINISM = 30
    AGENT = 31
    TOOL = 32
    PROVIDER = 40
    OFFLINE = 41
    KEYRING = 42
    BUNDLE = 50


class KeelError(Exception):
    """Base of every error keel raises on purpose; carries a stable code."""

    code: ErrorCode = ErrorCode.STORE

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ProtocolError(KeelError):
    """A malformed frame or message: says what was wrong."""

    code = ErrorCode.PROTOCOL


class MissionFileError(KeelError):
    """A mission file that cannot be used; the message names the file, the field path and the line."""

    code = ErrorCode.MISSION_FILE


class NotFoundError(KeelError):
    """An unknown mission, unit, restore point or record id."""

    code = ErrorCode.NOT_FOUND


class InvalidTransitionError(KeelError):
    """A lifecycle transition that the transition table does not allow."""

    code = ErrorCode.INVALID_STATE


class DiskFullError(KeelError):
    """A filesystem keel writes to (the store's or a sandbox's) has no space left. Nothing committed is
    lost; the mission pauses with reason `disk_full`. `mount` and `path` name the filesystem and the path
    whose write failed (protocol/diskspace.py builds the message)."""

    code = ErrorCode.DISK_FULL

    def __init__(self, message: str, *, mount: str = "", path: str = "") -> None:
        super().__init__(message)
        self.mount = mount
        self.path = path
