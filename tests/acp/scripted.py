"""A scripted model server on 127.0.0.1 for keel's ACP tests: one small coding task, in three wire formats.

Serves Anthropic Messages (`/v1/messages`, Claude Code), OpenAI Responses (`/v1/responses`, Codex) and
Gemini (`/v1beta/models/<m>:streamGenerateContent`, Gemini CLI), streamed as each provider streams. The
script is decided from the conversation in each request, never from the order of requests, so a resumed
session (after a SIGKILL, `session/load` and a "continue" prompt) gets the step its history calls for:

    read calc.py -> write calc.py (adds mul) -> write test_calc.py -> run the tests -> answer "done"

A step counts as done when the history holds the result of the tool call the server made for it (its call
id names the step). As a real model does, it makes a call again whose result says the call was cut or not
made (aborted, cancelled, interrupted, refused, denied): up to `retry_cut` such results (2 by default) per
step. With `twice`, it asks for the test command a second time right after its first result (a model that
asks for the same thing twice). It reads keel's journal note in its prompt as a model does: a step its
conversation holds no result for, whose effect the note says completed (or a person said happened), is not
made again (unless `reads_note` is off); a result in its own history that says "interrupted" weighs more.
Every request is recorded with a normalised fingerprint (keel's own protocol.modelwire.normalise), so a
test can count requests served twice. Faults: `stall_at(step)` streams the start of that step's answer and
then hangs (until `release()`), `fail_next(n, status)` answers the next
n requests with an HTTP error.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from keel.protocol.modelwire import normalise

CALC = "def add(a, b):\n    return a + b\n"
NEW_CALC = CALC + "\n\ndef mul(a, b):\n    return a * b\n"
TEST_CALC = (
    "import unittest\n\nfrom calc import add, mul\n\n\n"
    "class CalcTest(unittest.TestCase):\n"
    "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n"
    "    def test_mul(self):\n        self.assertEqual(mul(2, 3), 6)\n\n\n"
    'if __name__ == "__main__":\n    unittest.main()\n'
)
RUN_TESTS = "python3 -m unittest -q test_calc 2>&1 | tail -n 1; echo ran >> runs.log"
STEPS = ("read", "edit", "create", "test", "done")
FINAL = "done: mul added to calc.py, tests pass"


@dataclass
class Served:
    api: str
    step: str
    fingerprint: str
    at: float
    completed: bool = False
    headers: dict[str, str] = field(default_factory=dict)
    tools: list[str] = field(default_factory=list)  # the tools the agent offered the model


class ScriptedModel:
    def __init__(self) -> None:
        self.served: list[Served] = []
        self._lock = threading.Lock()
        self._stall: str | None = None
        self._released = threading.Event()
        self.stalled = threading.Event()
        self._failures: list[int] = []
        self.run_tests = RUN_TESTS  # the test command the script runs (a test may make it slow)
        self.retry_cut = 2  # how many cut or refused results of a step the model answers by calling again
        self.twice = False  # the test command is asked for once more after its first result
        self.reads_note = True  # keel's journal note in the prompt is heeded
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> ScriptedModel:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self._released.set()
        self._server.shutdown()
        self._server.server_close()

    def stall_at(self, step: str) -> None:
        self._stall, self.stalled = step, threading.Event()
        self._released.clear()

    def release(self) -> None:
        self._stall = None
        self._released.set()

    def fail_next(self, n: int, status: int = 529) -> None:
        self._failures.extend([status] * n)

    def steps(self) -> list[str]:
        return [s.step for s in self.served if s.completed]

    def paid_twice(self) -> list[str]:
        """Requests answered in full more than once (the same normalised body), side requests included (Gemini
        CLI's routing and next-speaker checks, Claude Code's titles): each is paid for."""
        counts = Counter(s.fingerprint for s in self.served if s.completed)
        return [fp for fp, n in counts.items() if n > 1]

    # -- the script ---------------------------------------------------------------------------------
    def next_step(self, api: str, body: dict[str, Any]) -> str:
        results = _step_results(api, body)
        told = _journal_done(body) if self.reads_note else set()

        def done(step: str) -> bool:
            texts = results.get(step, [])
            cut = sum(bool(_CUT.search(t)) for t in texts)
            if step in told and not texts:  # its own history, when it has one, is what the model goes by
                return True
            if self.twice and step == "test" and len(texts) == 1 and not cut:
                return False  # asked for again, as if the first result were overlooked
            return len(texts) > cut or cut > self.retry_cut

        return next((s for s in STEPS if not done(s)), "done")

    def call(self, step: str, tools: list[str]) -> tuple[str, dict[str, Any]]:
        """The tool call for a step, in the tool vocabulary the agent offered."""
        calc, test = "calc.py", "test_calc.py"  # relative: every agent resolves them in its working folder
        if "mcp__keel__write_file" in tools:  # Claude Code with keel's tools in place of Edit, Write and Bash
            return {
                "read": ("Read", {"file_path": calc}),
                "edit": ("mcp__keel__write_file", {"path": calc, "content": NEW_CALC}),
                "create": ("mcp__keel__write_file", {"path": test, "content": TEST_CALC}),
                "test": ("mcp__keel__run", {"cmd": self.run_tests}),
            }[step]
        if "Write" in tools:  # Claude Code
            return {
                "read": ("Read", {"file_path": calc}),
                "edit": ("Write", {"file_path": calc, "content": NEW_CALC}),
                "create": ("Write", {"file_path": test, "content": TEST_CALC}),
                "test": ("Bash", {"command": self.run_tests, "description": "run the tests"}),
            }[step]
        if "write_file" in tools:  # Gemini CLI
            return {
                "read": ("read_file", {"file_path": calc, "absolute_path": calc}),
                "edit": ("write_file", {"file_path": calc, "content": NEW_CALC}),
                "create": ("write_file", {"file_path": test, "content": TEST_CALC}),
                "test": ("run_shell_command", {"command": self.run_tests, "description": "run the tests"}),
            }[step]
        shell = {  # Codex: everything through exec_command
            "read": "cat calc.py",
            "edit": f"cat > calc.py <<'EOF'\n{NEW_CALC}EOF",
            "create": f"cat > test_calc.py <<'EOF'\n{TEST_CALC}EOF",
            "test": self.run_tests,
        }[step]
        return "exec_command", {"cmd": shell}

    def record(self, api: str, step: str, body: dict[str, Any], headers: dict[str, str]) -> Served:
        fp = json.dumps(normalise(body), sort_keys=True)
        served = Served(api, step, fp, time.time(), headers=headers)
        with self._lock:
            self.served.append(served)
        return served

    def should_stall(self, step: str) -> bool:
        return self._stall == step

    def wait_released(self) -> None:
        self.stalled.set()
        self._released.wait(timeout=120)

    def take_failure(self) -> int | None:
        with self._lock:
            return self._failures.pop(0) if self._failures else None


# what a tool result says when the call was cut or not made: keel's refusals ("keel did not make this effect
# again", "a person said ..."), Codex's "aborted by user", Gemini CLI's cancellations
_CUT = re.compile(r"abort|cancel|interrupt|refus|denied|rejected|did not make|a person said", re.IGNORECASE)


def _step_results(api: str, body: dict[str, Any]) -> dict[str, list[str]]:
    """Each step's tool results in the history, as text (call ids are `<prefix>_<step>_<nonce>`)."""
    found: list[tuple[str, Any]] = []
    if api == "anthropic":
        for message in body.get("messages") or []:
            for block in message.get("content") or [] if isinstance(message.get("content"), list) else []:
                if block.get("type") == "tool_result":
                    found.append((str(block.get("tool_use_id", "")), block.get("content")))
    elif api == "responses":
        found = [
            (str(i.get("call_id", "")), i.get("output"))
            for i in body.get("input") or []
            if i.get("type") == "function_call_output"
        ]
    else:
        for content in body.get("contents") or []:
            for part in content.get("parts") or []:
                response = part.get("functionResponse")
                if response:
                    found.append((str(response.get("id", "")), response.get("response")))
    results: dict[str, list[str]] = {}
    for call_id, result in found:
        for step in (p for p in call_id.split("_") if p in STEPS):
            results.setdefault(step, []).append(json.dumps(result))
    return results


