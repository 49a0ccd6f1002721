"""Each row of the classification table (docs/providers.md, retry.CLASSIFICATION) against a real fault.

Retry rows: the same endpoint is asked again and the call succeeds; failover rows: exactly one request
reached the failing endpoint and the next candidate served the call; context rows: only a model with a
larger window is tried.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from faultserver import (
    FaultServer,
    context_exceeded,
    cut_stream,
    delay,
    error,
    rate_limited,
    reset,
    unknown_model,
)
from providerkit import FAST, PARAMS, DictSecrets, closed_port, provider, settings

from keel.protocol.spec import ModelPolicy
from keel.server.providers import (
    CLASSIFICATION,
    Action,
    FailureKind,
    ProviderError,
    ProviderEvent,
    ProviderRouter,
)


def router(cfg: object, events: list[ProviderEvent], policy: ModelPolicy | None = None) -> ProviderRouter:
    return ProviderRouter(cfg, policy or ModelPolicy(), secrets=DictSecrets(), on_event=events.append)  # type: ignore[arg-type]


def kinds(events: list[ProviderEvent], kind: str) -> list[str]:
    return [e.reason for e in events if e.kind == kind]


RETRY_ROWS = [
    ("timeout", delay(3.0), FailureKind.TIMEOUT),
    ("reset", reset(), FailureKind.CONNECTION),
    ("http_500", error(500), FailureKind.SERVER_ERROR),
    ("http_503", error(503), FailureKind.SERVER_ERROR),
    ("http_429", rate_limited("0"), FailureKind.RATE_LIMITED),
    ("cut_stream", cut_stream(), FailureKind.STREAM_CUT),
]


@pytest.mark.parametrize(("name", "fault_behaviour", "kind"), RETRY_ROWS, ids=[r[0] for r in RETRY_ROWS])
async def test_retry_rows_ask_the_same_endpoint_again(
    fault: FaultServer, events: list[ProviderEvent], name: str, fault_behaviour: object, kind: FailureKind
) -> None:
    assert CLASSIFICATION[kind] is Action.RETRY
    fault.push(fault_behaviour)  # type: ignore[arg-type]
    r = router(settings(provider("a", fault.url)), events)
    try:
        result = await r.complete(PARAMS)
    finally:
        await r.aclose()
    assert result.message["content"] == "ok"
    assert len(fault.posts) == 2
    assert fault.posts[0].body == fault.posts[1].body  # the whole call again, same request
    assert kinds(events, "retry") == [kind.value]
    assert kinds(events, "failover") == []


async def test_connection_refused_retries_then_fails_over(fault: FaultServer, events: list[ProviderEvent]) -> None:
    dead = f"http://127.0.0.1:{closed_port()}/v1"
    r = router(settings(provider("dead", dead), provider("live", fault.url)), events)
    result = await r.complete(PARAMS)
    await r.aclose()
    assert result.provider == "live"
    assert kinds(events, "retry") == ["connection"] * (FAST.max_attempts - 1)
    assert kinds(events, "failover") == ["connection"]


def _self_signed(tmp_path: Path) -> ssl.SSLContext:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .sign(key, hashes.SHA256())
    )
    (tmp_path / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    return context


@pytest.mark.parametrize("row", ["dns", "tls", "http_401", "http_403", "unknown_model"])
async def test_failover_rows_move_on_at_once(
    row: str, fault_factory: Callable[..., FaultServer], events: list[ProviderEvent], tmp_path: Path
) -> None:
    live = fault_factory()
    failing: FaultServer | None = None
    if row == "dns":
        url = "http://name.invalid:8080/v1"
    elif row == "tls":
        failing = fault_factory(tls=_self_signed(tmp_path))
        url = failing.url
        assert url.startswith("https://127.0.0.1:")
    else:
        failing = fault_factory()
        failing.push({"http_401": error(401), "http_403": error(403), "unknown_model": unknown_model()}[row])
        url = failing.url
    r = router(settings(provider("first", url), provider("second", live.url)), events)
    result = await r.complete(PARAMS)
    health = {h.provider: h for h in r.health_snapshot()}
    await r.aclose()
    expected = {"http_401": "auth", "http_403": "auth"}.get(row, row)
    assert CLASSIFICATION[FailureKind(expected)] is Action.FAILOVER
    assert result.provider == "second" and result.model == "second-model"
    assert kinds(events, "retry") == []
    assert kinds(events, "failover") == [expected]
    assert len(live.posts) == 1
    if failing is not None:
        assert len(failing.posts) == (0 if row == "tls" else 1)  # TLS: the handshake failed before any request
    assert health["first"].state == "down" and health["first"].last_error_kind == expected


async def test_context_exceeded_fails_over_only_to_a_larger_window(
    fault_factory: Callable[..., FaultServer], events: list[ProviderEvent]
) -> None:
    small, smaller, large = fault_factory(), fault_factory(), fault_factory()
    small.push(context_exceeded())
    r = router(
        settings(
            provider("small", small.url, context=8192),
            provider("smaller", smaller.url, context=4096),
            provider("large", large.url, context=32768),
        ),
        events,
    )
    result = await r.complete(PARAMS)
    health = {h.provider: h for h in r.health_snapshot()}
    await r.aclose()
    assert CLASSIFICATION[FailureKind.CONTEXT_EXCEEDED] is Action.FAILOVER_LARGER
    assert result.provider == "large"
    assert (len(small.posts), len(smaller.posts), len(large.posts)) == (1, 0, 1)
    assert [(e.source, e.target, e.reason) for e in events if e.kind == "failover"] == [
        ("small/0", "large/0", "context_exceeded")
    ]
    assert health["small"].state == "healthy"  # the endpoint answered; its health is fine


async def test_context_exceeded_everywhere_is_a_provider_error(fault: FaultServer, events: list[ProviderEvent]) -> None:
    fault.push(context_exceeded())
    r = router(settings(provider("only", fault.url)), events)
    with pytest.raises(ProviderError, match="context window"):
        await r.complete(PARAMS)
    await r.aclose()


async def test_other_bad_request_fails_without_failover(
    fault_factory: Callable[..., FaultServer], events: list[ProviderEvent]
) -> None:
    bad, other = fault_factory(), fault_factory()
    bad.push(error(400, "invalid_value", "messages[1].role is invalid"))
    r = router(settings(provider("bad", bad.url), provider("other", other.url)), events)
    with pytest.raises(ProviderError, match=r"refused the request.*role is invalid"):
        await r.complete(PARAMS)
    await r.aclose()
    assert CLASSIFICATION[FailureKind.BAD_REQUEST] is Action.FAIL
    assert (len(bad.posts), len(other.posts)) == (1, 0)


def test_every_kind_has_a_row() -> None:
    assert set(CLASSIFICATION) == set(FailureKind)
