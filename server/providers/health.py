"""Per-endpoint health as an explicit state machine, and the events the providers layer emits.

    healthy ──transient failure──▶ degraded ──N consecutive failures──▶ cooling_down ──cooldown over──┐
       ▲                              │                                      │ (tried again:          │
       └──────────── success ─────────┴──────────── success ─────────────────┘  fails → cooling again)│
    any ──persistent failure (auth, TLS, DNS, unknown model)──▶ down ──down cooldown over, tried again──┘

The states are also a circuit breaker: a call that gives up on an endpoint (it failed over from it, or no
endpoint served) opens it (`trip`: cooling_down, or down for a persistent failure); an endpoint that is
cooling down or down is skipped until its `cooldown_until`, then one call tries it again (half-open): a
success closes it (healthy), a failure opens it again for twice as long (up to max_cooldown_s). `trips`
counts the openings since it last served; the first of them is a new incident (one failover mark), the
rest are the same one. The router keeps this in the store, so every process of a mission honours it.
Every change of state goes through `EndpointTracker._set_state`, which checks the
transition table, logs old → new and emits exactly one event. EndpointHealth is stored in DB.PROVIDERS
(see healthstore.py), so it follows msgspec's schema-evolution rules. Depends on keel.protocol only.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable
from typing import Literal

import msgspec

from keel.protocol.errors import InvalidTransitionError
from keel.server.providers.config import NetworkConfig
from keel.server.providers.retry import Action, AttemptFailure, FailureKind

log = logging.getLogger("keel.providers")


class HealthState(enum.StrEnum):
    HEALTHY = "healthy"
    DEGRADED = "degraded"
    COOLING_DOWN = "cooling_down"
    DOWN = "down"


H = HealthState
HEALTH_TRANSITIONS: dict[HealthState, frozenset[HealthState]] = {
    H.HEALTHY: frozenset({H.DEGRADED, H.COOLING_DOWN, H.DOWN}),
    H.DEGRADED: frozenset({H.HEALTHY, H.COOLING_DOWN, H.DOWN}),
    H.COOLING_DOWN: frozenset({H.HEALTHY, H.DOWN}),
    H.DOWN: frozenset({H.HEALTHY, H.COOLING_DOWN}),
}


class EndpointHealth(msgspec.Struct, frozen=True, omit_defaults=True):
    """What keel knows about one endpoint of one provider (shown by `keel providers` and the editor)."""

    provider: str
    endpoint: str
    url: str
    model: str
    state: HealthState = H.HEALTHY
    consecutive_failures: int = 0
    last_error: str = ""
    last_error_kind: str = ""
    last_error_at: float = 0.0
    last_success_at: float = 0.0
    cooldown_until: float = 0.0
    active: bool = False  # this endpoint served the most recent successful call of its router
    updated_at: float = 0.0
    last_failover: str = ""  # the last time a call moved away from this endpoint: "-> provider/endpoint (kind)"
    last_failover_at: float = 0.0
    trips: int = 0  # the breaker's openings since the endpoint last served a call (0: closed)
    tripped_at: float = 0.0  # when it last opened
    incident_at: float = 0.0  # when it opened after it had last served (the incident its openings belong to)


class ProviderEvent(msgspec.Struct, frozen=True, omit_defaults=True):
    """One retry, failover or health change; the engine records failovers as evidence + a restore point.

    `source`/`target` are "provider/endpoint" names ("from"/"to" in JSON)."""

    kind: Literal["retry", "failover", "health"]
    at: float
    provider: str = ""
    endpoint: str = ""
    model: str = ""
    reason: str = ""  # a FailureKind value (retry, failover) or the failure message (health)
    attempt: int = 0  # retry: the attempt that failed
    delay_s: float = 0.0  # retry: how long until the next attempt
    source: str = msgspec.field(default="", name="from")
    target: str = msgspec.field(default="", name="to")
    target_model: str = ""
    old_state: str = ""  # health
    new_state: str = ""  # health
    status: int = 0  # failover: the HTTP status of the failure that moved the call (0: no HTTP answer)
    cause: str = ""  # failover: that failure's message (the endpoint's own text)
    again: bool = False  # failover: its source's breaker was open already (the same incident as before)
    incident_at: float = 0.0  # failover: when its source's breaker opened for this incident


PERSISTENT = frozenset({FailureKind.DNS, FailureKind.TLS, FailureKind.AUTH, FailureKind.UNKNOWN_MODEL})


def breaker_cooldown(trips: int, kind: FailureKind, network: NetworkConfig) -> float:
    """How long the breaker stays open after its `trips`-th opening: the cooldown for the kind of failure,
    doubled at each opening since the endpoint last served, up to max_cooldown_s (never below the base)."""
    base = network.down_cooldown_s if kind in PERSISTENT else network.cooldown_s
    return float(min(max(base, network.max_cooldown_s), base * 2.0 ** max(0, trips - 1)))


class EndpointTracker:
    """The live health of one endpoint; `on_change(tracker)` runs after every change worth persisting."""

    def __init__(
        self,
        health: EndpointHealth,
        network: NetworkConfig,
        emit: Callable[[ProviderEvent], None],
        on_change: Callable[[EndpointTracker], None],
    ) -> None:
        self.health = health
        self._network = network
        self._emit = emit
        self._on_change = on_change
        self._reported = False  # the first outcome in this process is always persisted

    @property
    def name(self) -> str:
        return f"{self.health.provider}/{self.health.endpoint}"

    def available(self, now: float | None = None) -> bool:
        """False while cooling down or down and the cooldown has not passed yet."""
        if self.health.state in (H.HEALTHY, H.DEGRADED):
            return True
        return (time.time() if now is None else now) >= self.health.cooldown_until

    def record_success(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        self._update(consecutive_failures=0, last_success_at=now, cooldown_until=0.0, trips=0)
        if self._set_state(H.HEALTHY, "answered") or not self._reported:
            self._notify()

    def record_failure(self, failure: AttemptFailure, now: float | None = None) -> None:
        """Count a failed attempt. Context-window and bad-request answers say nothing about health."""
        if failure.action in (Action.FAILOVER_LARGER, Action.FAIL):
            return
        now = time.time() if now is None else now
        failures = self.health.consecutive_failures + 1
        self._update(
            consecutive_failures=failures,
            last_error=failure.message,
            last_error_kind=failure.kind.value,
            last_error_at=now,
        )
        n = self._network
        if failure.kind in PERSISTENT:
            self._update(cooldown_until=now + n.down_cooldown_s)
            self._set_state(H.DOWN, failure.message)
        elif failure.retry_after is not None and failure.retry_after > n.retry_after_cap_s:
            self._update(cooldown_until=now + failure.retry_after)
            self._set_state(H.COOLING_DOWN, failure.message)
        elif failures >= n.failures_to_cool_down or self.health.state in (H.COOLING_DOWN, H.DOWN):
            self._update(cooldown_until=now + n.cooldown_s)
            self._set_state(H.COOLING_DOWN, failure.message)
        else:
            self._set_state(H.DEGRADED, failure.message)
        self._notify()

    def trip(self, failure: AttemptFailure, started: float, now: float | None = None) -> bool:
        """A call that started at `started` gave up on this endpoint: open its breaker. True when it was
        closed (a new incident); False when open already: a trial failed (it reopens for longer), or
        another call opened it while this one ran (the same failure: left as it is)."""
        if failure.action in (Action.FAILOVER_LARGER, Action.FAIL):
            return False  # says nothing about health
        now = time.time() if now is None else now
        h = self.health
        if h.trips and h.tripped_at >= started:
            return False
        trips = h.trips + 1
        until = max(h.cooldown_until, now + breaker_cooldown(trips, failure.kind, self._network))
        incident = now if trips == 1 else h.incident_at
        self._update(trips=trips, tripped_at=now, incident_at=incident, cooldown_until=until)
        self._set_state(H.DOWN if failure.kind in PERSISTENT else H.COOLING_DOWN, f"breaker open: {failure.message}")
        return trips == 1

    def adopt(self, stored: EndpointHealth) -> None:
        """Take what another process recorded for this endpoint (this router's `active` stays its own)."""
        self.health = msgspec.structs.replace(stored, active=self.health.active)

    def note_failover(self, target: str, reason: str, now: float | None = None) -> None:
        """A call moved from this endpoint to `target` (health itself is already recorded)."""
        self._update(last_failover=f"-> {target} ({reason})", last_failover_at=time.time() if now is None else now)
        self._notify()

    def set_active(self, active: bool) -> None:
        if self.health.active != active:
            self._update(active=active)
            self._notify()

    def _notify(self) -> None:
        self._reported = True
        self._on_change(self)

    def _update(self, **changes: object) -> None:
        self.health = msgspec.structs.replace(self.health, updated_at=time.time(), **changes)

    def _set_state(self, new: HealthState, reason: str) -> bool:
        old = self.health.state
        if new == old:
            return False  # re-arming a cooldown is not a transition
        if new not in HEALTH_TRANSITIONS[old]:
            raise InvalidTransitionError(f"endpoint {self.name} cannot go from {old.value} to {new.value}")
        self._update(state=new)
        log.info("endpoint %s: %s -> %s (%s)", self.name, old.value, new.value, reason)
        self._emit(
            ProviderEvent(
                kind="health",
                at=time.time(),
                provider=self.health.provider,
                endpoint=self.health.endpoint,
                model=self.health.model,
                reason=reason,
                old_state=old.value,
                new_state=new.value,
            )
        )
        return True
