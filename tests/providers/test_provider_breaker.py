"""A provider that just failed is given a cool-down that every router on the store honours (one per
process of a mission): one failover per incident, carrying its cause, trials after a cool-down that
grows, closed again on success. Real fault servers on 127.0.0.1, a real LMDB store."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from faultserver import FaultServer, error, ok
from providerkit import FAST, PARAMS, DictSecrets, provider, settings

from keel.protocol.spec import ModelPolicy
from keel.server.providers import NetworkConfig, ProviderEvent, ProviderRouter, ProviderSettings
from keel.server.providers.healthstore import list_health
from keel.storage import Store

COOL = NetworkConfig(**{**{f: getattr(FAST, f) for f in FAST.__struct_fields__}, "cooldown_s": 1.5})


def router(cfg: ProviderSettings, events: list[ProviderEvent], store: Store) -> ProviderRouter:
    return ProviderRouter(cfg, ModelPolicy(), secrets=DictSecrets(), on_event=events.append, store=store)


async def test_a_failed_provider_cools_down_for_every_router_on_the_store(
    fault_factory: Callable[..., FaultServer], tmp_path: Path
) -> None:
    primary = fault_factory(default=error(503, message="overloaded, try later"))
    backup = fault_factory()
    cfg = settings(provider("a", primary.url), provider("b", backup.url), network=COOL)
    one: list[ProviderEvent] = []
    other: list[ProviderEvent] = []
    with Store.open(tmp_path / "store", create=True) as store:
        first, second = router(cfg, one, store), router(cfg, other, store)
        assert (await first.complete(PARAMS)).provider == "b"
        tried = len(primary.posts)
        assert tried == COOL.max_attempts  # retried within the call, then given up on
        # the next calls, in this router and in another one (another process of the mission): straight to b
        assert (await first.complete(PARAMS)).provider == "b"
        assert (await second.complete(PARAMS)).provider == "b"
        assert len(primary.posts) == tried
        [switch] = [e for e in one + other if e.kind == "failover"]
        assert (switch.source, switch.target, switch.reason, switch.again) == ("a/0", "b/0", "server_error", False)
        assert switch.status == 503 and "overloaded, try later" in switch.cause
        [stored] = [h for h in store.read(list_health) if h.provider == "a"]
        assert (stored.state, stored.trips) == ("cooling_down", 1)
        assert 1.4 <= stored.cooldown_until - stored.tripped_at <= 1.6

        # half-open after the cool-down: one trial, still failing: the same incident, open twice as long
        await _until(lambda: time.time() >= stored.cooldown_until)
        assert (await second.complete(PARAMS)).provider == "b"
        [trial] = [e for e in other if e.kind == "failover"]
        assert trial.again and trial.incident_at == switch.incident_at
        assert len(primary.posts) == tried + 1  # a breaker open again is not retried
        [reopened] = [h for h in store.read(list_health) if h.provider == "a"]
        assert reopened.trips == 2 and 2.9 <= reopened.cooldown_until - reopened.tripped_at <= 3.1

        # the provider is back: the first call after the cool-down closes the breaker, without a failover
        primary.default = ok()
        await _until(lambda: time.time() >= reopened.cooldown_until)
        served = await first.complete(PARAMS)
        [closed] = [h for h in store.read(list_health) if h.provider == "a"]
        await first.aclose()
        await second.aclose()
    assert served.provider == "a"
    assert (closed.state, closed.trips, closed.cooldown_until) == ("healthy", 0, 0.0)
    assert len([e for e in one + other if e.kind == "failover"]) == 2


async def _until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(30):
        while not condition():
            await asyncio.sleep(0.05)
