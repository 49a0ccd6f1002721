"""Sealed records: every stored type round-trips through a real store, and no damage goes unnoticed.

Samples give every field a non-default value; a test checks that every Struct of protocol/records.py,
spec.py and agent.py has a sample, so a new type cannot be forgotten here.
"""

from __future__ import annotations

import inspect
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keel.protocol import agent, records, rpc, spec
from keel.protocol.states import MissionState, PauseReason, UnitState
from keel.storage import CorruptRecordError, Store
from keel.storage.keys import DB, log_key, unit_prefix
from keel.storage.record import (
    FORMAT_VERSION,
    HEADER_SIZE,
    MAGIC,
    Codec,
    log_opener,
    open_log,
    open_record,
    open_view,
    seal,
)
from keel.storage.txn import prefix_end
from tests.storage.raw import flip_byte, raw_get, raw_put

UNIT = spec.UnitSpec(id="u1", kind="shell", title="t", after=("u0",), params={"a": [1, "x"]}, timeout_s=3.5)
MISSION_SPEC = spec.MissionSpec(
    name="n",
    agent=("python", "a.py"),
    goal="g",
    workspace="w",
    max_parallel=2,
    plan=True,
    workers=True,
    units=(UNIT,),
    models=spec.ModelPolicy(
        prefer=("m",),
        failover="never",
        auto_resume=False,
        require=spec.Requirements(
            tools=True, min_context=8, local_only=True, max_cost_per_mtok=1.5, vision=True, no_data_retention=True
        ),
    ),
    checkpoint=spec.CheckpointPolicy(
        policy="interval", group_window_ms=1, expensive_step_ms=2, snapshot_budget_ms=3, interval_ms=4
    ),
    permissions=spec.Permissions(tools=("run",), command_timeout_s=9.0, env=("JAVA_HOME",)),
    env={"K": "V"},
    budget=spec.Budget(model_requests=7, tokens=900),
)
HOST = records.HostInfo(host_id="h", pid=42, started_at=1.0, hostname="box")
QUESTION = records.Question(
    unit="u1",
    seq=3,
    text="which?",
    choices=("a", "b"),
    kind="uncertain-effect",
    fingerprint="f" * 64,
    lane="u1#2",
    epoch=4,
)
COST = records.StepCost(wall_ms=12.5, tokens=99)
MARK = records.UnitMark(
    state=UnitState.RUNNING,
    journal_hwm=7,
    attempts=2,
    result={"r": 1},
    error="e",
    agent_state="ab" * 32,
    epoch=3,
    tree="cd" * 32,
    base_tree="ef" * 32,
)
TOOL = agent.ToolCallSpec(name="read_file", description="d", parameters={"type": "object"})

PLACE = records.Placement(
    sandbox="/s/u1",
    branch="keel/u1",
    base="a" * 40,
    tree="t" * 64,
    base_tree="b" * 64,
    last_checkpoint=7,
    saved_at=5,
    commit="c" * 40,
    merged=True,
    result={"ok": 1},
    ran_on=records.WorkerPlace(worker="w-1", hostname="build-7", pid=4242, sandbox="/w/u1.3"),
    copied=True,
)
OFFER = records.WorkerOffer(worker="w-1", spec=UNIT, why="a question for a person")

