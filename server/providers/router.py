"""ProviderRouter: serve one `model/complete` (or a `model/forward` in a provider's own format) under a
mission's ModelPolicy, with retry and failover.

For each candidate (policy.py) and each of its endpoints that is not cooling down: call it, retrying
what retry.CLASSIFICATION says to retry; on a failover-class failure move on to the next endpoint or
model. A call served somewhere else than where it started emits one `failover` event (from where it
started, to where it was served, the first reason), however many endpoints it passed; a call that no
endpoint served emits none (it raises). A context-window failure moves only to models
with a larger window. When every candidate failed at the connection level the call raises OfflineError;
with failover = "never" a persistent failure of the preferred model raises PolicyPauseError. Health
changes go to `on_event` and, when a store is given, to DB.PROVIDERS (healthstore.py). An endpoint a call
gave up on is opened (health.py's breaker) in the store: each call first reads what every process of the
mission recorded there, and a failover whose source was open already is marked `again` (the same incident).

The router never writes a key anywhere: keys go only into request headers, and every message passes
through errors.redact. Depends on keel.protocol, keel.storage and the providers package only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TypeVar

import httpx

from keel.protocol.agent import ModelCompleteParams, ModelCompleteResult, ModelForwardParams, ModelForwardResult
from keel.protocol.spec import ModelPolicy
from keel.server.providers import anthropic, openai, passthrough
from keel.server.providers.config import ProviderConfig, ProviderSettings
from keel.server.providers.errors import OfflineError, PolicyPauseError, ProviderError, redact
from keel.server.providers.health import EndpointHealth, EndpointTracker, HealthState, ProviderEvent
from keel.server.providers.healthstore import get_health, list_health, put_health
from keel.server.providers.policy import candidates
from keel.server.providers.probe import ProbeState, probe_endpoint
from keel.server.providers.retry import CONNECTION_LEVEL, Action, AttemptFailure, Backoff, FailureKind, retry_call
from keel.server.providers.secrets import KeyringSecrets, Secrets, resolve_key
from keel.storage import Store, Txn
from keel.storage.errors import StoreError

log = logging.getLogger("keel.providers")
ADAPTERS = {"openai-compatible": openai.complete, "anthropic": anthropic.complete}
R = TypeVar("R")
Call = Callable[[ProviderConfig, httpx.AsyncClient, str, "str | None"], Awaitable[R]]


class ProviderRouter:
    def __init__(
        self,
        config: ProviderSettings,
        policy: ModelPolicy,
        secrets: Secrets | None = None,
        on_event: Callable[[ProviderEvent], None] | None = None,
        store: Store | None = None,
    ) -> None:
        self.config = config
        self.policy = policy
        self._secrets: Secrets = secrets if secrets is not None else KeyringSecrets()
        self._on_event = on_event
        self._store = store
        n = config.network
        self._backoff = Backoff(n.base_delay_s, n.max_delay_s, n.max_attempts)
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(n.read_timeout_s, connect=n.connect_timeout_s), follow_redirects=False
        )
        self._trackers: dict[str, list[EndpointTracker]] = {
            p.name: [
                EndpointTracker(
                    EndpointHealth(
                        provider=p.name, endpoint=p.endpoint_id(i), url=e.url, model=p.model, updated_at=time.time()
                    ),
                    n,
                    self._emit,
                    self._persist,
                )
                for i, e in enumerate(p.endpoints)
            ]
            for p in config.providers
        }
        self._probe = ProbeState(Backoff(n.probe_base_delay_s, n.probe_max_delay_s, max_attempts=1))
        self._seen: dict[str, float] = {}  # per endpoint: the newest health this router read or wrote
        self._syncing = False

    # -- the public interface ---------------------------------------------------------------------
    async def complete(self, params: ModelCompleteParams) -> ModelCompleteResult:
        """Serve the call or raise OfflineError / PolicyPauseError / ProviderError (see docs/providers.md)."""
        adapters = ADAPTERS

        async def call(
            provider: ProviderConfig, client: httpx.AsyncClient, url: str, key: str | None
        ) -> ModelCompleteResult:
            return await adapters[provider.kind](client, provider, url, key, params)

        return await self._serve(set(ADAPTERS), bool(params.tools), call)

    async def forward(self, params: ModelForwardParams) -> ModelForwardResult:
        """Serve a request in a provider's own format (passthrough.py) with a provider of that format, under
        the same policy, retry and failover as `complete`; the same errors."""

        async def call(
            provider: ProviderConfig, client: httpx.AsyncClient, url: str, key: str | None
        ) -> ModelForwardResult:
            return await passthrough.forward(client, provider, url, key, params)

        return await self._serve({passthrough.KIND_OF_API[params.api]}, False, call, api=params.api)

    async def _serve(self, kinds: set[str], needs_tools: bool, call: Call[R], api: str = "") -> R:
        if not self.config.providers:
            raise PolicyPauseError(
                "no providers are configured: add [[providers]] to .keel/config.toml "
                "or ~/.config/keel/config.toml (see docs/providers.md)"
            )
        usable = tuple(p for p in self.config.providers if p.kind in kinds)
        if not usable:
            raise PolicyPauseError(
                f"no configured provider speaks the {api} API the agent uses: add a provider of kind "
                f"{' or '.join(sorted(kinds))} to .keel/config.toml (see docs/acp-agents.md)"
            )
        chosen, rejected = candidates(usable, self.policy, needs_tools=needs_tools)
        if not chosen:
            raise PolicyPauseError(
                "no configured model meets the mission's requirements"
                + (" (failover = never)" if self.policy.failover == "never" else "")
                + ": "
                + "; ".join(rejected)
            )
        failures: list[tuple[str, AttemptFailure]] = []
        larger_than = 0
        started = time.time()
        self._refresh()
        previous: tuple[EndpointTracker, AttemptFailure, bool] | None = None
        first: tuple[EndpointTracker, AttemptFailure, bool] | None = None  # where the call started, why it moved
        for provider in chosen:
            if provider.capabilities.context_window <= larger_than:
                continue
            for tracker in self._usable(provider):
                if previous is not None:
                    self._sync(previous[0], partial(previous[0].note_failover, tracker.name, previous[1].kind.value))
                    first = first or previous
                try:
                    result = await self._call_endpoint(provider, tracker, call)
                except AttemptFailure as failure:
                    failures.append((tracker.name, failure))
                    previous = (tracker, failure, self._sync(tracker, partial(tracker.trip, failure, started)))
                    if failure.action is Action.FAIL:
                        raise ProviderError(
                            f"{tracker.name} ({provider.model}) refused the request: {failure.message}"
                        ) from None
                    if failure.action is Action.FAILOVER_LARGER:
                        larger_than = max(larger_than, provider.capabilities.context_window)
                        break
                    continue
                if first is not None:
                    self._failover(first[0], tracker, first[1], again=not first[2])
                self._mark_active(tracker)
                return result
        raise self._exhausted(failures, larger_than)

    async def probe(self) -> bool:
        """One probe round (after the backoff owed by earlier failed rounds): True when any candidate's
        endpoint answers over HTTP again. Used by the engine to resume offline missions by itself."""
        await self._probe.wait()
        chosen, _ = candidates(self.config.providers, self.policy)
        targets = [(p, t) for p in chosen for t in self._trackers[p.name]]
        results = await asyncio.gather(
            *(probe_endpoint(self._client, p, t, self._key(p)[0], self.config.network) for p, t in targets)
        )
        return self._probe.record(any(results))

    def health_snapshot(self) -> list[EndpointHealth]:
        return [t.health for p in self.config.providers for t in self._trackers[p.name]]

    async def aclose(self) -> None:
        await self._client.aclose()

    # -- one endpoint -------------------------------------------------------------------------------
    async def _call_endpoint(self, provider: ProviderConfig, tracker: EndpointTracker, call: Call[R]) -> R:
        key, missing = self._key(provider)
        url = tracker.health.url

        async def attempt() -> R:
            try:
                result = await call(provider, self._client, url, key)
            except AttemptFailure as failure:
                if failure.kind is FailureKind.AUTH and key is None:
                    failure = AttemptFailure(failure.kind, f"{failure.message} ({missing})", failure.status)
                self._sync(tracker, partial(tracker.record_failure, failure))
                raise failure from None
            if tracker.health.state is HealthState.HEALTHY and not tracker.health.trips:
                tracker.record_success()  # nothing to tell other processes
            else:
                self._sync(tracker, tracker.record_success)
            return result

        async def before_retry(failure: AttemptFailure, number: int, wait: float) -> bool:
            if not tracker.available():
                return False  # it just started cooling down: fail over instead of waiting here
            log.info("%s: attempt %d failed (%s); retrying in %.2fs", tracker.name, number, failure, wait)
            self._emit(
                ProviderEvent(
                    kind="retry",
                    at=time.time(),
                    provider=provider.name,
                    endpoint=tracker.health.endpoint,
                    model=provider.model,
                    reason=failure.kind.value,
                    attempt=number,
                    delay_s=wait,
                )
            )
            return True

        return await retry_call(
            attempt, self._backoff, retry_after_cap_s=self.config.network.retry_after_cap_s, before_retry=before_retry
        )

    def _key(self, provider: ProviderConfig) -> tuple[str | None, str]:
        return resolve_key(provider, self._secrets)

    def _usable(self, provider: ProviderConfig) -> list[EndpointTracker]:
        """Endpoints not cooling down; if every endpoint of every candidate is, all of this one's (a last
        resort, so that a call is never refused for cooldowns alone)."""
        trackers = self._trackers[provider.name]
        usable = [t for t in trackers if t.available()]
        if usable:
            return usable
        everyone = [t for ts in self._trackers.values() for t in ts]
        return [] if any(t.available() for t in everyone) else trackers

    # -- outcomes -------------------------------------------------------------------------------------
    def _exhausted(self, failures: list[tuple[str, AttemptFailure]], larger_than: int) -> ProviderError:
        detail = "; ".join(f"{name}: {failure}" for name, failure in failures) or "every endpoint is cooling down"
        if failures and all(f.kind in CONNECTION_LEVEL for _, f in failures):
            return OfflineError(f"offline: every candidate failed at the connection level ({detail})")
        if self.policy.failover == "never":
            return PolicyPauseError(f"the preferred model failed and failover = never: {detail}")
        if larger_than and failures and failures[-1][1].kind is FailureKind.CONTEXT_EXCEEDED:
            return ProviderError(
                f"the prompt does not fit any eligible model's context window "
                f"(largest tried: {larger_than} tokens): {detail}"
            )
        return ProviderError(f"no candidate could serve the call: {detail}")

    def _failover(
        self, source: EndpointTracker, target: EndpointTracker, failure: AttemptFailure, *, again: bool
    ) -> None:
        """One call moved from `source` (where it started) to `target` (where it was served): one event,
        however many endpoints failed in between (each of those notes its own hop in its health); `again`:
        source's breaker was open already (a trial that failed: the same incident)."""
        log.warning("failover %s -> %s (%s)", source.name, target.name, failure)
        self._emit(
            ProviderEvent(
                kind="failover",
                at=time.time(),
                provider=source.health.provider,
                endpoint=source.health.endpoint,
                model=source.health.model,
                reason=failure.kind.value,
                source=source.name,
                target=target.name,
                target_model=target.health.model,
                status=failure.status or 0,
                cause=failure.message,
                again=again,
                incident_at=source.health.incident_at,
            )
        )

    def _mark_active(self, serving: EndpointTracker) -> None:
        for trackers in self._trackers.values():
            for tracker in trackers:
                if tracker.health.active != (tracker is serving):
                    self._sync(tracker, partial(tracker.set_active, tracker is serving))

    def _emit(self, event: ProviderEvent) -> None:
        if self._on_event is None:
            return
        try:
            self._on_event(event)
        except Exception:  # a broken listener must not break model calls
            log.exception("provider event listener failed on %s", event.kind)

    # -- health shared through the store ----------------------------------------------------------------
    def _refresh(self) -> None:
        """Take up what other processes recorded about these endpoints since this router last looked."""
        if self._store is None:
            return
        try:
            stored = {(h.provider, h.endpoint): h for h in self._store.read(list_health)}
        except StoreError as exc:
            log.warning("cannot read provider health: %s", redact(exc.message))
            return
        for trackers in self._trackers.values():
            for tracker in trackers:
                health = stored.get((tracker.health.provider, tracker.health.endpoint))
                if health is not None and self._newer(tracker, health):
                    tracker.adopt(health)
                    self._seen[tracker.name] = health.updated_at

    def _sync(self, tracker: EndpointTracker, change: Callable[[], R]) -> R:
        """Apply `change` to the endpoint's health as the store has it now, and record the result, in one
        write transaction: two processes never decide from a state the other has moved on from."""
        if self._store is None:
            return change()
        before = tracker.health

        def write(txn: Txn) -> R:
            tracker.health = before  # the transaction may run again
            stored = get_health(txn, before.provider, before.endpoint)
            if stored is not None and self._newer(tracker, stored):
                tracker.adopt(stored)
            self._syncing = True
            try:
                result = change()
            finally:
                self._syncing = False
            put_health(txn, tracker.health)
            return result

        try:
            result = self._store.write(write)
        except StoreError as exc:
            log.warning("cannot record health of %s: %s", tracker.name, redact(exc.message))
            tracker.health = before
            return change()
        self._seen[tracker.name] = tracker.health.updated_at
        return result

    def _newer(self, tracker: EndpointTracker, stored: EndpointHealth) -> bool:
        """Another process recorded this endpoint since this router last wrote or read it."""
        same = (stored.url, stored.model) == (tracker.health.url, tracker.health.model)
        return same and stored.updated_at > self._seen.get(tracker.name, 0.0)

    def _persist(self, tracker: EndpointTracker) -> None:
        """A change made outside `_sync` (a probe's outcome): recorded as it is."""
        if self._store is None or self._syncing:
            return
        health = tracker.health
        try:
            self._store.write(lambda txn: put_health(txn, health))
        except StoreError as exc:
            log.warning("cannot record health of %s: %s", tracker.name, redact(exc.message))
            return
        self._seen[tracker.name] = health.updated_at
