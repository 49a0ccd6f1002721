"""Bundles that must be refused: each with its own clear message, and nothing written to the store."""

from __future__ import annotations

import time
from pathlib import Path

import msgspec
import pytest

from keel.protocol.records import Event
from keel.server.engine.files import places
from keel.storage import DB, Store
from keel.storage import bundle as b
from keel.storage import missions as m
from tests.bundles.kit import keel, ok, store_snapshot
from tests.storage.test_verify import make_mission

KEY = "test-signing-key"


@pytest.fixture
def signed(tmp_path: Path) -> bytes:
    """A signed bundle of a mission with 3 checkpoints, events and a plain-folder sandbox."""
    store = tmp_path / "a" / "store"
    with Store.open(store) as s:
        make_mission(s, "m1", checkpoints=3)
        s.write(lambda t: m.add_event(t, "m1", Event(kind="note", at=time.time(), message="hi")))
    sandbox = places.sandbox_path(store, "m1")
    (sandbox / "sub").mkdir(parents=True)
    (sandbox / "a.txt").write_text("alpha\n")
    (sandbox / "sub" / "bin").write_bytes(bytes(range(256)))
    (sandbox / "run.sh").write_text("#!/bin/sh\n")
    (sandbox / "run.sh").chmod(0o755)
    out = tmp_path / "m1.bundle"
    ok(keel("export", "m1", "-o", str(out), store=store, env={"KEEL_SIGNING_KEY": KEY}))
    return out.read_bytes()


@pytest.fixture
def target(tmp_path: Path) -> Path:
    """The importing store, already holding another mission (so 'nothing written' is meaningful)."""
    store = tmp_path / "b" / "store"
    with Store.open(store) as s:
        make_mission(s, "other", checkpoints=1)
    return store


def refused(tmp_path: Path, data: bytes, store: Path, *flags: str, key: str | None = KEY, fresh: bool = True) -> str:
    """Import through the CLI; it must fail with exit 5 and one line, and the store must be unchanged."""
    before = store_snapshot(store)
    path = tmp_path / "tampered.bundle"
    path.write_bytes(data)
    env = {"KEEL_SIGNING_KEY": key} if key else {}
    proc = keel("import", str(path), "--workspace", str(tmp_path), *flags, store=store, env=env)
    assert proc.returncode == 5, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("keel: ") and "Traceback" not in proc.stderr, proc.stderr
    assert store_snapshot(store) == before
    assert not fresh or not places.sandbox_path(store, "m1").exists()
    return lines[0]


def repack(
    data: bytes, change: object, *, key: bytes | None = KEY.encode(), workspace: b.WorkspaceSection | None = None
) -> bytes:
    """Re-write a valid bundle with its record list changed by `change(list)`, correctly sealed and signed:
    only the bundle's own structure checks can catch what was done."""
    bundle = b.read_bundle(data, signing_key=KEY.encode(), allow_unsigned=True)
    records = [(e.db, e.key, bundle.payloads[(e.db, e.key)]) for e in bundle.manifest.entries]
    change(records)  # type: ignore[operator]
    return b.write_bundle("m1", records, workspace or bundle.manifest.workspace, signing_key=key)


def test_valid_bundle_imports(tmp_path: Path, signed: bytes, target: Path) -> None:
    path = tmp_path / "ok.bundle"
    path.write_bytes(signed)
    ok(keel("import", str(path), "--workspace", str(tmp_path), store=target, env={"KEEL_SIGNING_KEY": KEY}))
    sandbox = places.sandbox_path(target, "m1")
    assert (sandbox / "sub" / "bin").read_bytes() == bytes(range(256))
    assert (sandbox / "run.sh").stat().st_mode & 0o111
    ok(keel("verify", store=target))
    again = refused(tmp_path, signed, target, fresh=False)
    assert "already exists" in again