SAMPLES: dict[type[Any], Any] = {
    spec.UnitSpec: UNIT,
    spec.Requirements: MISSION_SPEC.models.require,
    spec.ModelPolicy: MISSION_SPEC.models,
    spec.CheckpointPolicy: MISSION_SPEC.checkpoint,
    spec.Permissions: MISSION_SPEC.permissions,
    spec.Budget: MISSION_SPEC.budget,
    spec.MissionSpec: MISSION_SPEC,
    records.HostInfo: HOST,
    records.HostLease: records.HostLease(
        mission="m1", epoch=3, host_id="h", pid=42, hostname="box", heartbeat=2.0, ttl_s=10.0
    ),
    records.Question: QUESTION,
    records.MissionRecord: records.MissionRecord(
        id="m1",
        spec=MISSION_SPEC,
        state=MissionState.WAITING_INPUT,
        created_at=1.0,
        updated_at=2.0,
        workspace="/w",
        sandbox="/s",
        pause_reason=PauseReason.WAITING_INPUT,
        question=QUESTION,
        error="x",
        host=HOST,
        forked_from="m0",
        mission_file="m.toml",
        control_seen=4,
        machine="build-7",
        retired=("d" * 64,),
        start_tree="t" * 64,
    ),
    records.StepCost: COST,
    records.JournalEntry: records.JournalEntry(
        seq=5,
        kind="tool/run",
        fingerprint="f" * 64,
        phase="intent",
        result={"out": "é☃"},
        error="err",
        tool_class="effectful",
        served_model="local/q",
        at=3.0,
        cost=COST,
        summary="s",
        rerun_approved=True,
        skipped=True,
        effect=records.EffectMark(key="k" * 32, before="b" * 32, after="a" * 32, text="run ls"),
        base=records.LaneBase(lane="u1.2", upto=40),
    ),
    records.LaneBase: records.LaneBase(lane="u1.2", upto=40),
    records.EffectMark: records.EffectMark(key="k" * 32, before="b" * 32, after="a" * 32, text="run ls"),
    records.UnitMark: MARK,
    records.CheckpointManifest: records.CheckpointManifest(
        mission_id="m1",
        number=4,
        reason="paused",
        created_at=5.0,
        graph="a" * 64,
        units={"u1": MARK},
        config="b" * 64,
        parent="c" * 64,
        sandbox_tree="tree",
        context="d" * 64,
        evidence_hwm=11,
        events_hwm=13,
        state=MissionState.PAUSED,
        files_restored=True,
    ),
    records.TreeEntry: records.TreeEntry(path="sub/é.py", mode="x", blob="e" * 64),
    records.SandboxTree: records.SandboxTree(entries=(records.TreeEntry(path="a", mode="l", blob="f" * 64),)),
    records.FolderEntry: records.FolderEntry(name="é.py", mode="d", blob=bytes(range(32))),
    records.SandboxFolder: records.SandboxFolder(entries=(records.FolderEntry(name="a", mode="x", blob=b"\xff" * 32),)),
    records.SandboxBased: records.SandboxBased(base="c" * 40, files="d" * 64, removed=("gone.txt",)),
    records.UnitLease: records.UnitLease(
        unit="u1",
        lane="l2",
        epoch=3,
        host_id="h1",
        state="done",
        pid=42,
        hostname="vm",
        heartbeat=9.0,
        ttl_s=5.0,
        started_at=8.0,
        resolution="rerun",
        place=PLACE,
        offer=OFFER,
    ),
    records.Placement: PLACE,
    records.WorkerOffer: OFFER,
    records.WorkerPlace: records.WorkerPlace(worker="w-1", hostname="build-7", pid=4242, sandbox="/w/u1.3"),
    records.RestorePoint: records.RestorePoint(
        id="p4", mission_id="m1", checkpoint="a" * 64, reason="paused", created_at=5.0, label="before failover"
    ),
    records.Control: records.Control(action="answer", at=6.0, text="yes", source="cli"),
    records.Evidence: records.Evidence(
        kind="diff", at=7.0, unit="u1", summary="s", data={"patch": "+x"}, lane="u1#2", seq=3
    ),
    records.Event: records.Event(kind="state", at=8.0, unit="u1", state="running", message="m"),
    agent.InitializeParams: agent.InitializeParams(protocol_version=1, mission_id="m1", goal="g", sandbox="/s"),
    agent.InitializeResult: agent.InitializeResult(
        name="a", kinds=("shell",), version="1", journal="append", resumes=True
    ),
    agent.UnitRunParams: agent.UnitRunParams(
        unit=UNIT,
        attempt=2,
        state={"k": 1},
        replaying=True,
        resumed_at=4,
        home="/h",
        history=("1 tool write_file",),
        tools=("run",),
    ),
    agent.UnitRunResult: agent.UnitRunResult(result=[1, 2], summary="done"),
    agent.ToolCallSpec: TOOL,
    agent.ModelCompleteParams: agent.ModelCompleteParams(
        messages=[{"role": "user", "content": "hi"}], tools=[TOOL], max_tokens=10, temperature=0.5, purpose="p"
    ),
    agent.Usage: agent.Usage(prompt_tokens=1, completion_tokens=2),
    agent.ModelCompleteResult: agent.ModelCompleteResult(
        message={"role": "assistant", "content": "x"},
        model="m",
        provider="p",
        finish_reason="stop",
        usage=agent.Usage(prompt_tokens=3, completion_tokens=4),
    ),
    agent.ModelForwardParams: agent.ModelForwardParams(
        api="anthropic", body={"model": "m"}, path="models/m:generateContent", session="s1", ordinal=2
    ),
    agent.ModelForwardResult: agent.ModelForwardResult(
        status=200,
        content_type="text/event-stream",
        body="event: message_stop",
        model="m",
        provider="p",
        usage=agent.Usage(prompt_tokens=3, completion_tokens=4),
        replayed_from=7,
    ),
    agent.EffectAskParams: agent.EffectAskParams(tool="run", title="t", call_id="c1", detail={"cmd": "ls"}),
    agent.EffectAskResult: agent.EffectAskResult(allow=True, reason="allowed by [permissions]"),
    agent.EffectDoneParams: agent.EffectDoneParams(call_id="c1", status="failed", output="o"),
    agent.ToolRunParams: agent.ToolRunParams(tool="run", args={"cmd": "ls"}),
    agent.ToolRunResult: agent.ToolRunResult(ok=False, output="o", error="e"),
    agent.HumanAskParams: agent.HumanAskParams(question="q", choices=("y", "n")),
    agent.HumanAskResult: agent.HumanAskResult(answer="y"),
    agent.EvidenceAddParams: agent.EvidenceAddParams(kind="k", summary="s", data=[1]),
    agent.StateSaveParams: agent.StateSaveParams(state={"step": 2}),
    agent.PlanAddParams: agent.PlanAddParams(units=(UNIT,)),
    agent.PlanAddResult: agent.PlanAddResult(added=("u1",)),
    agent.NowResult: agent.NowResult(time=1.5),
    agent.RandomResult: agent.RandomResult(value=0.25),
}


