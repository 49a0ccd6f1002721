"""Replay in the worker (server/engine/step/replay.py), message by message: which entries the host hands over,
what the worker answers, and when it stops and says how many it answered."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from keel.protocol import rpc
from keel.protocol.records import JournalEntry
from keel.server.engine.journal import request_fingerprint
from keel.server.engine.step.replay import REPLAY, REPLAYED, WorkerReplay, replay_notice, replayed_count


def _entry(seq: int, method: str, params: Any, result: Any, **fields: Any) -> JournalEntry:
    return JournalEntry(seq=seq, kind=method, fingerprint=request_fingerprint(method, params), result=result, **fields)


REQUESTS = [("now", None), ("random", None), ("tool/run", {"name": "read_file", "args": {"path": "a"}}), ("now", None)]
ENTRIES = [_entry(n, m, p, {"value": n, "bytes": "é"}) for n, (m, p) in enumerate(REQUESTS, 1)]


def _worker(entries: list[JournalEntry]) -> WorkerReplay:
    body, count = replay_notice(entries)
    worker = WorkerReplay()
    assert worker.load(body) == (count > 0)
    return worker


def _request(n: int, method: str, params: Any) -> rpc.Request:
    return rpc.Request(method=method, id=100 + n, params=params)


def test_the_table_holds_the_leading_done_entries_and_their_answers_as_the_host_sends_them() -> None:
    body, count = replay_notice(reversed(ENTRIES))
    message = json.loads(body)
    assert message["method"] == REPLAY and message["jsonrpc"] == "2.0" and count == 4
    assert message["params"]["entries"] == [[e.seq, e.fingerprint, msgspec.to_builtins(e.result)] for e in ENTRIES]
    assert isinstance(rpc.decode(body), rpc.Notification)


@pytest.mark.parametrize(
    ("entries", "count"),
    [
        ([*ENTRIES[:2], msgspec.structs.replace(ENTRIES[2], phase="intent"), ENTRIES[3]], 2),  # an effect in doubt
        ([*ENTRIES[:1], msgspec.structs.replace(ENTRIES[1], error="boom"), *ENTRIES[2:]], 1),  # an error answer
        ([ENTRIES[0], *ENTRIES[2:]], 1),  # a gap
        (ENTRIES[1:], 0),  # no entry 1
        ([], 0),
    ],
)
def test_the_table_stops_at_the_first_entry_the_host_must_answer_itself(
    entries: list[JournalEntry], count: int
) -> None:
    body, handed = replay_notice(entries)
    assert handed == count and (body == b"") == (count == 0)


def test_the_table_keeps_within_its_budget() -> None:
    big = [_entry(n, "now", None, "x" * 1000) for n in range(1, 11)]
    assert replay_notice(big, budget=3500)[1] == 3


def test_the_worker_answers_matching_requests_in_order_then_hands_over_with_the_count() -> None:
    worker = _worker(ENTRIES)
    for n, (method, params) in enumerate(REQUESTS[:3], 1):
        body = worker.answer(_request(n, method, params))
        assert body is not None
        assert rpc.decode(body) == rpc.Response(id=100 + n, result={"value": n, "bytes": "é"})
    other = _request(4, "random", None)  # entry 4 recorded `now`: the host must judge it
    assert worker.answer(other) is None
    notice = worker.handover(other)
    assert notice is not None and rpc.decode(notice) == rpc.Notification(method=REPLAYED, params={"count": 3})
    assert worker.answer(_request(5, "now", None)) is None  # never again, even for a request that would match
    assert worker.handover(_request(5, "now", None)) is None


def test_the_worker_hands_over_past_its_table_and_at_any_frame_it_does_not_answer() -> None:
    worker = _worker(ENTRIES[:1])
    assert worker.answer(_request(1, *REQUESTS[0])) is not None
    assert worker.answer(_request(2, *REQUESTS[1])) is None
    worker = _worker(ENTRIES)
    assert worker.answer(_request(1, *REQUESTS[0])) is not None
    log = rpc.Notification(method="log", params="hi")
    assert worker.answer(log) is None
    assert rpc.decode(worker.handover(log) or b"") == rpc.Notification(method=REPLAYED, params={"count": 1})
    assert worker.answer(_request(2, *REQUESTS[1])) is None


def test_a_worker_that_answered_nothing_says_nothing() -> None:
    worker = _worker(ENTRIES)
    first = _request(1, "random", None)
    assert worker.answer(first) is None and worker.handover(first) is None


def test_a_table_after_a_request_reached_the_host_is_refused() -> None:
    worker = WorkerReplay()
    response = rpc.Response(id=1, result={"name": "a"})  # the agent's answer to initialize numbers nothing
    assert worker.handover(response) is None
    request = _request(1, *REQUESTS[0])
    assert worker.handover(request) is None
    assert worker.load(replay_notice(ENTRIES)[0]) is False
    assert worker.answer(request) is None
    assert WorkerReplay().load(b'{"method": "keel/replay", "params": {"entries": [[1]]}}') is False


@pytest.mark.parametrize(("params", "count"), [({"count": 3}, 3), ({"count": True}, -1), ({}, -1), (None, -1)])
def test_a_replayed_notice_count(params: Any, count: int) -> None:
    assert replayed_count(params) == count