def _journal_done(body: Any) -> set[str]:
    """The steps whose effect keel's journal note in the prompt says completed or a person said happened
    (each note line names the effect by its start: the edit's text or the command)."""
    done: set[str] = set()
    for text in _strings(body):
        if "keel's journal" not in text:
            continue
        for line in text.splitlines():
            if "recorded outcome: completed" not in line and "A person said it had already happened" not in line:
                continue
            if "import unittest" in line:
                done.add("create")
            elif "def mul" in line:
                done.add("edit")
            elif "effects.log" in line or "python3 -m unittest" in line:
                done.add("test")
    return done


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    return [s for item in value for s in _strings(item)] if isinstance(value, list) else []


def _tool_names(api: str, body: dict[str, Any]) -> list[str]:
    tools = body.get("tools") or []
    if api == "gemini":
        return [str(d.get("name")) for t in tools for d in t.get("functionDeclarations") or []]
    return [str(t.get("name")) for t in tools if isinstance(t, dict)]


# -- wire formats ---------------------------------------------------------------------------------------
def _anthropic(step: str, call: tuple[str, dict[str, Any]] | None, model: str) -> list[tuple[str, Any]]:
    start = {
        "type": "message_start",
        "message": {
            "id": f"msg_{uuid.uuid4().hex[:8]}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "usage": {"input_tokens": 100, "output_tokens": 1},
        },
    }
    events: list[tuple[str, Any]] = [("message_start", start)]
    if call is None:
        events += [
            (
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            ),
            (
                "content_block_delta",
                {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": FINAL}},
            ),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ]
        stop = "end_turn"
    else:
        block = {"type": "tool_use", "id": f"toolu_{step}_{uuid.uuid4().hex[:6]}", "name": call[0], "input": {}}
        events += [
            ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}),
            (
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "input_json_delta", "partial_json": json.dumps(call[1])},
                },
            ),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ]
        stop = "tool_use"
    events += [
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": 20}}),
        ("message_stop", {"type": "message_stop"}),
    ]
    return events


