"""What `keel providers` and the editor's Providers view show: configured endpoints joined with the health
that running hosts recorded in the store (DB.PROVIDERS), then endpoints known only from the store.

Rows are plain dicts (snake_case, JSON-ready): the CLI prints them, the language server converts them
(server/lsp/convert.py). Never reads keys: a row only says where a key would come from.
Depends on the providers' config, health and healthstore modules and storage only.
"""

from __future__ import annotations

from typing import Any

import msgspec

from keel.server.providers.config import ProviderSettings
from keel.server.providers.health import EndpointHealth
from keel.server.providers.healthstore import list_health
from keel.storage import Store


def provider_rows(settings: ProviderSettings, stored: list[EndpointHealth]) -> list[dict[str, Any]]:
    """Configured endpoints (with stored health where there is some), then stored-only endpoints."""
    by_key = {(h.provider, h.endpoint): h for h in stored}
    rows: list[dict[str, Any]] = []
    for p in settings.providers:
        key_source = f"env {p.api_key_env}" if p.api_key_env else "keyring"
        for index, endpoint in enumerate(p.endpoints):
            health = by_key.pop((p.name, p.endpoint_id(index)), None) or EndpointHealth(
                provider=p.name, endpoint=p.endpoint_id(index), url=endpoint.url, model=p.model
            )
            rows.append(
                _row(
                    health,
                    configured=True,
                    kind=p.kind,
                    key=key_source,
                    capabilities=msgspec.to_builtins(p.capabilities),
                )
            )
    rows += [_row(h, configured=False) for h in by_key.values()]
    return rows


def stored_health(store: Store | None) -> list[EndpointHealth]:
    return [] if store is None else store.read(list_health)


def _row(health: EndpointHealth, configured: bool, **extra: Any) -> dict[str, Any]:
    fields = {f: getattr(health, f) for f in health.__struct_fields__}
    return {**msgspec.to_builtins(fields), "configured": configured, **extra}
