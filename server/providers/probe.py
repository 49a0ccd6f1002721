"""Probing for connectivity: one cheap GET per endpoint (the models list), with backoff between rounds.

Any HTTP answer means the endpoint is reachable again (a 401 is not "offline": the real error will show
on the next call); only connection-level failures mean it is not. Depends on the providers' retry,
health and wire modules only.
"""

from __future__ import annotations

import anyio
import httpx

from keel.server.providers import anthropic
from keel.server.providers.config import NetworkConfig, ProviderConfig
from keel.server.providers.errors import redact
from keel.server.providers.health import EndpointTracker
from keel.server.providers.retry import AttemptFailure, Backoff, classify_exception, classify_response
from keel.server.providers.wire import describe

PROBE_READ_TIMEOUT_S = 10.0


class ProbeState:
    """Counts failed rounds; each round first waits the full-jitter backoff the failures so far have earned."""

    def __init__(self, backoff: Backoff) -> None:
        self.backoff = backoff
        self.failed_rounds = 0

    async def wait(self) -> None:
        if self.failed_rounds:
            await anyio.sleep(self.backoff.delay(self.failed_rounds))

    def record(self, answered: bool) -> bool:
        self.failed_rounds = 0 if answered else self.failed_rounds + 1
        return answered


def models_url(provider: ProviderConfig, base_url: str) -> str:
    if provider.kind == "anthropic":
        return anthropic.messages_url(base_url).removesuffix("/messages") + "/models"
    return base_url.rstrip("/") + "/models"


async def probe_endpoint(
    client: httpx.AsyncClient,
    provider: ProviderConfig,
    tracker: EndpointTracker,
    key: str | None,
    network: NetworkConfig,
) -> bool:
    """True when the endpoint answers over HTTP; its health is updated either way."""
    url = models_url(provider, tracker.health.url)
    headers: dict[str, str] = {}
    if key:
        headers = (
            {"x-api-key": key, "anthropic-version": anthropic.API_VERSION}
            if provider.kind == "anthropic"
            else {"Authorization": f"Bearer {key}"}
        )
    timeout = httpx.Timeout(min(network.read_timeout_s, PROBE_READ_TIMEOUT_S), connect=network.connect_timeout_s)
    try:
        response = await client.get(url, headers=headers, timeout=timeout)
    except httpx.HTTPError as exc:
        tracker.record_failure(AttemptFailure(classify_exception(exc), redact(f"{url}: {describe(exc)}")))
        return False
    kind = classify_response(response.status_code, response.text[:500])
    if kind is None:
        tracker.record_success()
    else:
        tracker.record_failure(
            AttemptFailure(kind, redact(f"{url}: HTTP {response.status_code} on probe"), status=response.status_code)
        )
    return True
