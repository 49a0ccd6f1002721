"""No effect of Claude Code, Gemini CLI or Codex is repeated silently: one test per way it was seen to happen.

The test command appends a line to a side log OUTSIDE the workspace (no restore can hide a repeat) and then
blocks while a HOLD file exists, so each strike lands while the command runs: the test waits for the line,
kills, removes HOLD, and counts the lines at the end. A repeat of the command is answered from the journal
(it completed) or asked about (it was cut: a person answers "skip"); never run a second time.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from acpkit import (
    NEW_CALC,
    TEST_CALC,
    ScriptedModel,
    Side,
    Workspace,
    answer_truthfully,
    finish,
    kill_agent,
    kill_host,
    kill_keel_process,
    require_agent,
    settle,
    wait_for,
    workspace,
)

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def model() -> ScriptedModel:
    server = ScriptedModel().start()
    yield server
    server.stop()


def _start(tmp: Path, agent: str, model: ScriptedModel) -> tuple[Workspace, Side]:
    require_agent(agent)
    side = Side(tmp)
    side.hold.touch()
    model.run_tests = side.command()
    return workspace(tmp, agent, [model]), side


def _check(ws: Workspace, mission: str, side: Side) -> None:
    assert ws.state(mission) == "completed", ws.keel("log", mission).stdout[-3000:]
    sandbox = ws.sandbox(mission)
    assert (sandbox / "calc.py").read_text() == NEW_CALC
    assert (sandbox / "test_calc.py").read_text() == TEST_CALC
    assert side.lines() == 1, f"the test command ran {side.lines()} times"


def test_claude_code_killed_alone_while_keel_runs_its_command_gets_the_recorded_result(
    model: ScriptedModel, tmp_path: Path
) -> None:
    """Claude Code's `run` is keel's tool: the host runs the command, which finishes after Claude Code is
    killed. The restarted Claude Code's session may lack the call, and its model calls `run` again: keel
    answers it from the journal, and nothing runs."""
    ws, side = _start(tmp_path, "claude", model)
    proc = ws.start()
    side.wait_running()
    assert kill_agent("claude", ws.root), "the strike must find Claude Code running"
    side.hold.unlink()
    out = finish(proc)
    mission = ws.mission_id()
    answer_truthfully(ws, mission, side)
    _check(ws, mission, side)
    assert "restart" in ws.keel("log", mission).stdout or out


def test_gemini_killed_alone_while_its_command_runs_is_asked_never_run_again(
    model: ScriptedModel, tmp_path: Path
) -> None:
    """Gemini CLI runs the command itself; killed alone, it is started again inside the same unit run and
    makes the identical call (another tool call id): keel asks, it does not run it."""
    ws, side = _start(tmp_path, "gemini", model)
    proc = ws.start()
    side.wait_running()
    assert kill_agent("gemini", ws.root), "the strike must find Gemini CLI running"
    side.hold.unlink()
    finish(proc)
    mission = ws.mission_id()
    assert answer_truthfully(ws, mission, side) >= 1, "the repeated command must be asked about"
    _check(ws, mission, side)


@pytest.mark.parametrize("strike", ["agent", "host"])
def test_codex_crash_while_its_command_runs_is_never_run_again_silently(
    strike: str, model: ScriptedModel, tmp_path: Path
) -> None:
    """Codex's requests carry a call id, a turn id and a start time that differ on every try: the same
    command is still the same effect. Its model makes the cut call again: keel asks, and a person says it
    happened (skip). The model makes the call again twice more, as models do with a result that says
    "aborted": keel answers each with the person's word, and Codex goes on to finish the task (it offers
    only an aborting "no": the bridge tells it the answer in its next turn)."""
    ws, side = _start(tmp_path, "codex", model)
    proc = ws.start()
    side.wait_running()
    if strike == "host":
        kill_host(proc)
        settle("codex", ws.root)
        side.hold.unlink()
        mission = ws.mission_id()
        ws.keel("resume", mission)
    else:
        assert kill_agent("codex", ws.root), "the strike must find Codex running"
        side.hold.unlink()
        finish(proc)
        mission = ws.mission_id()
    answer_truthfully(ws, mission, side)
    _check(ws, mission, side)


@pytest.mark.parametrize("strike", ["host", "worker"])
def test_codex_commands_detached_child_is_gone_before_the_question(
    strike: str, model: ScriptedModel, tmp_path: Path
) -> None:
    """Codex's command makes its effect in a detached process (out of its shell's group and session) once
    HOLD is gone. The host, or the unit's worker, is killed while it waits; the model makes the cut call
    again (after `keel resume`, or in the worker the host starts again) and keel asks. The truth when asked
    is "not made" (rerun); HOLD goes only then, and no process of the struck run is left to make the effect
    a second time."""
    ws, side = _start(tmp_path, "codex", model)
    model.run_tests = side.detached()
    model.retry_cut = 2  # the aborted call, and the one keel stopped to ask about: the model makes it again
    proc = ws.start()
    wait_for("the detached process to wait for HOLD", side.detached_running)
    mission = ws.mission_id()
    if strike == "host":
        kill_host(proc)
        settle("codex", ws.root)
        ws.keel("resume", mission)
    else:
        assert kill_keel_process("keel.server.engine.units.subagent", ws.root), "the strike must find the worker"
    assert answer_truthfully(ws, mission, side) == 1, "the cut command must be asked about"
    if proc.poll() is None:
        finish(proc)
    wait_for("no detached process of the command", lambda: not side.detached_running(), timeout=30)
    _check(ws, mission, side)


def test_after_skip_a_retry_of_the_command_is_not_run_and_the_agent_is_told_why(
    model: ScriptedModel, tmp_path: Path
) -> None:
    """The host dies while Gemini CLI's command runs; on resume the repeat is asked about and a person
    answers "skip". The model, heedless of keel's journal note, tries the command again, twice: neither
    runs, and the person's reason reaches the model."""
    ws, side = _start(tmp_path, "gemini", model)
    model.reads_note = False
    proc = ws.start()
    side.wait_running()
    kill_host(proc)
    settle("gemini", ws.root)
    side.hold.unlink()
    mission = ws.mission_id()
    ws.keel("resume", mission)
    assert answer_truthfully(ws, mission, side) == 1, "asked once: the answer holds for every retry"
    _check(ws, mission, side)
    assert any("a person said" in s.fingerprint for s in model.served), "the reason must reach the model"