def test_every_changed_byte_is_detected(signed: bytes) -> None:
    key = KEY.encode()
    b.read_bundle(signed, signing_key=key, allow_unsigned=False)
    for position in range(len(signed)):
        for mask in (0x01, 0x80):
            damaged = bytearray(signed)
            damaged[position] ^= mask
            with pytest.raises(b.BundleError):
                b.read_bundle(bytes(damaged), signing_key=key, allow_unsigned=True)
    with pytest.raises(b.BundleError, match="records do not end"):
        b.read_bundle(signed + b"\x00", signing_key=key, allow_unsigned=True)
    with pytest.raises(b.BundleError):
        b.read_bundle(signed[:-1], signing_key=key, allow_unsigned=True)


def test_changed_byte_refused_by_the_cli(tmp_path: Path, signed: bytes, target: Path) -> None:
    damaged = bytearray(signed)
    damaged[len(signed) // 2] ^= 0x10
    assert "bundle" in refused(tmp_path, bytes(damaged), target)
    damaged = bytearray(signed)
    damaged[-1] ^= 0x10
    assert "signature does not match" in refused(tmp_path, bytes(damaged), target)


@pytest.mark.parametrize("db", [DB.BLOBS.value, DB.EVENTS.value, DB.JOURNAL.value, DB.MISSIONS.value, "workspace"])
def test_dropped_record(tmp_path: Path, signed: bytes, target: Path, db: str) -> None:
    def drop(records: list[tuple[str, bytes, bytes]]) -> None:
        index = next(i for i, r in enumerate(records) if r[0] == db)
        del records[index]

    message = refused(tmp_path, repack(signed, drop), target)
    assert "dropped" in message or "lacks" in message, message


def test_reordered_records(tmp_path: Path, signed: bytes, target: Path) -> None:
    def swap(records: list[tuple[str, bytes, bytes]]) -> None:
        i = next(i for i, r in enumerate(records) if r[0] == DB.EVENTS.value)
        records[i], records[i + 1] = records[i + 1], records[i]

    assert "out of order" in refused(tmp_path, repack(signed, swap), target)


@pytest.mark.parametrize(
    "path,words",
    [
        ("../evil", "leaves the workspace"),
        ("/etc/evil", "absolute"),
        ("sub/../../evil", "leaves the workspace"),
        (".git/hooks/x", "git"),
    ],
)
def test_unsafe_workspace_path(tmp_path: Path, signed: bytes, target: Path, path: str, words: str) -> None:
    bundle = b.read_bundle(signed, signing_key=KEY.encode(), allow_unsigned=True)
    ws = bundle.manifest.workspace
    evil = msgspec.structs.replace(ws, paths=tuple(sorted((*ws.paths, path))))

    def add(records: list[tuple[str, bytes, bytes]]) -> None:
        records.append(("workspace", path.encode(), b"pwned\n"))
        records.sort(key=lambda r: (b.EXPORT_ORDER.index(r[0]), r[1]))

    assert words in refused(tmp_path, repack(signed, add, workspace=evil), target)
    git_evil = b.WorkspaceSection(kind="git", base_commit="a" * 40, paths=(path,))
    assert words in refused(tmp_path, repack(signed, lambda r: None, workspace=git_evil), target)
    assert not (tmp_path / "evil").exists()


def test_newer_format(tmp_path: Path, signed: bytes, target: Path) -> None:
    newer = signed.replace(b"KEELBUNDLE 1 ", b"KEELBUNDLE 2 ", 1)
    assert "newer than this keel" in refused(tmp_path, newer, target)
    assert "not a keel bundle" in refused(tmp_path, b"PK\x03\x04" + signed, target)


def test_signatures(tmp_path: Path, signed: bytes, target: Path) -> None:
    assert "signature does not match" in refused(tmp_path, signed, target, key="another-key")
    assert "no signing key is configured" in refused(tmp_path, signed, target, key=None)
    unsigned = repack(signed, lambda r: None, key=None)
    assert "not signed" in refused(tmp_path, unsigned, target)
    forged = repack(signed, lambda r: None, key=b"forger")
    assert "signature does not match" in refused(tmp_path, forged, target)


def test_record_of_another_mission(tmp_path: Path, signed: bytes, target: Path) -> None:
    def smuggle(records: list[tuple[str, bytes, bytes]]) -> None:
        records.insert(1, (DB.HEADS.value, b"other", records[1][2]))

    assert "does not belong to mission m1" in refused(tmp_path, repack(signed, smuggle), target)
