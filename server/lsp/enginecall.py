"""Calls into the engine's control API that open the store by path, run in a short-lived child process.

LMDB forbids opening one environment twice in a process (closing the second copy drops the first's
file locks), and the engine's `start_mission`, `resume` and `answer` open the store themselves. So the
server, which keeps its own store open, runs them here: `python -m keel.server.lsp.enginecall OP JSON`
prints one JSON line `{"ok": result}` or `{"error": {"code", "message"}}`, and the parent rebuilds the
typed error. Hosts the child starts are detached, so the child exits at once. `keel restore` is the CLI
verb, called the same way. Under `keel serve` the child is a fork of the server's host starter (`forker`,
server/hoststarter.py), which has keel loaded; otherwise a new interpreter. Depends on the engine's control module;
never on pygls.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from keel.protocol.errors import ErrorCode, KeelError

TIMEOUT_S = 60.0


class EngineCallError(KeelError):
    """An error the child reported (its code kept), or a child that did not answer."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.STORE) -> None:
        super().__init__(message)
        self.code = code


def call(store_path: Path, op: str, *args: Any) -> Any:
    """Run one control operation in a child; return its result or raise the typed error it reported."""
    cmd = [sys.executable, "-m", "keel.server.lsp.enginecall", op, json.dumps([str(store_path), *args])]
    proc = _run(cmd)
    try:
        reply = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise EngineCallError(f"{op} did not answer (exit {proc.returncode}): {_tail(proc.stderr)}") from None
    if "error" in reply:
        raise EngineCallError(reply["error"]["message"], _code(reply["error"]["code"]))
    return reply["ok"]


def restore(store_path: Path, mission_id: str, point: str, files: bool) -> None:
    """`keel restore ID POINT [--files]`; its exit code and message become the typed error."""
    cmd = [sys.executable, "-m", "keel.server.cli", "restore", mission_id, point, "--store", str(store_path)]
    proc = _run([*cmd, "--files"] if files else cmd)
    if proc.returncode != 0:
        message = _tail(proc.stderr).removeprefix("keel: ") or f"keel restore exited with {proc.returncode}"
        raise EngineCallError(message, _EXIT_CODES.get(proc.returncode, ErrorCode.STORE))


def cli_json(store_path: Path, *args: str) -> Any:
    """`keel VERB ... --json --store STORE` in a child; its JSON output, or the typed error of its exit."""
    proc = _run([sys.executable, "-m", "keel.server.cli", *args, "--json", "--store", str(store_path)])
    if proc.returncode != 0:
        message = _tail(proc.stderr).removeprefix("keel: ") or f"keel {args[0]} exited with {proc.returncode}"
        raise EngineCallError(message, _EXIT_CODES.get(proc.returncode, ErrorCode.STORE))
    try:
        return json.loads(proc.stdout)
    except ValueError:
        raise EngineCallError(f"keel {args[0]} printed no JSON: {_tail(proc.stdout)}") from None


_EXIT_CODES = {
    2: ErrorCode.USAGE,
    5: ErrorCode.CORRUPT_RECORD,
    6: ErrorCode.NOT_FOUND,
    7: ErrorCode.STORE_BUSY,
    8: ErrorCode.STORE_REFUSED,
}


Forker = Callable[[list[str], float], "subprocess.CompletedProcess[str] | None"]
# `keel serve` sets its host starter's `run` here (server/hoststarter.py): a call is a fork of that process, with
# keel loaded, instead of a new interpreter (about 90 ms sooner); None, or a starter that cannot, runs one.
forker: Forker | None = None


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        done = forker(cmd[1:], TIMEOUT_S) if forker is not None else None
        if done is not None:
            return done
        return subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    except subprocess.TimeoutExpired:
        raise EngineCallError(f"{cmd[3]} did not finish within {TIMEOUT_S:.0f} s") from None


def _code(value: int) -> ErrorCode:
    try:
        return ErrorCode(value)
    except ValueError:
        return ErrorCode.STORE


def _tail(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


# -- the child side ------------------------------------------------------------------------------------
def _dispatch(op: str, store_path: Path, args: list[Any]) -> Any:
    from keel.server.engine import control
    from keel.server.hoststart import start_host  # this child has one thread and no store open: it forks hosts

    match op:
        case "start":
            return control.start_mission(store_path, Path(args[0]), detach=True, start=start_host)
        case "resume":
            return control.resume(store_path, args[0], detach=True, start=start_host)
        case "answer":
            return control.answer(store_path, args[0], args[1], source="lsp", resume=True, start=start_host).id
        case _:
            raise EngineCallError(f"unknown engine operation {op!r}", ErrorCode.USAGE)


def main(argv: list[str]) -> int:
    op, raw = argv[0], json.loads(argv[1])
    try:
        result = _dispatch(op, Path(raw[0]), raw[1:])
    except KeelError as exc:
        print(json.dumps({"error": {"code": int(exc.code), "message": exc.message}}))
        return 1
    except Exception as exc:  # reported, not raised: the parent turns it into one clear error
        print(json.dumps({"error": {"code": int(ErrorCode.STORE), "message": f"{op} failed: {exc!r}"}}))
        return 1
    print(json.dumps({"ok": result}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
