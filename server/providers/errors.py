"""The providers layer's typed errors, and redaction of secrets from every message they carry.

Every message built here passes through `redact()` first: API keys and Authorization / x-api-key header
values never reach an exception text, a log line, an event or the store. Depends on keel.protocol only.
"""

from __future__ import annotations

import re
import threading

from keel.protocol.errors import ErrorCode, KeelError

_HEADER = re.compile(r"(?i)\b(authorization|x-api-key|api[-_]key)(['\"]?\s*[:=]\s*['\"]?)(bearer\s+)?[^\s'\",}]+")
_BEARER = re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]{6,}")
_MIN_SECRET = 4  # shorter "secrets" would redact ordinary words

_known: set[str] = set()
_known_lock = threading.Lock()


def remember_secret(value: str) -> None:
    """Register a secret so that every later `redact()` removes it wherever it appears."""
    if len(value) >= _MIN_SECRET:
        with _known_lock:
            _known.add(value)


def redact(text: str) -> str:
    """The text with known secrets and credential header values replaced by `***`."""
    with _known_lock:
        secrets = sorted(_known, key=len, reverse=True)
    for secret in secrets:
        text = text.replace(secret, "***")
    text = _HEADER.sub(lambda m: f"{m.group(1)}{m.group(2)}***", text)
    return _BEARER.sub("Bearer ***", text)


class ProviderError(KeelError):
    """A model call that no configured provider could serve (the message says why, per candidate)."""

    code = ErrorCode.PROVIDER

    def __init__(self, message: str) -> None:
        super().__init__(redact(message))


class ProviderConfigError(ProviderError):
    """Provider configuration that cannot be used; the message names the file and the key."""


class OfflineError(ProviderError):
    """Every candidate failed at the connection level: the engine checkpoints and pauses ("offline")."""

    code = ErrorCode.OFFLINE


class PolicyPauseError(ProviderError):
    """The mission's model policy forbids serving this call: no candidate meets the requirements, or
    failover = "never" and the preferred model failed persistently. The engine pauses (reason "policy")."""


class KeyringError(ProviderError):
    """The OS keyring cannot store or read keys; the message says how to fix it."""

    code = ErrorCode.KEYRING
