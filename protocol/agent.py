"""The agent protocol's payloads: what host and agent say to each other over JSON-RPC 2.0.

    host -> agent   initialize, unit/run, shutdown                              (requests)
    agent -> host   model/complete, model/forward, tool/run, effect/ask, human/ask,
                    evidence/add, state/save, plan/add, now, random              (requests)

Frames use Content-Length (protocol/framing.py). One agent process runs one unit at a time. Every
agent -> host request is answered only after the host has made its journal entry durable; on replay the
host answers from the journal without running anything. docs/agent-protocol.md is the prose version.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from keel.protocol.spec import UnitSpec

PROTOCOL_VERSION = 1

# -- host -> agent ---------------------------------------------------------------------------------


class InitializeParams(msgspec.Struct, frozen=True, omit_defaults=True):
    protocol_version: int
    mission_id: str
    goal: str = ""
    sandbox: str = ""  # the folder tools run in (informational; agents act through tool/run)


class InitializeResult(msgspec.Struct, frozen=True, omit_defaults=True):
    name: str
    kinds: tuple[str, ...] = ()  # unit kinds it handles; empty = any
    version: str = ""
    # "replay": after a crash the agent runs the unit again from the start and the host answers its requests
    # from the journal by position (keel's own agents). "append": the agent cannot repeat itself (it drives
    # an outside agent with its own session state); a restarted run carries on after the journal's last
    # entry and learns where it was from its saved state (keel.agents.acp).
    journal: Literal["replay", "append"] = "replay"
    # a replaying agent that carries on from the state it last saved: every `state/save` it makes holds all
    # it needs to go on from there, so a restarted run is given that state (`UnitRunParams.state`) and its
    # requests are numbered after that save's entry (`UnitRunParams.resumed_at`): it replays only what came
    # after the save, never its whole history (Temporal's continue-as-new, at every save)
    resumes: bool = False


class UnitRunParams(msgspec.Struct, frozen=True, omit_defaults=True):
    unit: UnitSpec
    attempt: int = 1
    state: Any = None  # the last value the agent saved with state/save for this unit, if any
    replaying: bool = False  # informational: the host holds journal entries for this unit (after `resumed_at`)
    # a resuming agent (InitializeResult.resumes) carries on from `state`, saved at this journal entry: its
    # first request is numbered resumed_at + 1 (0: it starts from the beginning)
    resumed_at: int = 0
    home: str = ""  # a folder of this unit's own, outside the sandbox, kept across the unit's runs
    history: tuple[str, ...] = ()  # for an appending agent: its journal so far, one line per entry
    tools: tuple[str, ...] = ()  # the keel tools the mission's permissions allow (empty: not said)


class UnitRunResult(msgspec.Struct, frozen=True, omit_defaults=True):
    result: Any = None
    summary: str = ""


# -- agent -> host ---------------------------------------------------------------------------------


class ToolCallSpec(msgspec.Struct, frozen=True, omit_defaults=True):
    """A function the model may call (OpenAI function-calling shape)."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = {}


class ModelCompleteParams(msgspec.Struct, frozen=True, omit_defaults=True):
    messages: list[dict[str, Any]]  # OpenAI chat messages
    tools: list[ToolCallSpec] = []
    max_tokens: int | None = None
    temperature: float | None = None
    purpose: str = ""  # free text for evidence and the editor


class Usage(msgspec.Struct, frozen=True, omit_defaults=True):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class ModelCompleteResult(msgspec.Struct, frozen=True, omit_defaults=True):
    message: dict[str, Any]  # {"role": "assistant", "content": ..., "tool_calls": [...]}
    model: str  # the model that actually served the call
    provider: str = ""
    finish_reason: str = ""
    usage: Usage = Usage()


ForwardApi = Literal["anthropic", "openai-responses", "gemini"]


class ModelForwardParams(msgspec.Struct, frozen=True, omit_defaults=True):
    """A model request in a provider's own wire format, as an outside agent sent it to keel's model proxy
    (keel.agents.acp). The host serves it with a configured provider of that format, under the mission's
    policy, and journals the whole answer."""

    api: ForwardApi
    body: dict[str, Any]
    path: str = ""  # for gemini: "models/<model>:streamGenerateContent" etc.
    session: str = ""  # the outside agent's session id
    ordinal: int = 0  # the request's number within that session (1, 2, ...)