def _structs(module: Any) -> set[type[Any]]:
    return {
        obj
        for _, obj in inspect.getmembers(module, inspect.isclass)
        if issubclass(obj, msgspec.Struct) and obj.__module__ == module.__name__
    }


def test_every_struct_has_a_sample_with_no_default_field() -> None:
    assert _structs(spec) | _structs(records) | _structs(agent) == set(SAMPLES)
    for type_, sample in SAMPLES.items():
        defaults = [
            f.name
            for f in msgspec.structs.fields(type_)
            if f.default is not msgspec.NODEFAULT and getattr(sample, f.name) == f.default
        ]
        assert not defaults, f"{type_.__name__} sample leaves {defaults} at their default"


@pytest.mark.parametrize("type_", list(SAMPLES), ids=lambda t: t.__name__)
def test_round_trip_through_put_get_and_blobs(
    tmp_path: Path, type_: type[Any], store_folder: Callable[[Path], Path]
) -> None:
    sample = SAMPLES[type_]
    key = log_key(unit_prefix("m1", "u1"), 1)
    path = store_folder(tmp_path / "s")
    with Store.open(path) as store:
        digest = store.write(lambda t: (t.put(DB.JOURNAL, key, sample), t.put_object(sample))[1])
    with Store.open(path, create=False) as store:  # a fresh open reads from disk
        got, blob = store.read(lambda t: (t.get(DB.JOURNAL, key, type_), t.get_object(digest, type_)))
    assert got == sample and blob == sample


def test_raw_blobs_round_trip_and_are_shared(store: Store) -> None:
    data = bytes(range(256)) * 40
    first = store.write(lambda t: t.put_blob(data))
    second = store.write(lambda t: t.put_blob(data))
    assert first == second
    assert store.read(lambda t: t.get_blob(first)) == data
    assert store.read(lambda t: t.get_blob("0" * 64)) is None


