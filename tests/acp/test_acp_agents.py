"""Claude Code, Gemini CLI and Codex as keel agents, each the real npm package, against a scripted model
server on 127.0.0.1: a unit that reads, edits, creates a file and runs the tests completes; SIGKILL of the
agent, of the host, of both, of the unit's worker and of the ACP bridge mid-prompt, then resume: the
mission completes, the files equal an undisturbed run's, no request is paid twice beyond the one in flight,
the test command ran once; a denied permission, and a model that keeps asking for it; a failover
mid-session through the proxy; the agent's environment holds no key.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from acpkit import (
    KEY,
    NEW_CALC,
    RUN_TESTS,
    TEST_CALC,
    ScriptedModel,
    Workspace,
    agent_pids,
    finish,
    kill_host,
    kill_keel_process,
    kill_tree,
    require_agent,
    settle,
    wait_for,
    workspace,
)

from keel.agents.acp.presets import PROXY_ENV

AGENTS = ["claude", "gemini", "codex"]
pytestmark = pytest.mark.timeout(300)


def check_files(ws: Workspace, mission: str) -> None:
    sandbox = ws.sandbox(mission)
    assert (sandbox / "calc.py").read_text() == NEW_CALC
    assert (sandbox / "test_calc.py").read_text() == TEST_CALC
    assert (sandbox / "runs.log").read_text() == "ran\n", "the test command must run exactly once"


def journal(ws: Workspace, mission: str) -> list[dict[str, object]]:
    out = ws.keel("log", mission, "--json")
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def report(agent: str, strike: str, model: ScriptedModel, items: list[dict[str, object]]) -> None:
    """One line per strike (shown with `pytest -s`): what the resume cost against an undisturbed run."""
    titles = [str(i.get("title", "")) for i in items]
    resume = [t.split(": ", 1)[1] for t in titles if t.startswith("acp.resume")]
    print(
        f"\nacp: {agent:<6} {strike:<13}: {len(model.steps())} model requests served {model.steps()}; "
        f"{sum(i['kind'] == 'model' for i in items)} journaled; {'; '.join(r[:70] for r in resume) or 'no resume'}"
    )


@pytest.fixture
def model() -> ScriptedModel:
    server = ScriptedModel().start()
    yield server
    server.stop()


@pytest.mark.parametrize("agent", AGENTS)
def test_unit_reads_edits_creates_and_runs_tests(agent: str, model: ScriptedModel, tmp_path: Path) -> None:
    require_agent(agent)
    seen = tmp_path / "command-env.txt"
    model.run_tests = f"{model.run_tests}; env > {seen}"
    ws = workspace(tmp_path, agent, [model])
    proc = ws.start()
    out = finish(proc)
    assert proc.returncode == 0, out
    mission = ws.mission_id()
    check_files(ws, mission)
    # the test command, run by the agent itself or by keel's run tool, saw no proxy credential
    names = {line.split("=", 1)[0] for line in seen.read_text().splitlines() if "=" in line}
    assert not names & {*PROXY_ENV, "KEEL_STORE"}, sorted(names & {*PROXY_ENV, "KEEL_STORE"})
    assert model.steps()[-5:] == ["read", "edit", "create", "test", "done"], model.steps()
    assert not model.paid_twice()
    items = journal(ws, mission)
    report(agent, "undisturbed", model, items)
    assert any(i["kind"] == "model" for i in items)
    # the agent held only keel's per-unit token; the provider's key went out from the host alone
    assert {
        s.headers.get("x-api-key") or s.headers.get("x-goog-api-key") or s.headers.get("authorization", "")[7:]
        for s in model.served
    } == {KEY}
    assert KEY not in (ws.sandbox(mission) / "runs.log").read_text()


@pytest.mark.parametrize("agent", AGENTS)
@pytest.mark.parametrize("strike", ["worker", "bridge"])
def test_sigkill_mid_prompt_then_resume(agent: str, strike: str, model: ScriptedModel, tmp_path: Path) -> None:
    """The unit's worker process or its ACP bridge is killed while the model's answer stalls mid-stream; the
    host lives and starts it again. (A kill of the agent, the host or both at that moment is the crash
    matrix's model strike: test_acp_matrix.py.)"""
    require_agent(agent)
    ws = workspace(tmp_path, agent, [model])
    model.stall_at("test")  # the answer that would run the tests: its stream hangs half-way
    proc = ws.start()
    wait_for("the model to stall mid-answer", model.stalled.is_set)
    mission = ws.mission_id()
    assert (ws.unit_sandbox(mission) / "test_calc.py").exists(), "the strike must come after the agent's edits"
    assert agent_pids(agent, ws.root), "the agent must be running when it is killed"
    for pid in agent_pids(agent, ws.root):  # the running agent holds keel's proxy token, never the provider's key
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        assert KEY.encode() not in environ and b"KEEL_ACP_TEST_PASS" not in environ
    module = "keel.server.engine.units.subagent" if strike == "worker" else "keel.agents.acp"
    assert len(kill_keel_process(module, ws.root)) == 1, f"exactly one {strike} must be running"
    settle(agent, ws.root)
    model.release()
    out = finish(proc)
    assert ws.state(mission) == "completed", out
    check_files(ws, mission)
    assert model.steps()[-1] == "done"
    assert model.paid_twice() == [], "no request may be paid twice (beyond the one in flight)"
    items = journal(ws, mission)
    report(agent, f"SIGKILL {strike}", model, items)
    kinds = [i["title"] for i in items]
    # the command as an effect the agent asked for (`allowed run: ...`) or as keel's run tool (`run ...`)
    runs = [t for t in kinds if t.startswith(("allowed run", "run ")) and "python3 -m unittest" in t]
    assert len(runs) == 1, repr([t for t in kinds if t.startswith(("allowed", "denied"))])


@pytest.mark.parametrize("agent", AGENTS)
def test_command_in_doubt_after_a_crash_is_never_run_twice(agent: str, model: ScriptedModel, tmp_path: Path) -> None:
    """The host dies while the agent's test command runs (it has already written runs.log): Claude Code runs
    it through keel's run tool, Gemini CLI and Codex themselves after `effect/ask`. Its intent has no
    outcome. On resume the agent makes the same call again: keel takes it for the effect in doubt and asks
    a person, who says it happened ("skip"); the command never runs a second time."""
    require_agent(agent)
    ws = workspace(tmp_path, agent, [model])
    model.run_tests = RUN_TESTS + "; sleep 60"
    proc = ws.start()
    mission = ""

    def ran() -> bool:
        nonlocal mission
        mission = mission or (ws.mission_id() if ws.keel("missions", "--json").stdout.strip() != "[]" else "")
        return bool(mission) and (ws.unit_sandbox(mission) / "runs.log").exists()

    wait_for("the test command to have run (runs.log written)", ran)
    kill_host(proc)
    settle(agent, ws.root)
    runs = [i for i in journal(ws, mission) if i["kind"] == "tool" and "python3 -m unittest" in str(i["title"])]
    assert runs[-1]["effect"] == "intent only", "the strike must come while the command runs"
    resumed = ws.keel("resume", mission)
    asked = ws.state(mission) == "waiting_input"
    if asked:
        question = json.loads(ws.keel("status", mission, "--json").stdout)["mission"]["question"]
        assert question["kind"] == "uncertain-effect" and "python3 -m unittest" in question["text"], question
        answered = ws.keel("answer", mission, "skip")  # the answer starts a host for the mission
        assert answered.returncode == 0, answered.stderr
        wait_for("the mission to complete after the answer", lambda: ws.state(mission) == "completed")
    # Codex's loaded session holds an "aborted" result for the interrupted call, so its model need not make
    # it again; Claude Code's and Gemini CLI's histories lack it, and their models make the same call
    assert asked or agent == "codex", f"{agent} must have made the call again: " + resumed.stdout + resumed.stderr
    assert ws.state(mission) == "completed", resumed.stdout + resumed.stderr
    check_files(ws, mission)  # runs.log holds one "ran": the command ran once
    assert model.steps()[-1] == "done"


def test_an_agent_unit_a_lost_worker_held_is_asked_about_never_run_again_silently(
    model: ScriptedModel, tmp_path: Path
) -> None:
    """`workers = true`: a `keel worker` runs Claude Code's unit and is SIGKILLed with all it started, after
    the agent's edits. An outside agent changes its sandbox between entries, so the store holds no snapshot
    to make that sandbox again elsewhere: when the worker's lease lapses the host does not offer the unit
    again (a worker could not start it) but treats it as a lost sandbox with effects and asks. The person
    says "rerun": the unit runs again from scratch on another worker, and the files equal an undisturbed
    run's (the test command, never reached before the strike, ran once)."""
    require_agent("claude")
    ws = workspace(tmp_path, "claude", [model], permissions="workers = true\n")
    ws.env["KEEL_LEASE_TTL_S"] = "2"
    model.stall_at("test")
    host = ws.start()
    wait_for("the mission's store", lambda: ws.keel("missions", "--json").stdout.strip() not in ("", "[]"))
    first, second = ws.worker(), None
    try:
        wait_for("the model to stall mid-answer", model.stalled.is_set)
        mission = ws.mission_id()
        units = json.loads(ws.keel("status", mission, "--json").stdout)["subagents"]
        worked = [(u["unit"], bool((u.get("offer") or {}).get("worker"))) for u in units]
        assert worked == [("u1", True)], units  # a worker runs it
        edits = [i for i in journal(ws, mission) if i["kind"] == "tool" and i.get("effect") == "done"]
        assert edits, "the strike must come after the agent's edits"
        assert kill_tree([first.pid])
        first.wait(timeout=10)
        model.release()
        out = finish(host)
        assert host.returncode == 3, out
        question = json.loads(ws.keel("status", mission, "--json").stdout)["mission"]["question"]
        assert question["kind"] == "reexecute" and question["unit"] == "u1", question
        assert "no snapshot" in question["text"] and question["choices"] == ["rerun", "fail"], question
        second = ws.worker()
        answered = ws.keel("answer", mission, "rerun")
        assert answered.returncode == 0, answered.stdout + answered.stderr
        wait_for("the mission to complete after the answer", lambda: ws.state(mission) == "completed")
    finally:
        for proc in (p for p in (host, first, second) if p is not None):
            kill_tree([proc.pid])
            print(proc.args, proc.communicate(timeout=10)[0])
    check_files(ws, mission)
    reexecuted = [i for i in journal(ws, mission) if "executed again from scratch" in str(i.get("title", ""))]
    assert reexecuted or "rerun" in ws.keel("log", mission).stdout


@pytest.mark.parametrize("agent", AGENTS)
def test_denied_permission_keeps_the_effect_from_happening(agent: str, model: ScriptedModel, tmp_path: Path) -> None:
    require_agent(agent)
    ws = workspace(tmp_path, agent, [model], permissions='[permissions]\ntools = ["read_file", "write_file"]\n')
    out = finish(ws.start())
    mission = ws.mission_id()
    assert not (ws.sandbox(mission) / "runs.log").exists(), out
    titles = [i["title"] for i in journal(ws, mission)]
    if agent == "claude":  # keel offers Claude Code only the tools the mission allows: never run, apply_diff
        offered = {t for s in model.served for t in s.tools if t.startswith("mcp__keel__")}
        assert offered == {"mcp__keel__write_file"}, offered
        return
    # an effect the agent asked for (`denied run: ...`)
    assert any(t.startswith("denied run") for t in titles), titles


@pytest.mark.parametrize("agent", ["gemini", "codex"])
def test_a_model_that_keeps_asking_for_a_refused_command_fails_the_unit_saying_what_keel_refused(
    agent: str, model: ScriptedModel, tmp_path: Path
) -> None:
    """The mission's permissions refuse commands and the model asks for one again and again, whatever it is
    told: the agent gives up (Gemini CLI at its own limit, Codex when keel stops telling it) and the unit's
    failure names the command keel refused and why, never a bare stop reason."""
    require_agent(agent)
    model.retry_cut = 1000
    ws = workspace(tmp_path, agent, [model], permissions='[permissions]\ntools = ["read_file", "write_file"]\n')
    out = finish(ws.start())
    mission = ws.mission_id()
    record = json.loads(ws.keel("status", mission, "--json").stdout)["mission"]
    assert record["state"] == "failed", (record, out)
    assert (
        "keel refused" in record["error"] and "'run' is not allowed by this mission's permissions" in record["error"]
    ), record["error"]


@pytest.mark.parametrize("agent", AGENTS)
def test_provider_fails_over_mid_session(agent: str, tmp_path: Path) -> None:
    require_agent(agent)
    first, second = ScriptedModel().start(), ScriptedModel().start()
    try:
        ws = workspace(tmp_path, agent, [first, second])
        first.stall_at("create")  # the first provider breaks mid-session: stalls, then answers 529s
        proc = ws.start()
        wait_for("the first provider to reach the third step", first.stalled.is_set)
        first.fail_next(50, 529)
        first.release()
        out = finish(proc)
        assert proc.returncode == 0, out
        mission = ws.mission_id()
        check_files(ws, mission)
        assert "create" in second.steps() and "read" in first.steps()
        items = journal(ws, mission)
        assert any("failover" in str(i.get("title", "")) for i in items), [i["title"] for i in items]
    finally:
        first.stop()
        second.stop()


def test_a_unit_that_spends_its_budget_pauses_the_mission_naming_it(model: ScriptedModel, tmp_path: Path) -> None:
    """`[budget] model_requests = 2`: the third model request is not made; the mission pauses (reason
    budget) with a message that names the limit and the unit."""
    require_agent("claude")
    ws = workspace(tmp_path, "claude", [model], permissions="[budget]\nmodel_requests = 2\n")
    out = finish(ws.start())
    mission = ws.mission_id()
    record = json.loads(ws.keel("status", mission, "--json").stdout)["mission"]
    assert (record["state"], record.get("pause_reason")) == ("paused", "budget"), out
    assert "budget.model_requests = 2" in record["error"] and "unit u1" in record["error"], record
    assert len([s for s in model.served if s.step != "side"]) == 2, model.steps()