@pytest.mark.parametrize("agent", ["codex", "gemini"])
def test_the_same_command_asked_twice_in_one_turn_is_answered_from_the_journal(
    agent: str, model: ScriptedModel, tmp_path: Path
) -> None:
    """The model asks for the test command again right after it ran, in the same turn: keel refuses the
    repeat with the recorded result (nothing runs), and the agent goes on to finish the task."""
    ws, side = _start(tmp_path, agent, model)
    side.hold.unlink()
    model.twice = True
    out = finish(ws.start())
    mission = ws.mission_id()
    _check(ws, mission, side)
    assert model.steps().count("test") == 2, (model.steps(), out)


def test_gemini_after_rerun_pays_no_request_twice(model: ScriptedModel, tmp_path: Path) -> None:
    """The host dies with the test command's intent durable and the command not started (fault point
    INTENT_RUN). Gemini CLI starts a new session on every run: the resume's session asks the same requests
    as the first, and after a person answers "rerun" (truthfully: it never ran) the next session asks them
    again. Each request already paid for in this unit, in any session, is answered from the journal."""
    ws, side = _start(tmp_path, "gemini", model)
    side.hold.unlink()
    held = tmp_path / "intent.held"
    proc = ws.start(env={"KEEL_FAULT_INTENT_RUN": f"{held}:hold"})
    wait_for("the command's intent to be durable (the host held)", held.exists)
    kill_host(proc)
    held.unlink()
    settle("gemini", ws.root)
    assert side.lines() == 0, "the strike must come before the command ran"
    mission = ws.mission_id()
    ws.keel("resume", mission)
    assert answer_truthfully(ws, mission, side) >= 1, "the command in doubt must be asked about"
    _check(ws, mission, side)
    assert model.paid_twice() == [], f"{len(model.paid_twice())} requests were paid twice"