# -- damage -------------------------------------------------------------------------------------------

SEALED = seal("journal", b"m1\x00u1\x00key", msgspec.msgpack.encode(SAMPLES[records.JournalEntry]), Codec.MSGPACK)


@settings(max_examples=400, deadline=None)
@given(position=st.integers(0, len(SEALED) - 1), mask=st.integers(1, 255))
def test_any_flipped_byte_is_detected(position: int, mask: int) -> None:
    data = bytearray(SEALED)
    data[position] ^= mask
    with pytest.raises(CorruptRecordError):
        open_record("journal", b"m1\x00u1\x00key", bytes(data))


@settings(max_examples=100, deadline=None)
@given(cut=st.integers(0, len(SEALED) - 1))
def test_truncated_records_are_detected(cut: int) -> None:
    with pytest.raises(CorruptRecordError, match=r"truncated|length mismatch"):
        open_record("journal", b"m1\x00u1\x00key", SEALED[:cut])


LANE = unit_prefix("m1", "u1")
LOG_KEY = log_key(LANE, 5)
LOG_SEALED = seal("journal", LOG_KEY, msgspec.msgpack.encode(SAMPLES[records.JournalEntry]), Codec.MSGPACK)


def test_a_log_record_opens_as_open_view_opens_it() -> None:
    assert log_opener("journal", LANE)(LOG_KEY, LOG_SEALED) == (Codec.MSGPACK, LOG_SEALED[HEADER_SIZE:])
    raw = seal("journal", LOG_KEY, b"not msgpack", Codec.RAW)  # another codec: left to the caller to refuse
    assert (
        log_opener("journal", LANE)(LOG_KEY, raw) == open_view("journal", LOG_KEY, raw) == (Codec.RAW, b"not msgpack")
    )


@settings(max_examples=400, deadline=None)
@given(position=st.integers(0, len(LOG_SEALED) - 1), mask=st.integers(1, 255))
def test_a_flipped_byte_of_a_log_record_is_detected(position: int, mask: int) -> None:
    data = bytearray(LOG_SEALED)
    data[position] ^= mask
    with pytest.raises(CorruptRecordError):
        log_opener("journal", LANE)(LOG_KEY, bytes(data))


@settings(max_examples=100, deadline=None)
@given(cut=st.integers(0, len(LOG_SEALED) - 1))
def test_a_truncated_log_record_is_detected(cut: int) -> None:
    with pytest.raises(CorruptRecordError, match=r"truncated|length mismatch"):
        log_opener("journal", LANE)(LOG_KEY, LOG_SEALED[:cut])


def _open_log(db: str, prefix: bytes, records: list[tuple[bytes, bytes]]) -> list[Any]:
    end = prefix_end(prefix)
    assert end is not None
    return open_log(db, prefix, records, end, msgspec.msgpack.Decoder().decode)


def test_a_log_read_opens_records_of_any_length_as_open_view_does() -> None:
    """Records of several lengths, a long one (read through a view) and lengths seen again, in one read."""
    payloads = [msgspec.msgpack.encode("x" * n) for n in (0, 1, 5, 1, 5000, 0, 100_000, 5)]
    sealed = [(log_key(LANE, n), seal("journal", log_key(LANE, n), p, Codec.MSGPACK)) for n, p in enumerate(payloads)]
    assert _open_log("journal", LANE, sealed) == ["x" * n for n in (0, 1, 5, 1, 5000, 0, 100_000, 5)]
    odd = LANE + b"not-a-seq"  # another shape of key under the prefix: no entry of the log
    assert _open_log("journal", LANE, [(odd, seal("journal", odd, b"\x07", Codec.MSGPACK)), *sealed[:1]]) == [""]


def test_a_log_read_stops_at_its_stop_key() -> None:
    records = [(log_key(LANE, n), seal("journal", log_key(LANE, n), bytes([n]), Codec.MSGPACK)) for n in (1, 2, 3)]
    assert open_log("journal", LANE, records, log_key(LANE, 3), msgspec.msgpack.Decoder().decode) == [1, 2]


