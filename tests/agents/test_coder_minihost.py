"""A small, real agent-protocol host for agent tests, and the test that the protocol document's Node.js
example agent works against it.

MiniHost starts an agent subprocess, speaks Content-Length framed JSON-RPC through keel.protocol.framing,
answers tool/run by really running keel.server.tools in the sandbox, answers model/complete from a
test's script, and journals every request by position so that a later start of the same unit is
answered from the journal (with a fingerprint check), as keel's engine does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from keel.protocol import agent as ap
from keel.protocol import rpc
from keel.protocol.framing import frame, read_frame_async
from keel.server.tools import TOOLS, ToolContext

ROOT = Path(__file__).resolve().parents[2]
Model = Callable[[dict[str, Any]], dict[str, Any]]  # model/complete params -> assistant message


class AgentCrashed(Exception):
    pass


class MiniHost:
    def __init__(
        self,
        command: list[str],
        sandbox: Path,
        *,
        goal: str = "",
        model: Model | None = None,
        denied: frozenset[str] = frozenset(),
    ) -> None:
        self.command, self.sandbox, self.goal, self.model, self.denied = command, sandbox, goal, model, denied
        self.journal: list[tuple[str, str, Any]] = []  # (method, fingerprint, result)
        self.executed: list[tuple[str, Any]] = []  # requests run for real, in order
        self.replayed = 0
        self.evidence: list[dict[str, Any]] = []
        self.starts = 0
        self.resumed_at = 0  # where the last start's requests were numbered from (a resuming agent's last save)
        self.tool_ctx = ToolContext(
            sandbox=sandbox, timeout_s=30, env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
        )

    def saved_state(self) -> Any:
        saved = [result["state"] for method, _, result in self.journal if method == "state/save"]
        return saved[-1] if saved else None

    def last_save(self) -> int:
        """The number of the newest `state/save` entry (0: none): where a resuming agent carries on."""
        return max((n for n, (method, _, _) in enumerate(self.journal, 1) if method == "state/save"), default=0)

    async def run_unit(self, unit: dict[str, Any], *, crash_after: int | None = None, within: float = 30) -> Any:
        """Run one unit in a fresh agent process; with crash_after, SIGKILL the agent once that many
        requests have been executed for real in this start, and raise AgentCrashed."""
        self.starts += 1
        proc = await asyncio.create_subprocess_exec(
            *self.command,
            cwd=self.sandbox,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.sandbox)},
        )
        try:
            return await asyncio.wait_for(self._session(proc, unit, crash_after), within)
        finally:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGKILL)
            await proc.wait()

    async def _session(self, proc: asyncio.subprocess.Process, unit: dict[str, Any], crash_after: int | None) -> Any:
        stdin, stdout = proc.stdin, proc.stdout
        assert stdin is not None and stdout is not None

        def send(message: rpc.Message) -> None:
            stdin.write(frame(rpc.encode(message)))

        init = ap.InitializeParams(
            protocol_version=ap.PROTOCOL_VERSION, mission_id="m-test", goal=self.goal, sandbox=str(self.sandbox)
        )
        send(rpc.Request(method="initialize", id=1, params=msgspec.to_builtins(init)))
        seq, real = 0, 0
        while True:
            body = await read_frame_async(stdout)
            if body is None:
                raise AgentCrashed(f"agent exited with {await proc.wait()} before finishing the unit")
            message = rpc.decode(body)
            match message:
                case rpc.Response(id=1, result=hello):
                    # a resuming agent carries on from its last save: its requests are numbered after it
                    seq = self.last_save() if isinstance(hello, dict) and hello.get("resumes") is True else 0
                    self.resumed_at = seq
                    run = {
                        "unit": unit,
                        "attempt": self.starts,
                        "state": self.saved_state(),
                        "replaying": len(self.journal) > seq,
                        "resumed_at": seq,
                    }
                    send(rpc.Request(method="unit/run", id=2, params=run))
                case rpc.Response(id=2, result=result):
                    send(rpc.Notification(method="shutdown"))
                    stdin.close()
                    await asyncio.wait_for(proc.wait(), 5)
                    return result
                case rpc.ErrorResponse(error=error):
                    raise AgentCrashed(f"agent answered with error {error.code}: {error.message}")
                case rpc.Request(method=method, id=msg_id, params=params):
                    seq += 1
                    fp = json.dumps([method, params], sort_keys=True)
                    if seq <= len(self.journal):
                        recorded = self.journal[seq - 1]
                        if recorded[1] != fp:
                            why = f"entry {seq}: journal has {recorded[1][:200]}, got {fp[:200]}"
                            send(rpc.ErrorResponse(id=msg_id, error=rpc.ErrorObject(ap.ERR_NONDETERMINISM, why)))
                            raise AgentCrashed(f"nondeterminism at entry {seq}")
                        self.replayed += 1
                        send(rpc.Response(id=msg_id, result=recorded[2]))
                        continue
                    if crash_after is not None and real >= crash_after:
                        proc.send_signal(signal.SIGKILL)
                        raise AgentCrashed(f"killed before executing request {seq} ({method})")
                    if method == "tool/run" and params["tool"] in self.denied:
                        denial = rpc.ErrorObject(ap.ERR_TOOL_DENIED, f"tool {params['tool']!r} is not allowed")
                        send(rpc.ErrorResponse(id=msg_id, error=denial))
                        seq -= 1  # not journaled: a replay is denied again, at the same position
                        continue
                    result = await self._execute(method, params)
                    real += 1
                    self.journal.append((method, fp, result))
                    self.executed.append((method, params))
                    send(rpc.Response(id=msg_id, result=result))

    async def _execute(self, method: str, params: Any) -> Any:
        if method == "tool/run":
            call = msgspec.convert(params, ap.ToolRunParams)
            return msgspec.to_builtins(await TOOLS[call.tool].run(self.tool_ctx, call.args))
        if method == "model/complete":
            assert self.model is not None, "this test scripted no model answers"
            message = self.model(params)
            return msgspec.to_builtins(
                ap.ModelCompleteResult(message=message, model="scripted-model", provider="test", finish_reason="stop")
            )
        if method == "evidence/add":
            self.evidence.append(params)
            return {}
        if method == "state/save":
            return {"state": params["state"]}
        if method == "now":
            return {"time": 1767225600.0 + len(self.journal)}
        if method == "random":
            return {"value": 0.25}
        raise AssertionError(f"unexpected agent request {method}")


NODE = shutil.which("node")


@pytest.mark.skipif(NODE is None, reason="Node.js is not installed; the protocol example is a Node.js script")
async def test_node_example_agent_runs_and_replays(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("one\ntwo\nthree\n")
    host = MiniHost([str(NODE), str(ROOT / "docs" / "examples" / "line-count-agent.mjs")], tmp_path)
    unit = {"id": "count", "kind": "count", "params": {"path": "a.txt"}}
    with pytest.raises(AgentCrashed, match="killed before executing request 3"):
        await host.run_unit(unit, crash_after=2)  # dies after now + read_file were journaled
    (tmp_path / "a.txt").write_text("changed after the crash\n")
    result = await host.run_unit(unit)
    assert result == {
        "result": {"mission": "m-test", "path": "a.txt", "lines": 3, "started_at": 1767225600.0},
        "summary": "a.txt: 3 lines",
    }  # the file as the journal saw it, not as it is now
    assert host.replayed == 2 and [m for m, _ in host.executed] == ["now", "tool/run", "evidence/add", "state/save"]
    assert host.evidence == [{"kind": "note", "summary": "a.txt has 3 lines", "data": {"path": "a.txt", "lines": 3}}]
    assert host.saved_state() == {"counted": "a.txt"}
