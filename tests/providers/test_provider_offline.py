"""Total network loss: every candidate fails at the connection level → OfflineError; the servers come
back → probe() says so; and no key ever shows up in an error, a log line, an event or the store."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
from faultserver import FaultServer, error
from providerkit import KEY, PARAMS, DictSecrets, provider, settings

from keel.protocol.errors import ErrorCode
from keel.protocol.spec import ModelPolicy
from keel.server.providers import OfflineError, ProviderError, ProviderEvent, ProviderRouter
from keel.server.providers.healthstore import list_health
from keel.storage import Store


async def test_total_loss_is_offline_and_probe_sees_the_return(
    fault_factory: Callable[..., FaultServer], events: list[ProviderEvent]
) -> None:
    a, b = fault_factory(), fault_factory()
    r = ProviderRouter(
        settings(provider("a", a.url), provider("b", b.url, "http://name.invalid:9/v1")),
        ModelPolicy(),
        secrets=DictSecrets(),
        on_event=events.append,
    )
    assert (await r.complete(PARAMS)).provider == "a"  # keep-alive connections are open now
    a.stop()
    b.stop()
    with pytest.raises(OfflineError) as raised:
        await r.complete(PARAMS)
    assert raised.value.code is ErrorCode.OFFLINE
    assert "connection" in raised.value.message and "dns" in raised.value.message
    assert await r.probe() is False
    assert await r.probe() is False
    assert r._probe.failed_rounds == 2
    b.start()
    assert await r.probe() is True
    assert r._probe.failed_rounds == 0
    states = {(h.provider, h.endpoint): h.state for h in r.health_snapshot()}
    assert states[("b", "0")] == "healthy" and states[("a", "0")] != "healthy"
    result = await r.complete(PARAMS)
    await r.aclose()
    assert result.provider == "b"


async def test_offline_needs_every_failure_at_connection_level(fault_factory: Callable[..., FaultServer]) -> None:
    a, b = fault_factory(), fault_factory(default=error(401))
    a.stop()
    r = ProviderRouter(settings(provider("a", a.url), provider("b", b.url)), ModelPolicy(), secrets=DictSecrets())
    with pytest.raises(ProviderError) as raised:
        await r.complete(PARAMS)
    await r.aclose()
    assert not isinstance(raised.value, OfflineError)
    assert "no key stored for b: run `keel key set b`" in raised.value.message


async def test_the_key_goes_only_into_the_authorization_header(
    fault_factory: Callable[..., FaultServer],
    events: list[ProviderEvent],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    echo = f"Incorrect API key provided: {KEY}. Authorization: Bearer {KEY}"
    leaky, fine = fault_factory(default=error(401, "invalid_api_key", echo)), fault_factory()
    fine.push(error(500, message=f"upstream said {KEY}"))
    with Store.open(tmp_path / "store") as store:
        r = ProviderRouter(
            settings(
                provider("leaky", leaky.url), provider("fine", fine.url), provider("anth", fine.root, kind="anthropic")
            ),
            ModelPolicy(),
            secrets=DictSecrets({"leaky": KEY, "fine": KEY, "anth": KEY}),
            on_event=events.append,
            store=store,
        )
        assert (await r.complete(PARAMS)).provider == "fine"
        fine.default = error(403, message=f"forbidden for key {KEY}")
        with pytest.raises(ProviderError) as raised:
            await r.complete(PARAMS)
        stored = msgspec.json.encode(store.read(list_health)).decode()
        await r.aclose()
    texts = [
        raised.value.message,
        str(raised.value),
        caplog.text,
        stored,
        msgspec.json.encode(events).decode(),
        repr(raised.value),
    ]
    assert all(KEY not in t for t in texts), [t for t in texts if KEY in t]
    assert "Incorrect API key provided: ***" in stored
    for request in leaky.posts + fine.posts:
        assert KEY not in msgspec.json.encode(request.body).decode() and KEY not in request.path
        leaks = {name for name, value in request.headers.items() if KEY in value}
        assert leaks == ({"x-api-key"} if request.path == "/v1/messages" else {"authorization"})
    assert fine.posts[0].headers["authorization"] == f"Bearer {KEY}"