@settings(max_examples=400, deadline=None)
@given(position=st.integers(0, len(LOG_SEALED) - 1), mask=st.integers(1, 255), index=st.integers(0, 2))
def test_a_flipped_byte_in_a_log_read_is_detected(position: int, mask: int, index: int) -> None:
    records = [
        (log_key(LANE, 5 + n), seal("journal", log_key(LANE, 5 + n), LOG_SEALED[HEADER_SIZE:], Codec.MSGPACK))
        for n in range(3)
    ]
    data = bytearray(records[index][1])
    data[position] ^= mask
    records[index] = (records[index][0], bytes(data))
    with pytest.raises(CorruptRecordError) as info:
        _open_log("journal", LANE, records)
    assert info.value.key == records[index][0]


@settings(max_examples=100, deadline=None)
@given(cut=st.integers(0, len(LOG_SEALED) - 1))
def test_a_truncated_record_in_a_log_read_is_detected(cut: int) -> None:
    with pytest.raises(CorruptRecordError, match=r"truncated|length mismatch"):
        _open_log("journal", LANE, [(LOG_KEY, LOG_SEALED), (log_key(LANE, 6), LOG_SEALED[:cut])])


@pytest.mark.parametrize(
    ("db", "prefix", "key"),
    [
        ("journal", LANE, log_key(LANE, 6)),
        ("journal", unit_prefix("m1", "u2"), log_key(unit_prefix("m1", "u2"), 5)),
        ("evidence", LANE, LOG_KEY),
    ],
)
def test_a_log_record_copied_to_another_key_or_db_does_not_verify_in_a_log_read(
    db: str, prefix: bytes, key: bytes
) -> None:
    with pytest.raises(CorruptRecordError, match="digest mismatch"):
        _open_log(db, prefix, [(key, LOG_SEALED)])


def test_a_log_read_refuses_a_record_of_another_codec() -> None:
    raw = seal("journal", LOG_KEY, b"not msgpack", Codec.RAW)
    with pytest.raises(CorruptRecordError, match="expected a msgpack record, found codec RAW"):
        _open_log("journal", LANE, [(LOG_KEY, raw)])


@pytest.mark.parametrize(
    ("db", "prefix", "key"),
    [
        ("journal", LANE, log_key(LANE, 6)),  # another entry of the same lane
        ("journal", unit_prefix("m1", "u2"), log_key(unit_prefix("m1", "u2"), 5)),  # the same seq of another lane
        ("journal", unit_prefix("m2", "u1"), log_key(unit_prefix("m2", "u1"), 5)),  # another mission's lane
        ("journal", LANE, LOG_KEY + b"\x00"),  # a longer key under the same prefix
        ("evidence", LANE, LOG_KEY),  # another database
    ],
)
def test_a_log_record_copied_to_another_key_or_db_does_not_verify(db: str, prefix: bytes, key: bytes) -> None:
    with pytest.raises(CorruptRecordError, match="digest mismatch"):
        log_opener(db, prefix)(key, LOG_SEALED)


def test_a_log_opener_checks_the_key_it_is_given_not_its_prefix() -> None:
    """A key outside the opener's log is hashed whole: a record sealed for it verifies, one copied there does not."""
    other = log_key(unit_prefix("m1", "u2"), 5)
    for key in (other, LOG_KEY + b"\x00", LANE):
        sealed = seal("journal", key, b"\x01", Codec.MSGPACK)
        assert log_opener("journal", LANE)(key, sealed) == (Codec.MSGPACK, b"\x01")
    with pytest.raises(CorruptRecordError, match="digest mismatch"):
        log_opener("journal", LANE)(other, LOG_SEALED)


