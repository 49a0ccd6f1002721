"""The router under policy: failover respects requirements and `never`, the served model is recorded,
Retry-After is honoured, both wire formats stream, cancellation leaves nothing behind, health moves
through its state machine and is persisted in the store."""

from __future__ import annotations

import asyncio
import email.utils
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from faultserver import FaultServer, error, ok, rate_limited
from providerkit import FAST, PARAMS, DictSecrets, provider, settings

from keel.protocol.agent import ModelCompleteParams, ToolCallSpec
from keel.protocol.spec import ModelPolicy, Requirements
from keel.server.providers import (
    HealthState,
    NetworkConfig,
    PolicyPauseError,
    ProviderError,
    ProviderEvent,
    ProviderRouter,
    ProviderSettings,
)
from keel.server.providers.healthstore import list_health
from keel.storage import Store


def router(
    cfg: ProviderSettings, events: list[ProviderEvent], policy: ModelPolicy | None = None, store: Store | None = None
) -> ProviderRouter:
    return ProviderRouter(cfg, policy or ModelPolicy(), secrets=DictSecrets(), on_event=events.append, store=store)


async def test_a_call_that_passes_several_endpoints_is_one_failover(
    fault_factory: Callable[..., FaultServer], events: list[ProviderEvent]
) -> None:
    """a refuses the key, b refuses it too, c serves: one switch a → c (the user sees one), and each
    endpoint's health still names the hop it made."""
    a, b, c = fault_factory(), fault_factory(), fault_factory()
    a.push(error(401))
    b.push(error(403))
    r = router(settings(provider("a", a.url), provider("b", b.url), provider("c", c.url)), events)
    result = await r.complete(PARAMS)
    health = {h.provider: h for h in r.health_snapshot()}
    await r.aclose()
    assert result.provider == "c"
    assert [(e.source, e.target, e.reason) for e in events if e.kind == "failover"] == [("a/0", "c/0", "auth")]
    assert health["a"].last_failover.startswith("-> b/0") and health["b"].last_failover.startswith("-> c/0")


async def test_a_call_no_endpoint_serves_is_no_failover(
    fault_factory: Callable[..., FaultServer], events: list[ProviderEvent]
) -> None:
    a, b = fault_factory(), fault_factory()
    a.push(error(401))
    b.push(error(401))
    r = router(settings(provider("a", a.url), provider("b", b.url)), events)
    with pytest.raises(ProviderError, match="no candidate could serve the call"):
        await r.complete(PARAMS)
    await r.aclose()
    assert [e for e in events if e.kind == "failover"] == []


async def test_failover_picks_only_candidates_that_meet_the_requirements(
    fault_factory: Callable[..., FaultServer], events: list[ProviderEvent]
) -> None:
    cloud, cheap_remote, no_tools_local, local = (fault_factory() for _ in range(4))
    cloud.push(error(401))
    policy = ModelPolicy(prefer=("cloud",), require=Requirements(tools=True, local_only=True))
    cfg = settings(
        provider("cloud", cloud.url, local=True),
        provider("remote", cheap_remote.url),
        provider("notools", no_tools_local.url, local=True, tools=False),
        provider("local", local.url, local=True, model="qwen2.5-coder"),
    )
    r = router(cfg, events, policy)
    result = await r.complete(PARAMS)
    await r.aclose()
    assert (result.provider, result.model) == ("local", "qwen2.5-coder")
    assert (len(cheap_remote.posts), len(no_tools_local.posts)) == (0, 0)
    failover = next(e for e in events if e.kind == "failover")
    assert (failover.source, failover.target, failover.reason, failover.target_model) == (
        "cloud/0",
        "local/0",
        "auth",
        "qwen2.5-coder",
    )


