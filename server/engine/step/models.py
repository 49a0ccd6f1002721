"""Model calls of a running mission: the agent's `model/complete` (and an outside agent's `model/forward`,
through keel's model proxy), served by the provider router, journaled.

A unit hands every `model/complete` that its journal has not recorded to `ModelCalls.complete`, and records
the StepResult it returns.
It serves the call with one ProviderRouter per host (configuration: the mission workspace's
`.keel/config.toml` plus the user's file; policy: the mission spec's `models`; endpoint health goes to the
host's store, where `keel providers` and the editor read it) and turns the outcome into what the mission
does (docs/providers.md, "What the engine does"):

- a result: one journal entry with the served model and its token cost, committed before the agent
  sees the result (a replay returns it without any HTTP request);
- OfflineError: the host stops the mission in state `offline`; the agent hears ERR_PAUSING and nothing
  is recorded, so the call is made again when the mission resumes;
- PolicyPauseError, or a provider configuration that cannot be read: the mission pauses with reason
  `policy`, the error in MissionRecord.error;
- any other ProviderError: the agent gets ERR_MODEL_UNAVAILABLE (nothing recorded).

Each failover the router reports becomes evidence plus a restore point ("failover: A -> B"), queued on
the journal writer before the call's own entry. The active model (provider/model) is the only part of a
checkpoint's configuration that failover changes. Depends on the providers package, storage and the
engine's own modules; never on the language server, nor on the host or unitrun modules (it sees the host
through interface.Host).
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import msgspec

from keel.protocol import agent as ap
from keel.protocol import rpc
from keel.protocol.records import Evidence
from keel.protocol.states import PauseReason, stopped_state
from keel.server.engine.agentproc import HandlerError
from keel.server.engine.interface import Host, StepResult
from keel.server.providers.config import ProviderSettings, load_provider_config
from keel.server.providers.errors import OfflineError, PolicyPauseError, ProviderConfigError, ProviderError
from keel.storage import Txn
from keel.storage import missions as m
from keel.storage.errors import StoreError

if TYPE_CHECKING:
    from keel.server.providers.health import ProviderEvent
    from keel.server.providers.router import ProviderRouter

Served = TypeVar("Served", ap.ModelCompleteResult, ap.ModelForwardResult)
P = TypeVar("P")
_calling_unit: contextvars.ContextVar[str] = contextvars.ContextVar("keel_calling_unit", default="")


class ModelCalls:
    """The host's model provider: one router, the active model, failovers recorded as they happen."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.active_model = ""  # "provider/model" that served (or was failed over to) last
        self.failovers = 0
        self._incidents: set[tuple[str, float]] = set()  # (endpoint, when its breaker opened) marked here
        self._router: ProviderRouter | None = None
        self._config: ProviderSettings | ProviderConfigError = self._load()

    def _load(self) -> ProviderSettings | ProviderConfigError:
        try:
            return load_provider_config(Path(self.host.record.workspace))
        except ProviderConfigError as exc:
            return exc

    def carry_on(self, txn: Txn, config_digest: str) -> None:
        """A host taking a mission up again starts from the active model its HEAD checkpoint recorded."""
        config = txn.get_object(config_digest, dict) if config_digest else None
        if isinstance(config, dict) and isinstance(config.get("active_model"), str):
            self.active_model = config["active_model"]

    @property
    def hidden_env(self) -> frozenset[str]:
        """Environment variables that hold provider keys (`api_key_env`): never passed to an agent."""
        if isinstance(self._config, ProviderConfigError):
            return frozenset()
        return frozenset(p.api_key_env for p in self._config.providers if p.api_key_env)

    def router(self) -> ProviderRouter:
        if isinstance(self._config, ProviderConfigError):
            raise self._config
        if self._router is None:
            from keel.server.providers.router import ProviderRouter  # httpx, keyring: loaded by a first call

            self._router = ProviderRouter(
                self._config, self.host.spec.models, on_event=self._on_event, store=self.host.store
            )
        return self._router

    async def aclose(self) -> None:
        if self._router is not None:
            await self._router.aclose()

    # -- one call -------------------------------------------------------------------------------------
    async def complete(self, unit: str, params: Any) -> StepResult:
        """Serve one call for `unit`: the result to record, or the mission stops (see the module doc)."""
        call = _convert(params, ap.ModelCompleteParams, "model/complete")
        result = await self._served(unit, lambda: self.router().complete(call))
        tokens = result.usage.prompt_tokens + result.usage.completion_tokens
        return StepResult(
            msgspec.to_builtins(result),
            tokens=tokens,
            served_model=result.model,
            summary=f"{result.provider}/{result.model}: {tokens} tokens",
        )

    async def forward(self, unit: str, params: Any) -> StepResult:
        """Serve a request an outside agent made in its provider's own format (keel's model proxy)."""
        call = _convert(params, ap.ModelForwardParams, "model/forward")
        result = await self._served(unit, lambda: self.router().forward(call))
        tokens = result.usage.prompt_tokens + result.usage.completion_tokens
        return StepResult(
            {"session": call.session, "ordinal": call.ordinal, **msgspec.to_builtins(result)},
            tokens=tokens,
            served_model=result.model,
            summary=f"{result.provider}/{result.model} ({call.api}): {tokens} tokens",
        )

    async def _served(self, unit: str, serve: Callable[[], Awaitable[Served]]) -> Served:
        _calling_unit.set(unit)
        try:
            result = await serve()
        except OfflineError as exc:
            await self._stop(PauseReason.OFFLINE, exc.message)
        except (PolicyPauseError, ProviderConfigError) as exc:
            await self._stop(PauseReason.POLICY, exc.message)
        except ProviderError as exc:
            raise HandlerError(ap.ERR_MODEL_UNAVAILABLE, exc.message) from None
        self.active_model = f"{result.provider}/{result.model}"
        return result

    async def _stop(self, reason: PauseReason, message: str) -> NoReturn:
        """Stop the mission (offline, or paused for policy). The agent hears ERR_PAUSING (the host is
        stopping it; an error now means "stopped", not "failed"); nothing was journaled, so the call is
        made again when the mission resumes."""
        await self.host.stop(reason, message)
        raise HandlerError(ap.ERR_PAUSING, f"the mission stops ({stopped_state(reason).value}): {message}")

    # -- failover ---------------------------------------------------------------------------------------
    def _on_event(self, event: ProviderEvent) -> None:
        if event.kind != "failover":
            return
        target_provider = event.target.split("/", 1)[0]
        self.active_model = f"{target_provider}/{event.target_model}"
        incident = (event.source, event.incident_at)
        if event.again and (incident in self._incidents or self._marked(event)):
            return  # a trial of an endpoint still failing: the incident this mission has marked already
        self._incidents.add(incident)
        self.failovers += 1
        evidence = Evidence(
            kind="failover",
            at=event.at,
            unit=_calling_unit.get(),
            summary=f"failover {event.source} -> {event.target} ({failover_cause(event)}); now serving "
            f"{self.active_model}",
            data={**msgspec.to_builtins(event), "providers": PROVIDERS_VIEW},
        )
        mission_id = self.host.mission_id

        def add(txn: Txn) -> None:
            m.add_evidence(txn, mission_id, evidence)

        self.host.checkpoint_soon(f"failover: {event.source} -> {event.target}", extra=add)
        self.host.progress.event(
            "failover",
            source=event.source,
            target=event.target,
            reason=event.reason,
            model=self.active_model,
            at=round(time.time(), 3),
        )

    def _marked(self, event: ProviderEvent) -> bool:
        """This mission recorded a failover from the event's source in the same incident (another
        process of it, or this one, when its breaker opened)."""

        def read(txn: Txn) -> bool:
            return any(
                e.kind == "failover"
                and isinstance(e.data, dict)
                and e.data.get("from") == event.source
                and e.data.get("incident_at") == event.incident_at
                for _, e in m.evidence_after(txn, self.host.mission_id)
            )

        try:
            return bool(self.host.store.read(read))
        except StoreError:
            return False  # unknown: marked again rather than lost


PROVIDERS_VIEW = "command:keel.providers.focus"  # the editor's Providers view, where health and cooldowns show


def failover_cause(event: ProviderEvent) -> str:
    """ "server_error, HTTP 503 Service Unavailable: overloaded" — the kind, the HTTP status and its text."""
    if not event.status:
        return event.reason + (f": {_tail(event.cause)}" if event.cause else "")
    try:
        phrase = f" {HTTPStatus(event.status).phrase}"
    except ValueError:
        phrase = ""
    text = event.cause.split(f"HTTP {event.status}: ", 1)[-1] if event.cause else ""
    return f"{event.reason}, HTTP {event.status}{phrase}" + (f": {text[:160]}" if text else "")


def _tail(cause: str) -> str:
    """A failure message without the endpoint's URL in front ("http://host/v1: connection refused")."""
    return cause.split(": ", 1)[-1][:160] if "://" in cause.split(" ", 1)[0] else cause[:160]


def _convert(params: Any, type_: type[P], method: str) -> P:
    try:
        return msgspec.convert(params or {}, type_)
    except msgspec.ValidationError as exc:
        raise HandlerError(rpc.INVALID_PARAMS, f"{method}: {exc}") from None
