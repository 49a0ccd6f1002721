"""Prices of model calls for the activity view, from the providers' configuration (`[providers.cost]`).

The reader takes prices as a function so that it depends on storage and protocol only; this module is
the one that reads configuration. A configuration that does not parse gives no prices (the activity is
still shown, without cost), never an error. Depends on the providers' config module.
"""

from __future__ import annotations

import logging
from pathlib import Path

from keel.server.activity.items import Prices
from keel.server.providers.config import load_provider_config, user_config_path
from keel.server.providers.errors import ProviderConfigError

log = logging.getLogger(__name__)


PriceTable = dict[str, tuple[float, float]]  # provider -> (input, output) price per million tokens
Currencies = dict[str, str]  # priced provider -> the currency of its price

_tables: dict[Path, tuple[tuple[float, ...], PriceTable, Currencies]] = {}


def price_table(workspace: Path) -> PriceTable:
    """The priced providers configured for `workspace` (and the user's file); unpriced ones are left out.
    Read again only when one of those configuration files changed, so a caller on a hot path (every mission
    change in the language server) costs two stat calls. A configuration that cannot be read prices nothing."""
    files = (user_config_path(), workspace / ".keel" / "config.toml")
    marker = tuple(p.stat().st_mtime if p.exists() else 0.0 for p in files)
    cached = _tables.get(workspace)
    if cached is None or cached[0] != marker:
        cached = _tables[workspace] = (marker, *_read_table(workspace))
    return cached[1]


def currencies(workspace: Path) -> Currencies:
    """The currency of each priced provider's price (`[providers.cost] currency`, "USD" when not given)."""
    price_table(workspace)
    return _tables[workspace][2]


def _read_table(workspace: Path) -> tuple[PriceTable, Currencies]:
    try:
        settings = load_provider_config(workspace)
    except (ProviderConfigError, OSError) as exc:
        log.info("no model prices: %s", exc)
        return {}, {}
    priced = [p for p in settings.providers if p.cost.input_per_mtok or p.cost.output_per_mtok]
    return (
        {p.name: (p.cost.input_per_mtok, p.cost.output_per_mtok) for p in priced},
        {p.name: p.cost.currency for p in priced},
    )


def configured_prices(workspace: Path) -> Prices:
    """(provider, model) -> (input, output) price per million tokens, for the reader; None for a provider
    that is not configured or has no price."""
    table = price_table(workspace)
    return lambda provider, model: table.get(provider)
