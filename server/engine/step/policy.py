"""The checkpoint policy: per step, whether its commit is urgent, and when a snapshot checkpoint is due.

docs/checkpointing.md explains the cost model. Depends on protocol only (the mission's CheckpointPolicy);
it never touches the store: the host asks and commits.
"""

from __future__ import annotations

import time

from keel.protocol.spec import CheckpointPolicy

#: Steps that are cheap to redo: they may wait for a group commit (never for longer than the window).
CHEAP_METHODS = frozenset({"now", "random", "evidence/add"})


class Policy:
    """Decides, per step, whether its commit is urgent, and when a full checkpoint (snapshot) is due."""

    def __init__(self, spec: CheckpointPolicy) -> None:
        self.spec = spec
        self.at_risk_ms = 0.0  # work done since the last checkpoint that a crash would make us replay
        self.last_snapshot = time.monotonic()

    @property
    def window_s(self) -> float:
        return 0.0 if self.spec.policy == "every-step" else self.spec.group_window_ms / 1000

    def urgent(self, method: str, tool_class: str | None, wall_ms: float, tokens: int) -> bool:
        if self.spec.policy == "every-step":
            return True
        if method == "tool/run":
            return tool_class != "read_only" or wall_ms >= self.spec.expensive_step_ms
        if method in CHEAP_METHODS:
            return wall_ms >= self.spec.expensive_step_ms
        return True  # model calls, questions, plan changes, saved state: always before use

    def record(self, wall_ms: float) -> bool:
        """Account one step; True when a snapshot checkpoint is due now."""
        self.at_risk_ms += wall_ms
        if self.spec.policy == "every-step":
            return True
        if self.spec.policy == "interval":
            return (time.monotonic() - self.last_snapshot) * 1000 >= self.spec.interval_ms
        return self.at_risk_ms >= self.spec.snapshot_budget_ms

    def snapshotted(self) -> None:
        self.at_risk_ms = 0.0
        self.last_snapshot = time.monotonic()
