"""The mission spec: what a mission file says, as typed, frozen Structs.

Stored with the mission, so these types follow msgspec's schema-evolution rules: new fields get
defaults, no field ever changes its type.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

CheckpointPolicyName = Literal["adaptive", "every-step", "interval"]
FailoverPolicy = Literal["capable", "never"]


class UnitSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """One work unit of the task graph."""

    id: str
    kind: str = "default"
    title: str = ""
    after: tuple[str, ...] = ()
    params: dict[str, Any] = {}
    timeout_s: float | None = None


class Requirements(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """Capabilities a model must have to serve this mission (checked before any failover)."""

    tools: bool = False
    min_context: int = 0
    local_only: bool = False
    max_cost_per_mtok: float | None = None
    vision: bool = False
    no_data_retention: bool = False


class ModelPolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    prefer: tuple[str, ...] = ()
    failover: FailoverPolicy = "capable"
    require: Requirements = Requirements()
    auto_resume: bool = True


class CheckpointPolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """How soon a step must be durable; see docs/checkpointing.md for the cost model."""

    policy: CheckpointPolicyName = "adaptive"
    group_window_ms: float = 2.0
    expensive_step_ms: float = 50.0
    snapshot_budget_ms: float = 30_000.0
    interval_ms: float = 1_000.0


class Permissions(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    tools: tuple[str, ...] = ("read_file", "list_files", "search", "write_file", "apply_diff", "run")
    command_timeout_s: float = 120.0
    env: tuple[str, ...] = ()  # names of keel's environment variables commands get as they are (docs/mission-file.md)


class Budget(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """What one unit may spend in one run of it before the mission pauses (reason `budget`, the message
    naming the limit): model requests and tokens paid for (an answer from the journal costs nothing); 0
    means no limit. A resume gives the unit a new budget."""

    model_requests: int = 500
    tokens: int = 20_000_000


class MissionSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """A whole mission as read from a mission file."""

    name: str
    agent: tuple[str, ...]
    goal: str = ""
    workspace: str = "."
    max_parallel: int = 4
    plan: bool = False
    workers: bool = False  # units are offered to `keel worker`s (any machine sharing the store), not run by the host
    units: tuple[UnitSpec, ...] = ()
    models: ModelPolicy = ModelPolicy()
    checkpoint: CheckpointPolicy = CheckpointPolicy()
    permissions: Permissions = Permissions()
    env: dict[str, str] = {}
    budget: Budget = Budget()
