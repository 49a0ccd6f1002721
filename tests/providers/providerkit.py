"""Helpers for provider tests: quick network settings, provider configs, an in-memory key source."""

from __future__ import annotations

import socket

from keel.protocol.agent import ModelCompleteParams
from keel.server.providers import (
    Capabilities,
    Cost,
    EndpointConfig,
    NetworkConfig,
    ProviderConfig,
    ProviderSettings,
)

KEY = "sk-test-Zq9vUPXk2mB7wYt4"
FAST = NetworkConfig(
    connect_timeout_s=1.0,
    read_timeout_s=0.6,
    base_delay_s=0.01,
    max_delay_s=0.05,
    max_attempts=3,
    retry_after_cap_s=5.0,
    failures_to_cool_down=10,
    cooldown_s=30.0,
    down_cooldown_s=60.0,
    probe_base_delay_s=0.01,
    probe_max_delay_s=0.05,
)
PARAMS = ModelCompleteParams(
    messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "say ok"}]
)


class DictSecrets:
    """An in-memory key source (the Secrets protocol), for tests that are not about the keyring."""

    def __init__(self, keys: dict[str, str] | None = None) -> None:
        self.keys = dict(keys or {})

    def get(self, provider: str) -> str | None:
        return self.keys.get(provider)


def provider(
    name: str,
    *urls: str,
    kind: str = "openai-compatible",
    model: str = "",
    context: int = 8192,
    tools: bool = True,
    local: bool = False,
    vision: bool = False,
    retention: str = "retained",
    cost: float = 1.0,
    stream: bool = True,
) -> ProviderConfig:
    return ProviderConfig(
        name=name,
        kind=kind,
        model=model or f"{name}-model",  # type: ignore[arg-type]
        endpoints=tuple(EndpointConfig(url=u) for u in urls),
        stream=stream,
        capabilities=Capabilities(
            context_window=context, tools=tools, local=local, vision=vision, data_retention=retention
        ),  # type: ignore[arg-type]
        cost=Cost(input_per_mtok=cost, output_per_mtok=cost),
    )


def settings(*providers: ProviderConfig, network: NetworkConfig = FAST) -> ProviderSettings:
    return ProviderSettings(providers=providers, network=network)


def closed_port() -> int:
    """A loopback port nobody listens on (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
