"""Endpoint health in the store's DB.PROVIDERS, so `keel providers` in another terminal and the editor see
what a running host saw. Keys are `provider NUL endpoint`; values are EndpointHealth records.

Functions take a Txn (the caller opens the transaction). Only health goes here: never keys or headers.
"""

from __future__ import annotations

from keel.server.providers.health import EndpointHealth
from keel.storage.keys import DB
from keel.storage.txn import Txn


def health_key(provider: str, endpoint: str) -> bytes:
    return provider.encode() + b"\x00" + endpoint.encode()


def put_health(txn: Txn, health: EndpointHealth) -> None:
    txn.put(DB.PROVIDERS, health_key(health.provider, health.endpoint), health)


def get_health(txn: Txn, provider: str, endpoint: str) -> EndpointHealth | None:
    return txn.get(DB.PROVIDERS, health_key(provider, endpoint), EndpointHealth)


def list_health(txn: Txn) -> list[EndpointHealth]:
    return [health for _, health in txn.scan(DB.PROVIDERS, b"", EndpointHealth)]
