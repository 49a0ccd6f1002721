"""The bundle signing key: KEEL_SIGNING_KEY (for CI), else the OS keyring (service "keel", "signing-key").

The key signs bundles with HMAC-SHA256 (storage/bundle.py). It is never printed, logged or written to
the store or a bundle. A keyring that does not work means "no key" for export (the bundle is written
unsigned, and the CLI says so) but is reported for `keel key set --signing`. Depends on keyring and the
providers' keyring access only.
"""

from __future__ import annotations

import os
import secrets

from keel.server.providers.errors import KeyringError
from keel.server.providers.secrets import SERVICE, KeyringSecrets

KEY_NAME = "signing-key"
ENV_VAR = "KEEL_SIGNING_KEY"


def signing_key() -> bytes | None:
    """The configured key as bytes, or None when none is configured (or no keyring works)."""
    env = os.environ.get(ENV_VAR, "")
    if env:
        return env.encode()
    try:
        value = KeyringSecrets().get(KEY_NAME)
    except KeyringError:
        return None
    return value.encode() if value else None


def set_signing_key(value: str | None) -> str:
    """Store `value` (or a new random 256-bit key when None) in the OS keyring; returns where."""
    key = value or secrets.token_hex(32)
    KeyringSecrets().set(KEY_NAME, key)
    return f"the OS keyring (service {SERVICE!r}, name {KEY_NAME!r})"