def test_a_lane_read_finds_an_entry_copied_from_another_lane(
    tmp_path: Path, store_folder: Callable[[Path], Path]
) -> None:
    path = store_folder(tmp_path / "s")
    entry = SAMPLES[records.JournalEntry]
    other = unit_prefix("m1", "u2")
    with Store.open(path) as store:
        store.write(
            lambda t: [t.put(DB.JOURNAL, log_key(prefix, n), entry) for prefix in (LANE, other) for n in (1, 2)]
        )
    raw_put(path, DB.JOURNAL, log_key(LANE, 2), raw_get(path, DB.JOURNAL, log_key(other, 2)))
    for read in (_read_log, _log_values):
        with Store.open(path) as store, pytest.raises(CorruptRecordError, match="digest mismatch") as info:
            store.read(lambda t, read=read: read(t, LANE))  # type: ignore[misc]
        assert info.value.key == log_key(LANE, 2)
        with Store.open(path) as store:
            assert store.read(lambda t, read=read: read(t, other)) == [entry, entry]  # type: ignore[misc]


def _read_log(txn: Any, prefix: bytes) -> list[Any]:
    return [value for _, value in txn.read_log(DB.JOURNAL, prefix, records.JournalEntry)]


def _log_values(txn: Any, prefix: bytes) -> list[Any]:
    return list(txn.log_values(DB.JOURNAL, prefix, records.JournalEntry))


def test_a_lane_read_names_an_entry_that_does_not_decode(tmp_path: Path, store_folder: Callable[[Path], Path]) -> None:
    path = store_folder(tmp_path / "s")
    with Store.open(path) as store:
        store.write(lambda t: t.put(DB.JOURNAL, log_key(LANE, 1), SAMPLES[records.JournalEntry]))
        store.write(lambda t: t.put(DB.JOURNAL, log_key(LANE, 2), {"seq": "two"}))
        store.write(lambda t: t.put(DB.JOURNAL, log_key(LANE, 3), SAMPLES[records.JournalEntry]))
        for read in (_read_log, _log_values):
            with pytest.raises(CorruptRecordError, match="does not decode as JournalEntry") as info:
                store.read(lambda t, read=read: read(t, LANE))  # type: ignore[misc]
            assert info.value.key == log_key(LANE, 2)
        assert store.read(lambda t: t.log_values(DB.JOURNAL, LANE, records.JournalEntry, upto=1)) == [
            SAMPLES[records.JournalEntry]
        ]


def test_a_lane_read_refuses_a_record_of_another_codec(tmp_path: Path, store_folder: Callable[[Path], Path]) -> None:
    path = store_folder(tmp_path / "s")
    with Store.open(path) as store:
        store.write(lambda t: t.put(DB.JOURNAL, log_key(LANE, 1), SAMPLES[records.JournalEntry]))
    raw_put(path, DB.JOURNAL, log_key(LANE, 2), seal("journal", log_key(LANE, 2), b"x", Codec.RAW))
    for read in (_read_log, _log_values):
        with (
            Store.open(path) as store,
            pytest.raises(CorruptRecordError, match="expected a msgpack record, found codec RAW"),
        ):
            store.read(lambda t, read=read: read(t, LANE))  # type: ignore[misc]


def _reheader(data: bytes, **fields: int | bytes) -> bytes:
    magic, version, codec, reserved, length = struct.unpack_from(">4sBBHI", data)
    values = {"magic": magic, "version": version, "codec": codec, "reserved": reserved, "length": length, **fields}
    return struct.pack(">4sBBHI", *values.values()) + data[12:]


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"magic": b"LEEK"}, "bad magic b'LEEK'"),
        ({"version": FORMAT_VERSION + 1}, f"record format {FORMAT_VERSION + 1} is newer than this keel reads"),
        ({"version": 0}, "unknown record format 0"),
        ({"codec": 9}, "bad header (codec 9"),
        ({"reserved": 1}, "reserved 1"),
        ({"length": 3}, "length mismatch"),
    ],
)
def test_header_defects_are_named(fields: dict[str, Any], reason: str) -> None:
    with pytest.raises(CorruptRecordError) as info:
        open_record("journal", b"k", _reheader(seal("journal", b"k", b"payload", Codec.RAW), **fields))
    assert reason in info.value.reason
    assert info.value.db == "journal" and "corrupt record journal/k" in info.value.message


