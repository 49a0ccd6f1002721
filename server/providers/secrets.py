"""API keys: the OS keyring (service "keel", one entry per provider name) or an environment variable.

Keys live in memory only as long as a call needs them; they are registered with errors.redact so that
no message can carry them. They never go to the store, evidence, logs, or agent processes (the agent
asks the host for completions and never sees a key). Depends on keyring and keel.protocol only.
"""

from __future__ import annotations

import os
from typing import Protocol

import keyring
import keyring.backends.fail
import keyring.backends.null
import keyring.errors

from keel.server.providers.config import ProviderConfig
from keel.server.providers.errors import KeyringError, remember_secret

SERVICE = "keel"

NO_KEYRING_FIX = (
    "no usable OS keyring backend ({detail}). Fix: install and unlock a Secret Service "
    "(e.g. `apt-get install gnome-keyring dbus` and run inside a desktop session, or "
    "`dbus-run-session -- sh -c 'echo PASSWORD | gnome-keyring-daemon --unlock; keel ...'`), "
    'or set `api_key_env = "VARNAME"` for the provider in .keel/config.toml and export the key in VARNAME'
)


class Secrets(Protocol):
    """Where keys come from; the router only reads."""

    def get(self, provider: str) -> str | None: ...


def _backend() -> keyring.backend.KeyringBackend:
    """The keyring in use; the null and fail backends (which would drop keys silently) count as none."""
    try:
        backend = keyring.get_keyring()
    except keyring.errors.KeyringError as exc:
        raise KeyringError(NO_KEYRING_FIX.format(detail=exc)) from None
    if isinstance(backend, keyring.backends.null.Keyring | keyring.backends.fail.Keyring):
        name = f"{type(backend).__module__}.{type(backend).__name__}"
        raise KeyringError(NO_KEYRING_FIX.format(detail=f"the keyring backend is {name}"))
    return backend


class KeyringSecrets:
    """Keys in the OS keyring, service "keel", username = provider name."""

    def get(self, provider: str) -> str | None:
        try:
            value = _backend().get_password(SERVICE, provider)
        except keyring.errors.NoKeyringError as exc:
            raise KeyringError(NO_KEYRING_FIX.format(detail=exc)) from None
        except keyring.errors.KeyringError as exc:
            raise KeyringError(f"cannot read the key of {provider!r} from the OS keyring: {exc}") from None
        if value:
            remember_secret(value)
        return value or None

    def set(self, provider: str, value: str) -> None:
        remember_secret(value)
        try:
            _backend().set_password(SERVICE, provider, value)
        except keyring.errors.NoKeyringError as exc:
            raise KeyringError(NO_KEYRING_FIX.format(detail=exc)) from None
        except keyring.errors.KeyringError as exc:
            raise KeyringError(f"cannot store the key of {provider!r} in the OS keyring: {exc}") from None

    def delete(self, provider: str) -> bool:
        """Remove the key; False when there was none."""
        try:
            _backend().delete_password(SERVICE, provider)
        except keyring.errors.PasswordDeleteError:
            return False
        except keyring.errors.NoKeyringError as exc:
            raise KeyringError(NO_KEYRING_FIX.format(detail=exc)) from None
        except keyring.errors.KeyringError as exc:
            raise KeyringError(f"cannot delete the key of {provider!r} from the OS keyring: {exc}") from None
        return True


def resolve_key(provider: ProviderConfig, secrets: Secrets) -> tuple[str | None, str]:
    """(key or None, why there is none). `api_key_env` wins over the keyring; a keyring that does not
    work only matters for providers that turn out to need a key, so it is reported, not raised."""
    if provider.api_key_env:
        value = os.environ.get(provider.api_key_env, "")
        if value:
            remember_secret(value)
            return value, ""
        return None, f"environment variable {provider.api_key_env} (api_key_env of {provider.name}) is not set"
    try:
        stored = secrets.get(provider.name)
    except KeyringError as exc:
        return None, exc.message
    if stored:
        remember_secret(stored)
        return stored, ""
    return None, f"no key stored for {provider.name}: run `keel key set {provider.name}`"
