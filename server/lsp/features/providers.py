"""Providers: the `keel/providers` request and the `keel/providersChanged` notification.

Both carry the same payload (convert.providers): every configured endpoint of the workspace's
`.keel/config.toml` and the user's file, joined with the health the mission hosts recorded in the store.
A background loop looks every POLL_S: when the store's transaction id or a configuration file changed, it
rebuilds the payload (in a thread) and notifies only if it differs from the last one sent. Reads only:
keys are never read here. Depends on the providers' view and config modules.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from keel.server.lsp import convert
from keel.server.lsp.server import KeelServer, handler
from keel.server.providers.config import ProviderSettings, load_provider_config, user_config_path
from keel.server.providers.errors import ProviderConfigError
from keel.server.providers.secrets import KeyringSecrets
from keel.server.providers.view import provider_rows, stored_health

log = logging.getLogger(__name__)
PROVIDERS = "keel/providers"
PROVIDERS_CHANGED = "keel/providersChanged"
POLL_S = 0.25


def register(server: KeelServer) -> None:
    @server.feature(PROVIDERS)
    @handler(server, PROVIDERS)
    async def providers(ls: KeelServer, params: Any = None) -> Any:
        return await ls.blocking(payload, ls)

    async def watch() -> None:
        await watch_providers(server)

    server.on_ready.append(watch)


def payload(ls: KeelServer) -> Any:
    settings_error: str | None = None
    settings: ProviderSettings | None = None
    try:
        settings = load_provider_config(ls.workspace_root)
    except ProviderConfigError as exc:  # shown in the view; stored endpoints are still listed
        settings_error = exc.message
    settings = settings or ProviderSettings()
    rows = [_key_shown(row) for row in provider_rows(settings, stored_health(ls.store()))]
    return convert.to_json(convert.providers(rows, settings.sources, settings_error))


def _key_shown(row: dict[str, Any]) -> dict[str, Any]:
    """A keyring key source is shown only when the keyring holds a key for the provider (a keyless
    local endpoint has none). Only whether a key exists leaves this function, never the key."""
    if row.get("key") != "keyring":
        return row
    try:
        present = KeyringSecrets().get(str(row["provider"])) is not None
    except Exception:  # no usable keyring: no key either
        present = False
    return row if present else {**row, "key": ""}


async def watch_providers(ls: KeelServer) -> None:
    """Notify keel/providersChanged when the payload changes; never raises (errors are logged)."""
    sent: Any = None
    seen: tuple[Any, ...] | None = None
    failures = 0
    while True:
        try:
            marker = (_txn_id(ls), *(_mtime(p) for p in _config_files(ls)))
            if marker != seen:
                current = await ls.blocking(payload, ls)
                seen = marker
                if sent is not None and current != sent:
                    ls.protocol.notify(PROVIDERS_CHANGED, current)
                sent = current
            failures = 0
        except Exception:
            failures += 1
            if failures in (1, 10) or failures % 600 == 0:
                log.exception("watching provider health failed (%d times in a row)", failures)
        await asyncio.sleep(POLL_S)


def _txn_id(ls: KeelServer) -> int:
    store = ls.store()
    return -1 if store is None else store.txn_id()


def _config_files(ls: KeelServer) -> tuple[Path, Path]:
    return user_config_path(), ls.workspace_root / ".keel" / "config.toml"


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
