"""The run tool with real processes: exit codes, verification, timeouts that kill the whole process
group, output tails, the environment it sees, and its reconcile verdicts."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from keel.server.tools import TOOLS, ToolContext, ToolError

RUN = TOOLS["run"]


@pytest.fixture
def box(tmp_path: Path) -> ToolContext:
    root = tmp_path / "sandbox"
    (root / "sub").mkdir(parents=True)
    return ToolContext(sandbox=root, timeout_s=20.0, env={"GREETING": "hi"})


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def test_run_reports_exit_code_output_and_cwd(box: ToolContext) -> None:
    result = await RUN.run(box, {"cmd": "echo out; echo err >&2; pwd; exit 3", "cwd": "sub"})
    assert result.ok  # not a verification: a non-zero exit is a result, not a failure
    out = result.output
    assert out["exit_code"] == 3 and out["stderr"] == "err\n" and not out["timed_out"]
    assert out["stdout"] == f"out\n{(box.sandbox / 'sub').resolve()}\n" and out["cwd"] == "sub"
    assert 0 <= out["duration_s"] < 5


async def test_verification_passes_only_on_exit_zero(box: ToolContext) -> None:
    passed = await RUN.run(box, {"cmd": "test 1 -eq 1", "verify": True})
    failed = await RUN.run(box, {"cmd": "test 1 -eq 2", "verify": True})
    assert passed.ok and passed.output["verify"]
    assert not failed.ok and failed.error == "verification failed: exit code 1" and failed.output["exit_code"] == 1


async def test_environment_is_the_contexts_not_the_hosts(box: ToolContext, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEEL_TEST_SECRET_KEY", "sk-must-not-leak")
    result = await RUN.run(box, {"cmd": "env"})
    lines = set(result.output["stdout"].splitlines())
    assert "GREETING=hi" in lines and f"HOME={box.sandbox}" in lines and "PYTHONDONTWRITEBYTECODE=1" in lines
    assert not any("sk-must-not-leak" in line for line in lines)


async def test_timeout_kills_the_whole_process_group(box: ToolContext) -> None:
    pidfile = box.sandbox / "pids"
    cmd = f"sleep 60 & echo $! > {pidfile}; (sleep 60; echo late) & echo $! >> {pidfile}; sleep 60"
    started = time.monotonic()
    result = await RUN.run(box, {"cmd": cmd, "timeout_s": 0.5})
    assert time.monotonic() - started < 30  # not the command's 60 s: its timeout ended it
    assert not result.ok and result.output["timed_out"] and "timed out after 0.5 s" in result.error
    pids = [int(p) for p in pidfile.read_text().split()]
    assert len(pids) == 2
    deadline = time.monotonic() + 60  # a generous deadline: dead children end the wait at once
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not any(alive(p) for p in pids), "a child of the timed-out command survived"


async def test_background_leftovers_are_killed_after_exit(box: ToolContext) -> None:
    result = await RUN.run(box, {"cmd": "sleep 60 > /dev/null 2>&1 & echo $!"})
    pid = int(result.output["stdout"])
    deadline = time.monotonic() + 60  # a generous deadline: dead children end the wait at once
    while alive(pid) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not alive(pid)


async def test_timeout_is_capped_by_the_context(box: ToolContext) -> None:
    short = ToolContext(sandbox=box.sandbox, timeout_s=0.3)
    result = await RUN.run(short, {"cmd": "sleep 30", "timeout_s": 1000})
    assert result.output["timed_out"] and "after 0.3 s" in result.error


async def test_output_tail_is_capped(box: ToolContext) -> None:
    result = await RUN.run(box, {"cmd": "i=0; while [ $i -lt 4000 ]; do echo line-$i; i=$((i+1)); done"})
    out = result.output
    assert len(out["stdout"]) == 16 * 1024 and out["stdout"].endswith("line-3999\n")
    assert out["stdout_dropped_bytes"] == len("".join(f"line-{i}\n" for i in range(4000))) - 16 * 1024


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({}, "missing required argument 'cmd'"),
        ({"cmd": "  "}, "'cmd' is empty"),
        ({"cmd": "ls", "cwd": "../"}, "escapes the sandbox"),
        ({"cmd": "ls", "cwd": "nope"}, "is not a folder"),
        ({"cmd": "ls", "timeout_s": "soon"}, "'timeout_s' must be float"),
    ],
)
async def test_bad_arguments(box: ToolContext, args: dict[str, object], message: str) -> None:
    result = await RUN.run(box, dict(args))
    assert not result.ok and message in result.error


def test_preview_and_reconcile(box: ToolContext) -> None:
    intent = RUN.preview(box, {"cmd": "make", "cwd": "sub/."})
    assert intent == {"cmd": "make", "cwd": "sub", "verify": False, "idempotent": False}
    unknown = RUN.reconcile(box, intent)
    assert unknown.done is None and "'make' may or may not have run" in unknown.reason
    assert RUN.reconcile(box, RUN.preview(box, {"cmd": "pytest", "idempotent": True})).done is False
    with pytest.raises(ToolError, match="escapes"):
        RUN.preview(box, {"cmd": "ls", "cwd": ".."})
