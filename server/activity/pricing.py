"""Prices of model calls for the activity view, from the providers' configuration (`[providers.cost]`).

The reader takes prices as a function so that it depends on storage and protocol only; this module is
the one that reads configuration. A configuration that does not parse gives no prices (the activity is
still shown, without cost), never an error. Depends on the providers' config module.
"""

from __future__ import annotations

import logging
from pathlib import Path

from keel.server.activity.items import Prices
from keel.server.providers.config import load_provider_config
from keel.server.providers.errors import ProviderConfigError

log = logging.getLogger(__name__)


def configured_prices(workspace: Path) -> Prices:
    """(provider, model) -> (input, output) price per million tokens, for the providers configured for
    `workspace` (and the user's file); None for a provider that is not configured or has no price."""
    try:
        settings = load_provider_config(workspace)
    except (ProviderConfigError, OSError) as exc:
        log.info("no model prices for the activity view: %s", exc)
        return lambda provider, model: None
    table = {
        p.name: (p.cost.input_per_mtok, p.cost.output_per_mtok)
        for p in settings.providers
        if p.cost.input_per_mtok or p.cost.output_per_mtok
    }
    return lambda provider, model: table.get(provider)
