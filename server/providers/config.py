"""Provider configuration: `[[providers]]` and `[network]` in `.keel/config.toml` and the user's config.

The user file ($XDG_CONFIG_HOME/keel/config.toml, else ~/.config/keel/config.toml) is read first, then
the workspace's `.keel/config.toml`: a workspace provider replaces a user provider of the same name, and
workspace `[network]` keys override user ones. Other top-level tables belong to other parts of keel and
are left alone. Errors name the file, the line and the key (ProviderConfigError). Secrets never live
here: a provider names an environment variable (`api_key_env`) or its key is in the OS keyring.
Depends on keel.protocol and msgspec only.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

import msgspec

from keel.protocol.missionfile import locate_field
from keel.server.providers.errors import ProviderConfigError

ProviderKind = Literal["openai-compatible", "anthropic", "gemini"]  # gemini: only for agents that speak it
DataRetention = Literal["none", "retained"]
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_SECTIONS = ("providers", "network")


class Capabilities(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What a model can do, as the configuration declares it (checked against a mission's requirements)."""

    context_window: int = 8192
    tools: bool = False
    vision: bool = False
    local: bool = False
    data_retention: DataRetention = "retained"


class Cost(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Price in `currency` units per million tokens (local models: 0)."""

    input_per_mtok: float = 0.0
    output_per_mtok: float = 0.0
    currency: str = "USD"

    @property
    def ceiling(self) -> float:
        """The price a `max_cost_per_mtok` requirement is compared with: the dearer of input and output."""
        return max(self.input_per_mtok, self.output_per_mtok)


class EndpointConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    url: str  # openai-compatible: the base URL ending in /v1; anthropic: the host root (…/v1/messages is added)
    name: str = ""  # shown in `keel providers`; defaults to the endpoint's position ("0", "1", …)


class ProviderConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    kind: ProviderKind
    model: str
    endpoints: tuple[EndpointConfig, ...]
    api_key_env: str = ""  # read the key from this environment variable instead of the keyring
    stream: bool = True
    max_output_tokens: int = 4096
    capabilities: Capabilities = Capabilities()
    cost: Cost = Cost()

    def endpoint_id(self, index: int) -> str:
        return self.endpoints[index].name or str(index)


class NetworkConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Timeouts, retry, health and probe settings shared by every provider."""

    connect_timeout_s: float = 5.0
    read_timeout_s: float = 120.0
    base_delay_s: float = 0.5
    max_delay_s: float = 30.0
    max_attempts: int = 4  # per endpoint and call, the first try included
    retry_after_cap_s: float = 120.0  # a longer Retry-After cools the endpoint down instead of waiting
    failures_to_cool_down: int = 3  # consecutive failures that take an endpoint out of rotation
    cooldown_s: float = 60.0
    down_cooldown_s: float = 300.0  # after a persistent failure (auth, TLS, DNS, unknown model)
    max_cooldown_s: float = 900.0  # a breaker opened again and again waits twice as long each time, up to this
    probe_base_delay_s: float = 1.0
    probe_max_delay_s: float = 60.0


class ProviderSettings(msgspec.Struct, frozen=True):
    """Everything the router needs: providers in configuration order, network settings, where they came from."""

    providers: tuple[ProviderConfig, ...] = ()
    network: NetworkConfig = NetworkConfig()
    sources: tuple[str, ...] = ()

    def provider(self, name: str) -> ProviderConfig | None:
        return next((p for p in self.providers if p.name == name), None)


class _File(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    providers: tuple[ProviderConfig, ...] = ()
    network: NetworkConfig = NetworkConfig()


def user_config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "keel" / "config.toml"


def load_provider_config(workspace: Path, user_config: Path | None = None) -> ProviderSettings:
    """Read the user's config then the workspace's `.keel/config.toml`; missing files are fine."""
    providers: dict[str, ProviderConfig] = {}
    network: dict[str, Any] = {}
    sources: list[str] = []
    for path in (user_config or user_config_path(), Path(workspace) / ".keel" / "config.toml"):
        if not path.is_file():
            continue
        parsed, raw_network = parse_provider_file(path.read_bytes(), str(path))
        providers.update({p.name: p for p in parsed})
        network.update(raw_network)
        sources.append(str(path))
    return ProviderSettings(
        providers=tuple(providers.values()), network=msgspec.convert(network, NetworkConfig), sources=tuple(sources)
    )


def parse_provider_file(data: bytes, filename: str) -> tuple[list[ProviderConfig], dict[str, Any]]:
    """One file's providers and raw `[network]` table, checked; raises ProviderConfigError."""
    try:
        text = data.decode("utf-8")
        doc = tomllib.loads(text)
    except UnicodeDecodeError as exc:
        raise ProviderConfigError(f"{filename}: not UTF-8 text (byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ProviderConfigError(f"{filename}: TOML syntax error: {exc}") from None
    if isinstance(doc.get("providers"), dict):
        raise ProviderConfigError(
            f"{filename}:{locate_field(text, 'providers') or '?'}: providers: "
            "write each provider as an [[providers]] table (an array), not [providers]"
        )
    section = {key: doc[key] for key in _SECTIONS if key in doc}
    try:
        parsed = msgspec.convert(section, _File)
    except msgspec.ValidationError as exc:
        raise _field_error(str(exc), filename, text) from None
    raw_network = dict(section.get("network", {}))
    _check(parsed, raw_network, filename, text)
    return list(parsed.providers), raw_network


def _field_error(detail: str, filename: str, text: str) -> ProviderConfigError:
    # msgspec says e.g. "Expected `int`, got `str` - at `$.providers[1].capabilities.context_window`"
    message, _, where = detail.partition(" - at ")
    path = where.strip("`").removeprefix("$").lstrip(".")
    for pattern, meaning in (
        (r"Object contains unknown field `(\w+)`", "unknown key"),
        (r"Object missing required field `(\w+)`", "required key is missing"),
    ):
        found = re.match(pattern, message)
        if found:
            path, message = (f"{path}.{found.group(1)}" if path else found.group(1)), meaning
    if path.endswith(".kind") and message.startswith("Invalid enum value"):
        message += " (use 'openai-compatible', 'anthropic' or 'gemini')"
    return _error(filename, text, path, message)


def _error(filename: str, text: str, path: str, message: str) -> ProviderConfigError:
    line = locate_field(text, path) if path else None
    return ProviderConfigError(f"{filename}:{line}: {path}: {message}" if line else f"{filename}: {path}: {message}")


def _check(parsed: _File, raw_network: dict[str, Any], filename: str, text: str) -> None:
    seen: dict[str, int] = {}
    for index, p in enumerate(parsed.providers):
        where = f"providers[{index}]"
        if not _NAME.match(p.name):
            raise _error(
                filename,
                text,
                f"{where}.name",
                f"{p.name!r} is not a valid provider name (letters, digits, _ . -; max 64)",
            )
        if p.name in seen:
            raise _error(
                filename,
                text,
                f"{where}.name",
                f"duplicate provider name {p.name!r} (first used by providers[{seen[p.name]}])",
            )
        seen[p.name] = index
        if not p.model:
            raise _error(filename, text, f"{where}.model", "the model name is empty")
        if not p.endpoints:
            raise _error(filename, text, f"{where}.endpoints", "at least one [[providers.endpoints]] is needed")
        for number, endpoint in enumerate(p.endpoints):
            if not re.match(r"^https?://[^/\s]+", endpoint.url):
                raise _error(
                    filename,
                    text,
                    f"{where}.endpoints[{number}].url",
                    f"{endpoint.url!r} is not an http:// or https:// URL",
                )
        if p.capabilities.context_window <= 0:
            raise _error(filename, text, f"{where}.capabilities.context_window", "must be positive")
        if p.cost.input_per_mtok < 0 or p.cost.output_per_mtok < 0:
            raise _error(filename, text, f"{where}.cost", "prices cannot be negative")
        if p.max_output_tokens <= 0:
            raise _error(filename, text, f"{where}.max_output_tokens", "must be positive")
    for field in msgspec.structs.fields(NetworkConfig):
        if field.name in raw_network and getattr(parsed.network, field.name) <= 0:
            raise _error(filename, text, f"network.{field.name}", "must be positive")
