"""Which configured models may serve a mission, in which order: ModelPolicy applied to ProviderSettings.

- Order: the providers `prefer` names (by provider name, model name or "provider/model"), in that
  order, then every other provider in configuration order. The first is the preferred model.
- Requirements (tools, min_context, local_only, max_cost_per_mtok, vision, no_data_retention) filter;
  a call that passes tools also needs tool calling. A local model counts as retaining no data.
- failover = "never": the preferred model only (its endpoints may still take over from each other: the
  model does not change). If it does not meet the requirements, nothing may serve the call.

Depends on keel.protocol and the providers' config module only.
"""

from __future__ import annotations

from keel.protocol.spec import ModelPolicy, Requirements
from keel.server.providers.config import ProviderConfig


def unmet(provider: ProviderConfig, require: Requirements, needs_tools: bool = False) -> list[str]:
    """The requirements this provider's model does not meet, in words (empty: it qualifies)."""
    caps, reasons = provider.capabilities, []
    if (require.tools or needs_tools) and not caps.tools:
        reasons.append("no tool calling")
    if caps.context_window < require.min_context:
        reasons.append(f"context window {caps.context_window} < {require.min_context}")
    if require.local_only and not caps.local:
        reasons.append("not local")
    if require.max_cost_per_mtok is not None and provider.cost.ceiling > require.max_cost_per_mtok:
        reasons.append(f"costs {provider.cost.ceiling:g}/Mtok > {require.max_cost_per_mtok:g}")
    if require.vision and not caps.vision:
        reasons.append("no vision")
    if require.no_data_retention and not (caps.local or caps.data_retention == "none"):
        reasons.append("retains data")
    return reasons


def ordered(providers: tuple[ProviderConfig, ...], policy: ModelPolicy) -> list[ProviderConfig]:
    """Providers in the order the policy prefers them."""

    def rank(p: ProviderConfig) -> int:
        for index, name in enumerate(policy.prefer):
            if name in (p.name, p.model, f"{p.name}/{p.model}"):
                return index
        return len(policy.prefer)

    return sorted(providers, key=rank)  # stable: configuration order among equals


def candidates(
    providers: tuple[ProviderConfig, ...], policy: ModelPolicy, needs_tools: bool = False
) -> tuple[list[ProviderConfig], list[str]]:
    """(the providers that may serve a call, in order; why each other one may not)."""
    order = ordered(providers, policy)
    if policy.failover == "never":
        order = order[:1]
    chosen, rejected = [], []
    for provider in order:
        reasons = unmet(provider, policy.require, needs_tools)
        if reasons:
            rejected.append(f"{provider.name} ({provider.model}): {', '.join(reasons)}")
        else:
            chosen.append(provider)
    return chosen, rejected