class ModelForwardResult(msgspec.Struct, frozen=True, omit_defaults=True):
    status: int
    content_type: str
    body: str  # the answer as the provider sent it: JSON, or the whole event stream
    model: str = ""
    provider: str = ""
    usage: Usage = Usage()
    replayed_from: int = 0  # the journal entry whose answer this is, when it was not asked again


class EffectAskParams(msgspec.Struct, frozen=True, omit_defaults=True):
    """An outside agent asks before an effect it will make itself (an ACP permission request): the host
    records the intent, then allows or denies it under the mission's permissions."""

    tool: str  # the keel tool it counts as: write_file, run, ...
    title: str
    call_id: str = ""
    detail: Any = None  # the agent's diff or command


class EffectAskResult(msgspec.Struct, frozen=True, omit_defaults=True):
    allow: bool
    reason: str = ""


class EffectDoneParams(msgspec.Struct, frozen=True, omit_defaults=True):
    """The outcome of an effect allowed by `effect/ask` (same `call_id`): the outside agent reported the
    call finished. An allowed effect without one stays in doubt after a crash."""

    call_id: str
    status: Literal["completed", "failed"] = "completed"
    output: str = ""  # what the call reported (its output's end), kept as the effect's recorded outcome


class ToolRunParams(msgspec.Struct, frozen=True, omit_defaults=True):
    tool: str
    args: dict[str, Any] = {}


class ToolRunResult(msgspec.Struct, frozen=True, omit_defaults=True):
    ok: bool
    output: Any = None
    error: str = ""


class HumanAskParams(msgspec.Struct, frozen=True, omit_defaults=True):
    question: str
    choices: tuple[str, ...] = ()


class HumanAskResult(msgspec.Struct, frozen=True):
    answer: str


class EvidenceAddParams(msgspec.Struct, frozen=True, omit_defaults=True):
    kind: str
    summary: str = ""
    data: Any = None


class StateSaveParams(msgspec.Struct, frozen=True):
    state: Any


class PlanAddParams(msgspec.Struct, frozen=True):
    units: tuple[UnitSpec, ...]


class PlanAddResult(msgspec.Struct, frozen=True):
    added: tuple[str, ...]


class NowResult(msgspec.Struct, frozen=True):
    time: float


class RandomResult(msgspec.Struct, frozen=True):
    value: float


AgentMethod = Literal[
    "model/complete",
    "model/forward",
    "tool/run",
    "effect/ask",
    "effect/done",
    "human/ask",
    "evidence/add",
    "state/save",
    "plan/add",
    "now",
    "random",
]

#: Params type of each agent -> host method (the host decodes with these; None = no params).
AGENT_METHODS: dict[str, type[Any] | None] = {
    "model/complete": ModelCompleteParams,
    "model/forward": ModelForwardParams,
    "tool/run": ToolRunParams,
    "effect/ask": EffectAskParams,
    "effect/done": EffectDoneParams,
    "human/ask": HumanAskParams,
    "evidence/add": EvidenceAddParams,
    "state/save": StateSaveParams,
    "plan/add": PlanAddParams,
    "now": None,
    "random": None,
}

#: Notification from a unit's worker (server/engine/units/subagent.py) to the host, never from an agent: the agent
#: broke the protocol (params: {"message": what was wrong}); the worker has killed it, the unit fails.
AGENT_ERROR = "keel/agentError"

# Error codes an agent may see in JSON-RPC error responses from the host.
ERR_NONDETERMINISM = -32010  # the request does not match the journal entry at this position
ERR_TOOL_DENIED = -32011  # the mission's permissions do not allow this tool
ERR_PAUSING = -32012  # the mission is pausing; the agent should stop (it will be re-run on resume)
ERR_MODEL_UNAVAILABLE = -32013  # no provider may serve this call under the mission's policy
ERR_DISK_FULL = -32014  # a filesystem keel writes to is full: the mission pauses (a subagent reports it too)