@pytest.mark.parametrize(
    ("requirement", "allowed"),
    [
        (Requirements(max_cost_per_mtok=2.0), "cheap"),
        (Requirements(vision=True), "seeing"),
        (Requirements(no_data_retention=True), "private"),
        (Requirements(min_context=100_000), "wide"),
    ],
)
async def test_each_requirement_filters(
    fault: FaultServer, events: list[ProviderEvent], requirement: Requirements, allowed: str
) -> None:
    cfg = settings(
        provider("dear", fault.url, cost=15.0, context=8192),
        provider("cheap", fault.url, cost=1.0),
        provider("seeing", fault.url, cost=9.0, vision=True),
        provider("private", fault.url, cost=9.0, retention="none"),
        provider("wide", fault.url, cost=9.0, context=200_000),
    )
    r = router(cfg, events, ModelPolicy(require=requirement))
    result = await r.complete(PARAMS)
    await r.aclose()
    assert result.provider == allowed


async def test_no_candidate_meets_the_requirements(fault: FaultServer, events: list[ProviderEvent]) -> None:
    r = router(settings(provider("remote", fault.url)), events, ModelPolicy(require=Requirements(local_only=True)))
    with pytest.raises(PolicyPauseError, match=r"remote.*not local"):
        await r.complete(PARAMS)
    await r.aclose()
    assert fault.posts == []


async def test_a_call_with_tools_needs_tool_calling(
    fault_factory: Callable[..., FaultServer], events: list[ProviderEvent]
) -> None:
    plain, capable = fault_factory(), fault_factory()
    r = router(settings(provider("plain", plain.url, tools=False), provider("capable", capable.url)), events)
    params = ModelCompleteParams(messages=PARAMS.messages, tools=[ToolCallSpec(name="read_file")])
    result = await r.complete(params)
    await r.aclose()
    assert result.provider == "capable" and plain.posts == []
    assert capable.posts[0].body["tools"][0]["function"]["name"] == "read_file"


@pytest.mark.parametrize("failure", [error(401), error(503)], ids=["persistent", "retries_exhausted"])
async def test_never_pauses_instead_of_failing_over(
    fault_factory: Callable[..., FaultServer], events: list[ProviderEvent], failure: object
) -> None:
    preferred, other = fault_factory(default=failure), fault_factory()
    policy = ModelPolicy(prefer=("preferred",), failover="never")
    r = router(settings(provider("other", other.url), provider("preferred", preferred.url)), events, policy)
    with pytest.raises(PolicyPauseError, match="failover = never"):
        await r.complete(PARAMS)
    await r.aclose()
    assert other.posts == []
    assert [e for e in events if e.kind == "failover"] == []


async def test_never_still_uses_the_preferred_models_other_endpoint(
    fault_factory: Callable[..., FaultServer], events: list[ProviderEvent]
) -> None:
    first, second = fault_factory(default=error(403)), fault_factory()
    r = router(settings(provider("p", first.url, second.url)), events, ModelPolicy(failover="never"))
    result = await r.complete(PARAMS)
    await r.aclose()
    assert result.provider == "p" and len(second.posts) == 1
    assert [(e.source, e.target) for e in events if e.kind == "failover"] == [("p/0", "p/1")]


@pytest.mark.parametrize("header", ["seconds", "http_date"])
async def test_retry_after_is_honoured(fault: FaultServer, events: list[ProviderEvent], header: str) -> None:
    value = "1" if header == "seconds" else email.utils.formatdate(time.time() + 2, usegmt=True)
    fault.push(rate_limited(value))
    r = router(settings(provider("a", fault.url)), events)
    await r.complete(PARAMS)
    await r.aclose()
    gap = fault.posts[1].at - fault.posts[0].at
    retry = next(e for e in events if e.kind == "retry")
    # HTTP-dates have whole seconds: "now + 2 s" rounds down to between 1 and 2 seconds from now.
    assert 0.9 <= gap <= 4.0, gap  # lower bound: honoured; upper: generous for a loaded machine
    assert retry.reason == "rate_limited" and 0.8 <= retry.delay_s <= 2.1