def test_header_layout() -> None:
    sealed = seal("meta", b"k", b"abc", Codec.RAW)
    assert sealed[:4] == MAGIC and len(sealed) == HEADER_SIZE + 3 and sealed[HEADER_SIZE:] == b"abc"


def test_record_copied_to_another_key_or_db_does_not_verify(
    tmp_path: Path, store_folder: Callable[[Path], Path]
) -> None:
    path = store_folder(tmp_path / "s")
    event = SAMPLES[records.Event]
    key1, key2 = log_key(b"m1\x00", 1), log_key(b"m1\x00", 2)
    with Store.open(path) as store:
        store.write(lambda t: t.put(DB.EVENTS, key1, event))
    sealed = raw_get(path, DB.EVENTS, key1)
    raw_put(path, DB.EVENTS, key2, sealed)
    raw_put(path, DB.EVIDENCE, key1, sealed)
    with Store.open(path) as store:
        assert store.read(lambda t: t.get(DB.EVENTS, key1, records.Event)) == event
        for db, key in ((DB.EVENTS, key2), (DB.EVIDENCE, key1)):
            with pytest.raises(CorruptRecordError, match="digest mismatch") as info:
                store.read(lambda t, db=db, key=key: t.get(db, key, records.Event))
            assert info.value.db == db.value and info.value.key == key


def test_flipped_byte_in_the_store_is_detected_on_read(tmp_path: Path, store_folder: Callable[[Path], Path]) -> None:
    """Through the real store (LMDB's file, or PostgreSQL's row): every position of one stored record, flipped
    one at a time."""
    path = store_folder(tmp_path / "s")
    entry = SAMPLES[records.JournalEntry]
    key = log_key(unit_prefix("m1", "u1"), 5)
    with Store.open(path) as store:
        store.write(lambda t: t.put(DB.JOURNAL, key, entry))
    size = len(raw_get(path, DB.JOURNAL, key))
    for position in range(0, size, 7):
        flip_byte(path, DB.JOURNAL, key, position, 0x80)
        with Store.open(path) as store, pytest.raises(CorruptRecordError) as info:
            store.read(lambda t: t.get(DB.JOURNAL, key, records.JournalEntry))
        assert "journal/m1/u1/5" in info.value.message
        flip_byte(path, DB.JOURNAL, key, position, 0x80)  # heal it for the next position
    with Store.open(path) as store:
        assert store.read(lambda t: t.get(DB.JOURNAL, key, records.JournalEntry)) == entry


def test_blob_renamed_or_swapped_is_detected(tmp_path: Path, store_folder: Callable[[Path], Path]) -> None:
    path = store_folder(tmp_path / "s")
    with Store.open(path) as store:
        a, b = store.write(lambda t: (t.put_blob(b"a" * 100), t.put_blob(b"b" * 100)))
    raw_put(path, DB.BLOBS, a.encode(), raw_get(path, DB.BLOBS, b.encode()))
    with Store.open(path) as store, pytest.raises(CorruptRecordError) as info:
        store.read(lambda t: t.get_blob(a))
    assert info.value.db == "blobs"


def test_value_of_the_wrong_type_is_a_corrupt_record(store: Store) -> None:
    store.write(lambda t: t.put(DB.EVENTS, b"k", rpc.Request(method="x", id=1)))
    with pytest.raises(CorruptRecordError, match="does not decode as Event"):
        store.read(lambda t: t.get(DB.EVENTS, b"k", records.Event))


@pytest.mark.parametrize(
    ("key", "shown"),
    [
        (log_key(unit_prefix("m1", "u1"), 5), "m1/u1/5"),
        (log_key(b"m1\x00", 256), "m1/256"),
        (b"m1\x00unit-001", "m1/unit-001"),  # an 8-character id is text, not a sequence number
        (b"abcdefgh", "abcdefgh"),
        (b"\xff\x01", "ff01"),
    ],
)
def test_keys_are_rendered_for_people(key: bytes, shown: str) -> None:
    from keel.storage.errors import render_key

    assert render_key(key) == shown
