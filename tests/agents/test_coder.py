"""The coder agent as a real subprocess, driven by a test host (test_coder_minihost.MiniHost) that answers
model/complete with scripted OpenAI-shaped assistant messages and tool/run with keel.server.tools."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_coder_minihost import AgentCrashed, MiniHost

from keel.server.tools import TOOLS

CODER = [sys.executable, "-m", "keel.agents.coder"]
BUGGY = "def add(a, b):\n    return a - b\n"
CHECK = "from calc import add\nassert add(2, 3) == 5, add(2, 3)\nprint('ok')\n"
FIX = "--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n"
Step = Callable[[dict[str, Any]], dict[str, Any]]


def calls(*items: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": f"call_{n}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
            for n, (name, args) in enumerate(items)
        ],
    }


def say(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def last_tool_result(params: dict[str, Any]) -> dict[str, Any]:
    message = params["messages"][-1]
    assert message["role"] == "tool", message
    result: dict[str, Any] = json.loads(message["content"])
    return result


class ScriptedModel:
    """Answers model/complete in order; each step sees the request, so it can check what the coder sent."""

    def __init__(self, steps: list[Step]) -> None:
        self.steps: list[Step] = steps
        self.requests: list[dict[str, Any]] = []

    def __call__(self, params: dict[str, Any]) -> dict[str, Any]:
        self.requests.append(params)
        assert len(self.requests) <= len(self.steps), "the coder asked the model more often than scripted"
        return self.steps[len(self.requests) - 1](params)


def fixing_script() -> list[Step]:
    def read(params: dict[str, Any]) -> dict[str, Any]:
        assert params["messages"][0]["role"] == "system" and "Make add() correct" in params["messages"][0]["content"]
        assert [t["name"] for t in params["tools"]] == list(TOOLS)
        return calls(("read_file", {"path": "calc.py"}))

    def fix(params: dict[str, Any]) -> dict[str, Any]:
        assert last_tool_result(params)["output"]["content"] == BUGGY
        return calls(("apply_diff", {"diff": FIX}))

    def verify(params: dict[str, Any]) -> dict[str, Any]:
        assert last_tool_result(params)["ok"]
        return calls(("run", {"cmd": "python check_calc.py", "verify": True}))

    def finish(params: dict[str, Any]) -> dict[str, Any]:
        result = last_tool_result(params)
        assert result["ok"] and result["output"]["stdout"] == "ok\n"
        return say("Fixed add(): it subtracted. check_calc.py passes.")

    return [read, fix, verify, finish]


@pytest.fixture
def sandbox(tmp_path: Path) -> Path:
    (tmp_path / "calc.py").write_text(BUGGY)
    (tmp_path / "check_calc.py").write_text(CHECK)
    return tmp_path


UNIT = {
    "id": "fix-add",
    "kind": "code",
    "title": "Fix add",
    "params": {"task": "Make add() correct.", "verify": "python check_calc.py"},
}


FINISHED = [*(["model/complete", "tool/run", "state/save"] * 4), "evidence/add"]  # an undisturbed run's requests


async def test_coder_reads_fixes_verifies_and_finishes(sandbox: Path) -> None:
    model = ScriptedModel(fixing_script())
    host = MiniHost(CODER, sandbox, goal="Make add() correct", model=model)
    outcome = await host.run_unit(UNIT)
    assert (sandbox / "calc.py").read_text() == BUGGY.replace("a - b", "a + b")
    result = outcome["result"]
    assert result["answer"].startswith("Fixed add()") and result["steps"] == 4 and result["changed"] == ["calc.py"]
    assert [v["ok"] for v in result["verifications"]] == [True, True]  # the model's run and the unit's own check
    assert [m for m, _ in host.executed] == FINISHED
    state = host.saved_state()
    assert state["done"] and state["step"] == 4 and len(state["messages"]) == 2 + 4 + 3  # system, user, 4 + 3 tools
    assert host.evidence[0]["data"] == {"steps": 4, "model": "scripted-model", "changed": ["calc.py"]}


async def test_coder_resumes_after_a_crash_without_spending_the_model_again(sandbox: Path) -> None:
    model = ScriptedModel(fixing_script())
    host = MiniHost(CODER, sandbox, goal="Make add() correct", model=model)
    with pytest.raises(AgentCrashed, match="killed before executing request 6"):
        await host.run_unit(UNIT, crash_after=5)  # the diff is applied; the second state/save never happens
    assert (sandbox / "calc.py").read_text().endswith("a + b\n") and len(model.requests) == 2
    outcome = await host.run_unit(UNIT)
    assert outcome["result"]["steps"] == 4 and len(model.requests) == 4  # two replayed, two new
    # it carried on from its saved conversation (entry 3): only the model call and the diff after it replayed
    assert host.resumed_at == 3 and host.replayed == 2 and host.starts == 2


async def test_coder_saved_as_done_gives_its_answer_on_restart_without_the_model(sandbox: Path) -> None:
    """Killed between the save of its final conversation and its last requests: the restarted coder carries
    on from that save and only reports its answer; no model request is made again."""
    model = ScriptedModel(fixing_script())
    host = MiniHost(CODER, sandbox, goal="Make add() correct", model=model)
    with pytest.raises(AgentCrashed):  # every request of an undisturbed run but its last, the evidence
        await host.run_unit(UNIT, crash_after=len(FINISHED) - 1)
    assert [method for method, _ in host.executed] == FINISHED[:-1] and len(model.requests) == 4
    outcome = await host.run_unit(UNIT)
    assert outcome["result"]["answer"].startswith("Fixed add()") and outcome["result"]["steps"] == 4
    assert len(model.requests) == 4 and host.resumed_at == len(FINISHED) - 1 and host.replayed == 0
    assert [method for method, _ in host.executed] == FINISHED


async def test_coder_reports_bad_calls_to_the_model_and_retries_failed_verification(sandbox: Path) -> None:
    def bad_calls(params: dict[str, Any]) -> dict[str, Any]:
        return {
            "role": "assistant",
            "content": "trying",
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "delete_everything", "arguments": "{}"}},
                {"id": "b", "type": "function", "function": {"name": "read_file", "arguments": "{not json"}},
                {
                    "id": "c",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "/etc/passwd"}'},
                },
                {"id": "d", "type": "function", "function": {"name": "read_file", "arguments": '{"name": "x"}'}},
            ],
        }

    def premature_finish(params: dict[str, Any]) -> dict[str, Any]:
        errors = [json.loads(m["content"])["error"] for m in params["messages"][-4:]]
        assert "unknown tool 'delete_everything'" in errors[0] and "not valid JSON" in errors[1]
        assert "'/etc/passwd' is absolute" in errors[2] and "has no argument(s) ['name']" in errors[3]
        return say("Done (not really).")

    def fix_after_feedback(params: dict[str, Any]) -> dict[str, Any]:
        feedback = params["messages"][-1]
        assert feedback["role"] == "user" and "verification `python check_calc.py` failed" in feedback["content"]
        assert "AssertionError" in feedback["content"]
        return calls(("write_file", {"path": "calc.py", "content": BUGGY.replace("-", "+")}))

    model = ScriptedModel([bad_calls, premature_finish, fix_after_feedback, lambda p: say("Now fixed.")])
    outcome = await MiniHost(CODER, sandbox, model=model).run_unit(UNIT)
    assert outcome["result"]["answer"] == "Now fixed." and outcome["result"]["steps"] == 4
    assert [v["ok"] for v in outcome["result"]["verifications"]] == [False, True]


async def test_coder_stops_at_the_step_limit(sandbox: Path) -> None:
    model = ScriptedModel([lambda p: calls(("list_files", {}))] * 2)
    unit = {"id": "loop", "params": {"max_steps": 2}}
    with pytest.raises(AgentCrashed, match="StepLimitError: unit loop: no final answer after 2 model calls"):
        await MiniHost(CODER, sandbox, model=model).run_unit(unit)


async def test_a_denied_tool_is_reported_to_the_model(sandbox: Path) -> None:
    def after_denial(params: dict[str, Any]) -> dict[str, Any]:
        assert last_tool_result(params) == {"ok": False, "error": "tool 'run' is not allowed"}
        return say("I may not run commands here.")

    model = ScriptedModel([lambda p: calls(("run", {"cmd": "rm -rf /"})), after_denial])
    outcome = await MiniHost(CODER, sandbox, model=model, denied=frozenset({"run"})).run_unit({"id": "u"})
    assert outcome["result"]["answer"] == "I may not run commands here."
