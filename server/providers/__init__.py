"""keel.server.providers — model providers: configuration, HTTP clients, retry, health, failover, keys.

The engine's host uses exactly this interface (docs/providers.md says more):

    config = load_provider_config(workspace, user_config=None)
    router = ProviderRouter(config, policy, secrets=KeyringSecrets(), on_event=callback, store=store)
    result = await router.complete(params)   # OfflineError, PolicyPauseError, ProviderError
    await router.probe() -> bool
    router.health_snapshot() -> list[EndpointHealth]
    await router.aclose()

Depends on keel.protocol, keel.storage, httpx and keyring; never on the engine, the LSP server or pygls.
"""

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
