"""keel.server.providers — model providers: configuration, HTTP clients, retry, health, failover, keys.

The engine's host uses exactly this interface (docs/providers.md says more):

    config = load_provider_config(workspace, user_config=None)
    router = ProviderRouter(config, policy, secrets=KeyringSecrets(), on_event=callback, store=store)
    result = await router.complete(params)   # OfflineError, PolicyPauseError, ProviderError
    await router.probe() -> bool
    router.health_snapshot() -> list[EndpointHealth]
    await router.aclose()

Depends on keel.protocol, keel.storage, httpx and keyring; never on the engine, the LSP server or pygls.
The names below are loaded on first use: a host whose agent never calls a model, and the package's
light modules (`config`, `errors`), do not pay for importing httpx and keyring (~40 ms of a start).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from keel.server.providers.config import (
        Capabilities,
        Cost,
        EndpointConfig,
        NetworkConfig,
        ProviderConfig,
        ProviderSettings,
        load_provider_config,
    )
    from keel.server.providers.errors import (
        KeyringError,
        OfflineError,
        PolicyPauseError,
        ProviderConfigError,
        ProviderError,
    )
    from keel.server.providers.health import EndpointHealth, HealthState, ProviderEvent
    from keel.server.providers.retry import CLASSIFICATION, Action, FailureKind
    from keel.server.providers.router import ProviderRouter
    from keel.server.providers.secrets import KeyringSecrets, Secrets

_MODULES = {
    "config": (
        "Capabilities",
        "Cost",
        "EndpointConfig",
        "NetworkConfig",
        "ProviderConfig",
        "ProviderSettings",
        "load_provider_config",
    ),
    "errors": ("KeyringError", "OfflineError", "PolicyPauseError", "ProviderConfigError", "ProviderError"),
    "health": ("EndpointHealth", "HealthState", "ProviderEvent"),
    "retry": ("CLASSIFICATION", "Action", "FailureKind"),
    "router": ("ProviderRouter",),
    "secrets": ("KeyringSecrets", "Secrets"),
}
_WHERE = {name: module for module, names in _MODULES.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "CLASSIFICATION",
    "Action",
    "Capabilities",
    "Cost",
    "EndpointConfig",
    "EndpointHealth",
    "FailureKind",
    "HealthState",
    "KeyringError",
    "KeyringSecrets",
    "NetworkConfig",
    "OfflineError",
    "PolicyPauseError",
    "ProviderConfig",
    "ProviderConfigError",
    "ProviderError",
    "ProviderEvent",
    "ProviderRouter",
    "ProviderSettings",
    "Secrets",
    "load_provider_config",
]