async def test_retry_after_beyond_the_cap_cools_down_and_fails_over(
    fault_factory: Callable[..., FaultServer], events: list[ProviderEvent]
) -> None:
    limited, other = fault_factory(), fault_factory()
    limited.push(rate_limited("3600"))
    r = router(settings(provider("limited", limited.url), provider("other", other.url)), events)
    started = time.monotonic()
    result = await r.complete(PARAMS)
    health = r.health_snapshot()[0]
    await r.aclose()
    assert time.monotonic() - started < 30  # did not sit out the hour the server asked for
    assert result.provider == "other"
    assert health.state == HealthState.COOLING_DOWN and health.cooldown_until > time.time() + 3000


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
@pytest.mark.parametrize("kind", ["openai-compatible", "anthropic"])
async def test_wire_formats_return_text_and_tool_calls(
    fault: FaultServer, events: list[ProviderEvent], kind: str, stream: bool
) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}
    fault.push(ok("hello there world", model="served-model-2024"), ok(tool_calls=(call,)))
    url = fault.root if kind == "anthropic" else fault.url
    r = router(settings(provider("p", url, kind=kind, stream=stream)), events)
    params = ModelCompleteParams(
        messages=[
            *PARAMS.messages,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "x = 1"},
        ],
        tools=[ToolCallSpec(name="read_file", parameters={"type": "object"})],
    )
    text = await r.complete(params)
    tools = await r.complete(params)
    await r.aclose()
    assert text.message["content"] == "hello there world"
    assert (text.model, text.provider, text.finish_reason) == ("served-model-2024", "p", "stop")
    assert text.usage.prompt_tokens == 7 and text.usage.completion_tokens == 3
    assert tools.finish_reason == "tool_calls"
    [got] = tools.message["tool_calls"]
    assert got["id"] == "call_1" and got["function"]["name"] == "read_file"
    assert got["function"]["arguments"].replace(" ", "") == '{"path":"a.py"}'
    body = fault.posts[0].body
    assert body.get("stream", False) is stream
    if kind == "anthropic":
        assert fault.posts[0].path == "/v1/messages" and body["system"] == "be brief"
        assert body["messages"][-1]["content"][0]["type"] == "tool_result"
        assert body["messages"][-2]["content"][0]["type"] == "tool_use"
    else:
        assert fault.posts[0].path == "/v1/chat/completions" and body["messages"] == params.messages


async def test_cancellation_leaves_nothing_half_written(
    fault: FaultServer, events: list[ProviderEvent], tmp_path: Path
) -> None:
    fault.push(ok("one two three four five six", chunk_delay=0.1))
    with Store.open(tmp_path / "store") as store:
        r = router(settings(provider("p", fault.url)), events, store=store)
        before = r.health_snapshot()
        task = asyncio.create_task(r.complete(PARAMS))
        await asyncio.sleep(0.25)  # a few chunks have arrived
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert events == [] and r.health_snapshot() == before
        assert store.read(list_health) == []
        again = await r.complete(PARAMS)  # the router is still fine
        await r.aclose()
    assert again.message["content"] == "ok"


async def test_health_machine_and_persistence(
    fault_factory: Callable[..., FaultServer], events: list[ProviderEvent], tmp_path: Path
) -> None:
    flaky, backup = fault_factory(), fault_factory()
    network = NetworkConfig(
        **{**{f: getattr(FAST, f) for f in FAST.__struct_fields__}, "failures_to_cool_down": 2, "max_attempts": 5}
    )
    with Store.open(tmp_path / "store") as store:
        r = router(
            settings(provider("flaky", flaky.url), provider("backup", backup.url), network=network), events, store=store
        )
        flaky.push(error(500))
        assert (await r.complete(PARAMS)).provider == "flaky"  # healthy -> degraded -> healthy
        flaky.push(error(500), error(500))
        assert (await r.complete(PARAMS)).provider == "backup"  # degraded -> cooling_down, fail over
        posts = len(flaky.posts)
        assert (await r.complete(PARAMS)).provider == "backup"  # cooling down: skipped
        assert len(flaky.posts) == posts
        stored = {h.provider: h for h in store.read(list_health)}
        await r.aclose()
    changes = [(e.provider, e.old_state, e.new_state) for e in events if e.kind == "health"]
    assert changes == [
        ("flaky", "healthy", "degraded"),
        ("flaky", "degraded", "healthy"),
        ("flaky", "healthy", "degraded"),
        ("flaky", "degraded", "cooling_down"),
    ]
    assert stored["flaky"].state == "cooling_down" and stored["flaky"].cooldown_until > time.time()
    assert "HTTP 500" in stored["flaky"].last_error and not stored["flaky"].active
    assert stored["backup"].active and stored["backup"].state == "healthy"