def _responses(step: str, call: tuple[str, dict[str, Any]] | None, model: str) -> list[tuple[str, Any]]:
    rid = f"resp_{uuid.uuid4().hex[:8]}"
    if call is None:
        item: dict[str, Any] = {
            "type": "message",
            "id": f"msg_{rid}",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": FINAL, "annotations": []}],
        }
    else:
        item = {
            "type": "function_call",
            "id": f"fc_{rid}",
            "call_id": f"call_{step}_{uuid.uuid4().hex[:6]}",
            "name": call[0],
            "arguments": json.dumps(call[1]),
            "status": "completed",
        }
    response = {
        "id": rid,
        "object": "response",
        "model": model,
        "status": "completed",
        "output": [item],
        "usage": {"input_tokens": 100, "output_tokens": 20, "total_tokens": 120},
    }
    return [
        (
            "response.created",
            {"type": "response.created", "response": {**response, "status": "in_progress", "output": []}},
        ),
        ("response.output_item.added", {"type": "response.output_item.added", "output_index": 0, "item": item}),
        ("response.output_item.done", {"type": "response.output_item.done", "output_index": 0, "item": item}),
        ("response.completed", {"type": "response.completed", "response": response}),
    ]


def _gemini(step: str, call: tuple[str, dict[str, Any]] | None, model: str) -> list[tuple[str, Any]]:
    if call is None:
        part: dict[str, Any] = {"text": FINAL}
    else:
        part = {"functionCall": {"id": f"gem_{step}_{uuid.uuid4().hex[:6]}", "name": call[0], "args": call[1]}}
    chunk = {
        "candidates": [{"content": {"role": "model", "parts": [part]}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": 100, "candidatesTokenCount": 20, "totalTokenCount": 120},
        "modelVersion": model,
    }
    return [("", chunk)]


def _handler(model: ScriptedModel) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_HEAD(self) -> None:
            self._json(200, {})

        def do_GET(self) -> None:
            self._json(200, {"data": []})

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            headers = {k.lower(): v for k, v in self.headers.items()}
            path = self.path.split("?")[0]
            api = (
                "anthropic" if path.endswith("/messages") else "responses" if path.endswith("/responses") else "gemini"
            )
            if (status := model.take_failure()) is not None:
                model.record(api, "failed", body, headers)
                self._json(
                    status, {"type": "error", "error": {"type": "overloaded_error", "message": "scripted failure"}}
                )
                return
            tools = _tool_names(api, body)
            if api == "gemini" and (":generateContent" in path or not tools):  # the CLI's side requests
                served = model.record(api, "side", body, headers)
                text = '{"reasoning": "a small task", "model_choice": "flash"}'
                candidate = {
                    "content": {"role": "model", "parts": [{"text": text}]},
                    "finishReason": "STOP",
                    "index": 0,
                }
                self._json(200, _gemini("side", None, "gemini-test")[0][1] | {"candidates": [candidate]})
                served.completed = True
                return
            if not tools:  # a side request (title, summary): a short text
                step = "side"
            else:
                step = model.next_step(api, body)
            served = model.record(api, step, body, headers)
            served.tools = tools
            call = None if step in ("done", "side") else model.call(step, tools)
            name = str(body.get("model") or "scripted")
            events = {"anthropic": _anthropic, "responses": _responses, "gemini": _gemini}[api](step, call, name)
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("cache-control", "no-cache")
            self.send_header("connection", "close")
            self.end_headers()
            for index, (event, data) in enumerate(events):
                if index == min(1, len(events) - 1) and model.should_stall(step):  # gemini: one event
                    self.wfile.flush()
                    model.wait_released()
                    return  # the connection closes without the rest: a cut stream
                head = f"event: {event}\n" if event else ""
                self.wfile.write(f"{head}data: {json.dumps(data)}\n\n".encode())
                self.wfile.flush()
            served.completed = True
            self.close_connection = True

        def _json(self, status: int, payload: Any) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler
