"""The crash matrix with the real agents: Claude Code, Gemini CLI and Codex by a strike while a model request
is in flight, while the test command runs, or just after an edit by SIGKILL of the agent, the host, or both.

Each strike lands on a condition, asserted: the model server holds the answer that would run the tests (a
stalled stream), the command has written its line to a side log OUTSIDE the workspace and blocks on a HOLD
file, or the agent's edit of calc.py is in the unit's sandbox. Then the mission goes on (the bridge starts
a killed agent again; a killed host is resumed), and every question about an effect in doubt is answered
as the truth is ("skip" when it happened, "rerun" when not). Each case checks the product: the command's
side effect happened exactly once, the files equal an undisturbed run's, and no model request was paid
twice (request bodies compared with ids, uuids and timestamps masked: protocol.modelwire.normalise).

The default run covers every agent by target for the command and model strikes (the model strike is also
the SIGKILL of the agent, the host or both mid-prompt) and the edit strike once per agent; the other six edit
cases run with `KEEL_ACP_MATRIX=all`. `KEEL_ACP_CHAOS_ITERATIONS=N` runs N random strikes and prints
a summary line: strikes by kind, effects checked, duplicates (must be 0), model requests sent again, and
seconds of agent work redone.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from acpkit import (
    NEW_CALC,
    TEST_CALC,
    ScriptedModel,
    Side,
    answer_truthfully,
    finish,
    kill_agent,
    kill_host,
    require_agent,
    settle,
    wait_for,
    workspace,
)

AGENTS = ("claude", "gemini", "codex")
KINDS = ("model", "command", "edit")
TARGETS = ("agent", "host", "both")
DEFAULT = {("claude", "model", "agent"), ("gemini", "model", "host"), ("codex", "model", "both")} | {
    ("claude", "edit", "host"),
    ("gemini", "edit", "both"),
    ("codex", "edit", "agent"),
}


@dataclass
class Outcome:
    agent: str
    kind: str
    target: str
    asked: int
    side_effects: int
    paid_twice: int
    sent_again: int
    redone_s: float
    state: str = "completed"
    error: str = ""  # the mission's error when it did not complete

    @property
    def failed_by_refusal(self) -> bool:
        """The mission failed on an effect keel refused (a repeat, a skip) instead of going on."""
        return self.state == "failed" and ("keel refused" in self.error or "'cancelled'" in self.error)


def strike(tmp: Path, agent: str, kind: str, target: str, twice: bool = False) -> Outcome:
    """One mission struck once; returns what the strike cost after checking the product. With `twice`,
    the model asks for the test command a second time right after its first result."""
    require_agent(agent)
    model = ScriptedModel().start()
    model.twice = twice
    try:
        return _strike(tmp, model, agent, kind, target)
    finally:
        model.stop()


def _strike(tmp: Path, model: ScriptedModel, agent: str, kind: str, target: str) -> Outcome:
    side = Side(tmp)
    model.run_tests = side.command()
    if kind == "command":
        side.hold.touch()
    if kind == "model":
        model.stall_at("test")  # the answer that would run the tests is in flight
    ws = workspace(tmp, agent, [model])
    proc = ws.start()
    mission = ""
    try:
        wait_for("the mission's store", lambda: ws.keel("missions", "--json").stdout.strip() not in ("", "[]"))
        mission = ws.mission_id()
        calc = ws.unit_sandbox(mission) / "calc.py"
        if kind == "model":
            wait_for("the model's answer to stall in flight", model.stalled.is_set)
        elif kind == "command":
            side.wait_running()
        else:
            wait_for("the agent's edit of calc.py", lambda: calc.exists() and calc.read_text() == NEW_CALC)
        struck_at = time.time()
        if target in ("agent", "both"):
            assert kill_agent(agent, ws.root), f"the strike must find {agent} running"
        if target in ("host", "both"):
            kill_host(proc)
        if kind == "edit":
            assert calc.read_text() == NEW_CALC, "the strike must come after the edit"
        side.hold.unlink(missing_ok=True)
        model.release()
        if target == "agent":  # the host goes on: the bridge starts the agent again inside the unit
            finish(proc)
        else:
            settle(agent, ws.root)
            ws.keel("resume", mission)
        asked = answer_truthfully(ws, mission, side)
    finally:
        if proc.poll() is None:
            kill_host(proc)
    record = json.loads(ws.keel("status", mission, "--json").stdout)["mission"]
    sent_again, redone = _redone(model, struck_at)
    outcome = Outcome(agent, kind, target, asked, side.lines(), len(model.paid_twice()), sent_again, redone)
    outcome.state, outcome.error = record["state"], str(record.get("error") or "")
    if record["state"] != "completed":
        raise Struck(outcome, f"{record}\n{ws.keel('log', mission).stdout[-3000:]}")
    sandbox = ws.sandbox(mission)
    assert (sandbox / "calc.py").read_text() == NEW_CALC
    assert (sandbox / "test_calc.py").read_text() == TEST_CALC
    left = sorted(str(p.relative_to(sandbox)) for p in sandbox.rglob("*") if p.is_file() and not _cache(p))
    assert left == ["calc.py", "task.mission.toml", "test_calc.py"], left  # the files of an undisturbed run
    if side.lines() != 1 or model.paid_twice():
        raise Struck(outcome, f"the test command ran {side.lines()} times; {outcome.paid_twice} requests paid twice")
    return outcome


class Struck(AssertionError):
    """A struck mission whose product is wrong, with what the strike cost."""

    def __init__(self, outcome: Outcome, why: str) -> None:
        super().__init__(why)
        self.outcome = outcome


def _cache(path: Path) -> bool:
    return "__pycache__" in path.parts or path.suffix == ".pyc"


def _redone(model: ScriptedModel, struck_at: float) -> tuple[int, float]:
    """Model requests for a step already answered before the strike, and the seconds of agent work that
    step had taken (from its answer to the next request), summed."""
    served = [s for s in model.served if s.completed and s.step not in ("side", "failed")]
    again, seconds = 0, 0.0
    for index, item in enumerate(served):
        before = [s for s in served[:index] if s.step == item.step and s.at < struck_at]
        if item.at >= struck_at and before:
            again += 1
            first = served.index(before[0])
            following = served[first + 1].at if first + 1 < len(served) else item.at
            seconds += max(0.0, min(following, struck_at) - before[0].at)
    return again, seconds


ALL = os.environ.get("KEEL_ACP_MATRIX") == "all"
EVERY_TARGET = ("command", "model")  # an edit is struck once per agent unless the whole matrix is asked for


def _marks(agent: str, kind: str, target: str) -> tuple[pytest.MarkDecorator, ...]:
    if kind in EVERY_TARGET or (agent, kind, target) in DEFAULT:
        return ()
    why = "an edit strike on one target per agent runs by default; KEEL_ACP_MATRIX=all runs every target"
    return (pytest.mark.slow, pytest.mark.skipif(not ALL, reason=why))


CASES = [pytest.param(a, k, t, marks=_marks(a, k, t)) for a in AGENTS for k in KINDS for t in TARGETS]


@pytest.mark.timeout(400)
@pytest.mark.parametrize(("agent", "kind", "target"), CASES)
def test_strike(agent: str, kind: str, target: str, tmp_path: Path) -> None:
    outcome = strike(tmp_path, agent, kind, target)
    print(f"\nacp matrix: {agent:<6} {kind:<7} {target:<5}: {outcome}")


@pytest.mark.timeout(0)
def test_random_strikes(tmp_path: Path) -> None:
    iterations = int(os.environ.get("KEEL_ACP_CHAOS_ITERATIONS", "0"))
    if iterations <= 0:
        pytest.skip("the longer random run: set KEEL_ACP_CHAOS_ITERATIONS=N")
    seed = int(os.environ.get("KEEL_ACP_CHAOS_SEED", str(int(time.time()))))
    rng = random.Random(seed)
    outcomes: list[Outcome] = []
    failures: list[str] = []
    for n in range(iterations):
        agent, kind, target = rng.choice(AGENTS), rng.choice(KINDS), rng.choice(TARGETS)
        twice = rng.random() < 0.5  # the model asks for the test command twice in one turn
        folder = tmp_path / f"s{n}"
        folder.mkdir()
        try:
            outcomes.append(strike(folder, agent, kind, target, twice))
        except Struck as exc:
            outcomes.append(exc.outcome)
            failures.append(f"{agent} {kind} {target} twice={twice}: {str(exc)[:300]}")
        except AssertionError as exc:
            failures.append(f"{agent} {kind} {target} twice={twice}: {str(exc)[:300]}")
    kinds = Counter(f"{o.kind}/{o.target}" for o in outcomes)
    duplicates = sum(max(0, o.side_effects - 1) for o in outcomes)
    paid_twice = sum(o.paid_twice for o in outcomes)
    by_refusal = sum(o.failed_by_refusal for o in outcomes)
    print(
        f"\nacp chaos (seed {seed}): {iterations} strikes "
        f"({', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))}); by agent "
        f"{dict(Counter(o.agent for o in outcomes))}; effects checked {3 * len(outcomes)}; "
        f"duplicates {duplicates}; asked {sum(o.asked for o in outcomes)}; "
        f"model requests paid twice {paid_twice}; missions failed by a refusal {by_refusal}; "
        f"model requests sent again {sum(o.sent_again for o in outcomes)}; "
        f"seconds of agent work redone {sum(o.redone_s for o in outcomes):.1f}; failures {len(failures)}"
    )
    assert (duplicates, paid_twice, by_refusal) == (0, 0, 0), "\n".join(failures)
    assert not failures, "\n".join(failures)
