"""An endpoint's circuit breaker, decided without I/O: a call that gives up on an endpoint opens it (the
first opening since it last served is a new incident), a trial that fails opens it again for twice as long
(up to max_cooldown_s), an opening another call made while this one ran is left as it is, a success
closes it; failures that say nothing about health leave it alone."""

from __future__ import annotations

import pytest
from providerkit import FAST

from keel.server.providers.health import EndpointHealth, EndpointTracker, HealthState, breaker_cooldown
from keel.server.providers.retry import AttemptFailure, FailureKind

K, H = FailureKind, HealthState
NET = FAST.__class__(**{**{f: getattr(FAST, f) for f in FAST.__struct_fields__}, "max_cooldown_s": 100.0})
# FAST: cooldown_s 30, down_cooldown_s 60
NOW, STARTED = 1000.0, 990.0


def tracker(state: HealthState, trips: int, tripped_at: float = 0.0, cooldown_until: float = 0.0) -> EndpointTracker:
    health = EndpointHealth(
        provider="a",
        endpoint="0",
        url="http://127.0.0.1:9/v1",
        model="m",
        state=state,
        trips=trips,
        tripped_at=tripped_at,
        incident_at=tripped_at,
        cooldown_until=cooldown_until,
    )
    return EndpointTracker(health, NET, emit=lambda e: None, on_change=lambda t: None)


CASES = [
    # (state, trips, tripped_at, kind, opened, trips after, state after, cooldown until)
    (H.HEALTHY, 0, 0.0, K.SERVER_ERROR, True, 1, H.COOLING_DOWN, NOW + 30),
    (H.DEGRADED, 0, 0.0, K.TIMEOUT, True, 1, H.COOLING_DOWN, NOW + 30),
    (H.HEALTHY, 0, 0.0, K.AUTH, True, 1, H.DOWN, NOW + 60),  # persistent: down, its own cooldown
    (H.COOLING_DOWN, 1, 900.0, K.SERVER_ERROR, False, 2, H.COOLING_DOWN, NOW + 60),  # a failed trial: doubled
    (H.COOLING_DOWN, 2, 900.0, K.SERVER_ERROR, False, 3, H.COOLING_DOWN, NOW + 100),  # 120, capped at 100
    (H.COOLING_DOWN, 6, 900.0, K.SERVER_ERROR, False, 7, H.COOLING_DOWN, NOW + 100),
    (H.DOWN, 2, 900.0, K.AUTH, False, 3, H.DOWN, NOW + 100),  # 240, capped
    (H.COOLING_DOWN, 1, 900.0, K.AUTH, False, 2, H.DOWN, NOW + 100),  # now persistent: 120, capped
    # another call opened it while this one ran: the same failure, left as it is
    (H.COOLING_DOWN, 1, 995.0, K.SERVER_ERROR, False, 1, H.COOLING_DOWN, 1025.0),
    # says nothing about health: no opening
    (H.HEALTHY, 0, 0.0, K.CONTEXT_EXCEEDED, False, 0, H.HEALTHY, 0.0),
    (H.HEALTHY, 0, 0.0, K.BAD_REQUEST, False, 0, H.HEALTHY, 0.0),
]


@pytest.mark.parametrize(("state", "trips", "tripped_at", "kind", "opened", "after", "new_state", "until"), CASES)
def test_trip(
    state: HealthState,
    trips: int,
    tripped_at: float,
    kind: FailureKind,
    opened: bool,
    after: int,
    new_state: HealthState,
    until: float,
) -> None:
    t = tracker(state, trips, tripped_at, cooldown_until=1025.0 if tripped_at == 995.0 else 0.0)
    assert t.trip(AttemptFailure(kind, "http://127.0.0.1:9/v1: HTTP 503: busy", 503), STARTED, now=NOW) is opened
    assert (t.health.trips, t.health.state, t.health.cooldown_until) == (after, new_state, until)
    if opened:
        assert t.health.incident_at == NOW  # the incident its next openings belong to
    elif after > trips:
        assert t.health.incident_at == tripped_at and t.health.tripped_at == NOW


def test_a_retry_after_longer_than_the_cooldown_is_kept() -> None:
    t = tracker(H.COOLING_DOWN, 0, cooldown_until=NOW + 500)  # cooled down by a Retry-After of 500 s
    assert t.trip(AttemptFailure(K.RATE_LIMITED, "429"), STARTED, now=NOW)
    assert t.health.cooldown_until == NOW + 500


def test_half_open_then_closed() -> None:
    t = tracker(H.COOLING_DOWN, 3, 900.0, cooldown_until=NOW + 10)
    assert not t.available(NOW) and t.available(NOW + 10)  # open, then half-open: one call may try it
    t.record_success(now=NOW + 11)
    assert (t.health.state, t.health.trips, t.health.cooldown_until) == (H.HEALTHY, 0, 0.0)


@pytest.mark.parametrize(
    ("trips", "kind", "seconds"),
    [(1, K.SERVER_ERROR, 30), (2, K.SERVER_ERROR, 60), (3, K.SERVER_ERROR, 100), (1, K.DNS, 60), (2, K.TLS, 100)],
)
def test_breaker_cooldown(trips: int, kind: FailureKind, seconds: float) -> None:
    assert breaker_cooldown(trips, kind, NET) == seconds
