"""Mission bundles: one portable, verifiable file holding every record a mission needs.

Layout (docs/bundles.md has the full description):

    b"KEELBUNDLE <format> keel-<version>\\n"     header line
    u32 big-endian n, n bytes                     manifest (msgpack BundleManifest)
    entry payloads, in manifest order             each a sealed record as the store keeps it
    b"KEELSIG" kind(1) seal(32) [hmac(32)]        kind 0 unsigned, 1 HMAC-SHA256

`seal` is BLAKE2b-256 over header line + length + manifest; the HMAC (when signed) covers the same
bytes under the signing key. The manifest lists every entry's database, key, length and digest, so
every byte of the file is covered. `read_bundle` checks everything (format, seal, signature, each
entry's digest and record seal, order, ownership, completeness, workspace paths) and returns a
`Bundle` only when all of it holds; `install_txn` then writes it in the caller's one transaction.

Depends on keel.protocol and the rest of keel.storage; knows nothing of git, files or the CLI: the
workspace section is data (paths and payloads) that the server layer captures and applies.
"""

from __future__ import annotations

import hashlib
import hmac
import posixpath
import struct
import time
from collections.abc import Callable
from typing import Any, Literal

import msgspec

from keel.protocol import __version__
from keel.protocol.errors import ErrorCode, KeelError
from keel.protocol.records import (
    CheckpointManifest,
    Control,
    Event,
    Evidence,
    JournalEntry,
    MissionRecord,
    RestorePoint,
)
from keel.protocol.treepaths import path_problem
from keel.storage.errors import CorruptRecordError, render_key
from keel.storage.keys import DB, SEQ_BYTES, log_key, mission_prefix
from keel.storage.record import Codec, content_digest, open_record, seal
from keel.storage.snapshots import base_of_blob, manifest_trees, tree_refs
from keel.storage.txn import Txn, decode_value

MAGIC = b"KEELBUNDLE"
BUNDLE_FORMAT = 1
SIG_MAGIC = b"KEELSIG"
_LEN = struct.Struct(">I")
_SEAL_BYTES = 32
WORKSPACE_DB = "workspace"  # pseudo-database of workspace payloads: the git patch, or files by path
PATCH_KEY = b"patch"

#: Databases a bundle carries, in the order entries appear; within one, entries sort by key.
EXPORT_ORDER: tuple[str, ...] = (
    DB.MISSIONS.value,
    DB.HEADS.value,
    DB.POINTS.value,
    DB.CONTROL.value,
    DB.EVENTS.value,
    DB.EVIDENCE.value,
    DB.JOURNAL.value,
    DB.BLOBS.value,
    WORKSPACE_DB,
)
_LOGS = (DB.CONTROL, DB.EVENTS, DB.EVIDENCE)  # points are not: `keel gc` may drop some
_TYPES: dict[str, Any] = {
    DB.MISSIONS.value: MissionRecord,
    DB.HEADS.value: str,
    DB.POINTS.value: RestorePoint,
    DB.CONTROL.value: Control,
    DB.EVENTS.value: Event,
    DB.EVIDENCE.value: Evidence,
    DB.JOURNAL.value: JournalEntry,
}


class BundleError(KeelError):
    """A bundle that must not be imported; the message says what is wrong and where."""

    code = ErrorCode.BUNDLE


class Entry(msgspec.Struct, frozen=True):
    db: str
    key: bytes
    length: int
    digest: str  # BLAKE2b-256 hex of the payload bytes


class WorkspaceSection(msgspec.Struct, frozen=True, omit_defaults=True):
    """The mission's sandbox: a binary git patch against `base_commit`, or every file (no git)."""

    kind: Literal["none", "git", "files"] = "none"
    base_commit: str = ""
    paths: tuple[str, ...] = ()  # git: the paths the patch touches; files: every file (entry key)
    modes: dict[str, str] = {}  # files: path -> "x" (executable) or "l" (symlink; payload = target)


class BundleManifest(msgspec.Struct, frozen=True):
    format: int
    keel_version: str
    mission_id: str
    created_at: float
    entries: tuple[Entry, ...]
    workspace: WorkspaceSection = WorkspaceSection()


class Bundle(msgspec.Struct, frozen=True):
    """A fully verified bundle."""

    manifest: BundleManifest
    payloads: dict[tuple[str, bytes], bytes]
    signed: bool

    @property
    def mission_id(self) -> str:
        return self.manifest.mission_id

    def workspace_payload(self, key: bytes) -> bytes:
        return self.payloads[(WORKSPACE_DB, key)]


# -- export -------------------------------------------------------------------------------------------
def portable_record(record: MissionRecord) -> MissionRecord:
    """The mission record without anything of this machine: no paths, no host (re-rooted on import)."""
    name = posixpath.basename(record.mission_file.replace("\\", "/"))
    return msgspec.structs.replace(record, workspace="", sandbox="", machine="", host=None, mission_file=name)


def collect_records(txn: Txn, mission_id: str) -> list[tuple[str, bytes, bytes]]:
    """Every record of the mission as (db, key, sealed bytes), in bundle order."""
    from keel.storage import missions as m

    record = portable_record(m.get_mission(txn, mission_id))
    key = mission_id.encode()
    out: list[tuple[str, bytes, bytes]] = [
        (DB.MISSIONS.value, key, seal(DB.MISSIONS.value, key, msgspec.msgpack.encode(record), Codec.MSGPACK))
    ]
    head_raw = _raw(txn, DB.HEADS, key)
    if head_raw is not None:
        out.append((DB.HEADS.value, key, head_raw))
    for db in (DB.POINTS, DB.CONTROL, DB.EVENTS, DB.EVIDENCE, DB.JOURNAL):
        out += [(db.value, k, raw) for k, raw in txn.scan_raw(db, mission_prefix(mission_id))]
    roots = [d for d in [m.head(txn, mission_id)] if d] + [p.checkpoint for p in m.restore_points(txn, mission_id)]
    for digest in sorted(reachable_blobs(txn.get_blob, roots)):
        raw = _raw(txn, DB.BLOBS, digest.encode())
        if raw is None:
            raise CorruptRecordError(DB.BLOBS.value, digest.encode(), "blob the mission refers to is missing")
        out.append((DB.BLOBS.value, digest.encode(), raw))
    return out


def _raw(txn: Txn, db: DB, key: bytes) -> bytes | None:
    """A record's sealed bytes exactly as stored (copied into the bundle unchanged)."""
    return next((raw for k, raw in txn.scan_raw(db, key) if k == key), None)


def reachable_blobs(
    get_blob: Callable[[str], bytes | None],
    roots: list[str],
    stop: set[str] | frozenset[str] = frozenset(),
    seen: set[str] | None = None,
) -> set[str]:
    """Every blob digest reachable from these manifests: the manifests, their parents, and what they name.
    A missing manifest, or one in `stop`, ends its chain (the caller decides whether that is an error).
    `seen`: blobs already known reachable together with all they reach; they are not walked again, and
    the set is extended in place and returned."""
    seen = set() if seen is None else seen
    stack = list(roots)
    while stack:
        digest = stack.pop()
        if not digest or digest in seen or digest in stop:
            continue
        data = get_blob(digest)
        if data is None:
            continue
        seen.add(digest)
        manifest = msgspec.msgpack.decode(data, type=CheckpointManifest)
        seen.update(ref for ref in manifest_refs(manifest) if get_blob(ref) is not None)
        for tree in manifest_trees(manifest):
            if tree not in seen:
                seen.update(tree_refs(get_blob, tree, skip=seen))
        stack.append(manifest.parent)
    return seen


def manifest_refs(manifest: CheckpointManifest) -> list[str]:
    return [
        ref
        for ref in (
            manifest.graph,
            manifest.config,
            manifest.context,
            *(mark.agent_state for mark in manifest.units.values()),
        )
        if ref
    ]


def write_bundle(
    mission_id: str,
    records: list[tuple[str, bytes, bytes]],
    workspace: WorkspaceSection,
    *,
    signing_key: bytes | None,
    created_at: float | None = None,
) -> bytes:
    """The bundle's bytes; `records` include the workspace payloads (db "workspace") in bundle order."""
    entries = tuple(Entry(db=db, key=key, length=len(raw), digest=_digest(raw)) for db, key, raw in records)
    manifest = BundleManifest(
        format=BUNDLE_FORMAT,
        keel_version=__version__,
        mission_id=mission_id,
        created_at=time.time() if created_at is None else created_at,
        entries=entries,
        workspace=workspace,
    )
    head = _header_line(BUNDLE_FORMAT, __version__)
    body = msgspec.msgpack.encode(manifest)
    covered = head + _LEN.pack(len(body)) + body
    trailer = SIG_MAGIC + (b"\x01" if signing_key else b"\x00") + hashlib.blake2b(covered, digest_size=32).digest()
    if signing_key:
        trailer += hmac.new(signing_key, covered, hashlib.sha256).digest()
    return covered + b"".join(raw for _, _, raw in records) + trailer


def _header_line(fmt: int, version: str) -> bytes:
    return MAGIC + f" {fmt} keel-{version}\n".encode()


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=32).hexdigest()


# -- import: parse and verify -------------------------------------------------------------------------
def read_bundle(data: bytes, *, signing_key: bytes | None, allow_unsigned: bool) -> Bundle:
    """Parse and verify a bundle completely; raises BundleError naming the first thing that is wrong."""
    covered, manifest = _parse_frame(data)
    records_end = len(covered) + sum(entry.length for entry in manifest.entries)
    signed = _check_trailer(covered, data[records_end:], manifest, signing_key, allow_unsigned)
    payloads: dict[tuple[str, bytes], bytes] = {}
    offset = len(covered)
    previous: tuple[int, bytes] | None = None
    for index, entry in enumerate(manifest.entries):
        where = f"record {index} ({entry.db}/{render_key(entry.key)})"
        position = _order_position(entry, manifest.mission_id, where)
        if previous is not None and position <= previous:
            raise BundleError(
                f"bundle records are out of order or repeated at {where}; "
                "the bundle was rearranged after it was written"
            )
        previous = position
        raw = data[offset : offset + entry.length]
        offset += entry.length
        if _digest(raw) != entry.digest:
            raise BundleError(f"bundle {where}: digest mismatch; the record's bytes were changed")
        _check_record(entry, raw, where)
        payloads[(entry.db, entry.key)] = raw
    bundle = Bundle(manifest=manifest, payloads=payloads, signed=signed)
    _check_complete(bundle)
    _check_workspace(bundle)
    return bundle


def _parse_frame(data: bytes) -> tuple[bytes, BundleManifest]:
    """The header line, length and manifest (checked against their BLAKE2b seal in the trailer)."""
    newline = data.find(b"\n", 0, 128)
    parts = data[:newline].split(b" ") if newline > 0 else []
    if len(parts) != 3 or parts[0] != MAGIC or not parts[1].isdigit() or not parts[2].startswith(b"keel-"):
        raise BundleError("not a keel bundle (the first line is not `KEELBUNDLE <format> keel-<version>`)")
    fmt, version = int(parts[1]), parts[2][5:].decode(errors="replace")
    if fmt > BUNDLE_FORMAT:
        raise BundleError(
            f"bundle format {fmt} (written by keel {version}) is newer than this keel "
            f"({__version__}) reads (format {BUNDLE_FORMAT}); upgrade keel to import it"
        )
    if fmt != BUNDLE_FORMAT:
        raise BundleError(f"unknown bundle format {fmt}")
    start = newline + 1
    if len(data) < start + _LEN.size:
        raise BundleError("bundle is truncated: it ends inside its manifest")
    (length,) = _LEN.unpack_from(data, start)
    body_end = start + _LEN.size + length
    if body_end > len(data):
        raise BundleError("bundle is truncated: it ends inside its manifest")
    covered = data[:body_end]
    seal_at = data.rfind(SIG_MAGIC) + len(SIG_MAGIC) + 1
    if seal_at <= body_end + len(SIG_MAGIC) or not hmac.compare_digest(
        data[seal_at : seal_at + _SEAL_BYTES], hashlib.blake2b(covered, digest_size=32).digest()
    ):
        raise BundleError("bundle manifest digest mismatch: its header, manifest or trailer was changed")
    try:
        manifest = msgspec.msgpack.decode(data[start + _LEN.size : body_end], type=BundleManifest)
    except msgspec.DecodeError as exc:
        raise BundleError(f"bundle manifest does not decode: {exc}") from None
    if data[:start] != _header_line(manifest.format, manifest.keel_version) or manifest.format != fmt:
        raise BundleError("bundle header line does not match its manifest; the bundle was changed")
    return covered, manifest


def _check_trailer(
    covered: bytes, trailer: bytes, manifest: BundleManifest, key: bytes | None, allow_unsigned: bool
) -> bool:
    """The seal was checked; here: the trailer's exact shape, then the signature. Returns `signed`."""
    kind = trailer[len(SIG_MAGIC) : len(SIG_MAGIC) + 1]
    sizes = {b"\x00": len(SIG_MAGIC) + 1 + _SEAL_BYTES, b"\x01": len(SIG_MAGIC) + 1 + 2 * _SEAL_BYTES}
    if not trailer.startswith(SIG_MAGIC) or sizes.get(kind) != len(trailer):
        raise BundleError(
            "bundle records do not end where its manifest says (bytes added, dropped or changed "
            "between the records and the signature trailer)"
        )
    if kind == b"\x00":
        if not allow_unsigned:
            raise BundleError(
                f"bundle of mission {manifest.mission_id} is not signed; import it only if you "
                "trust where it came from, with --allow-unsigned"
            )
        return False
    if key is None:
        raise BundleError(
            "bundle is signed but no signing key is configured here "
            "(`keel key set --signing`, or KEEL_SIGNING_KEY); cannot check its signature"
        )
    expected = hmac.new(key, covered, hashlib.sha256).digest()
    if not hmac.compare_digest(trailer[-_SEAL_BYTES:], expected):
        raise BundleError("bundle signature does not match: it was changed after signing, or signed with another key")
    return True


def _order_position(entry: Entry, mission_id: str, where: str) -> tuple[int, bytes]:
    if entry.db not in EXPORT_ORDER:
        raise BundleError(f"bundle {where}: database {entry.db!r} is not one a bundle may carry")
    if entry.db in (DB.MISSIONS.value, DB.HEADS.value):
        ok = entry.key == mission_id.encode()
    elif entry.db in (DB.BLOBS.value, WORKSPACE_DB):
        ok = True
    else:
        ok = entry.key.startswith(mission_prefix(mission_id))
    if not ok:
        raise BundleError(f"bundle {where} does not belong to mission {mission_id}")
    return EXPORT_ORDER.index(entry.db), entry.key


def _check_record(entry: Entry, raw: bytes, where: str) -> None:
    try:
        if entry.db == DB.BLOBS.value:
            codec, payload = open_record(entry.db, entry.key, raw)
            if codec is not Codec.RAW or content_digest(payload) != entry.key.decode(errors="replace"):
                raise BundleError(f"bundle {where}: blob content does not match its name")
        elif entry.db in _TYPES:
            decode_value(entry.db, entry.key, raw, _TYPES[entry.db])
    except CorruptRecordError as exc:
        raise BundleError(f"bundle {where}: {exc.reason}") from None


def _check_complete(bundle: Bundle) -> None:
    """Everything the records refer to is in the bundle: no record was dropped."""
    mid = bundle.mission_id
    key = mid.encode()
    if (DB.MISSIONS.value, key) not in bundle.payloads:
        raise BundleError(f"bundle lacks the mission record of {mid}")
    prefix = mission_prefix(mid)
    for db in _LOGS:
        seqs = sorted(
            int.from_bytes(k[len(prefix) :], "big")
            for d, k in bundle.payloads
            if d == db.value and len(k) == len(prefix) + SEQ_BYTES
        )
        if seqs != list(range(1, len(seqs) + 1)):
            missing = next(n for n, s in enumerate(seqs, 1) if n != s)
            raise BundleError(f"bundle lacks record {db.value}/{mid}/{missing}: a record was dropped")
    get_blob = _blob_reader(bundle)
    roots = [
        decode_value(DB.POINTS.value, k, raw, RestorePoint).checkpoint
        for (d, k), raw in bundle.payloads.items()
        if d == DB.POINTS.value
    ]
    if (DB.HEADS.value, key) in bundle.payloads:
        roots.append(decode_value(DB.HEADS.value, key, bundle.payloads[(DB.HEADS.value, key)], str))
    retired = frozenset(bundle_record(bundle).retired)
    for root in roots:
        _check_chain(mid, root, get_blob, bundle.payloads, retired)


def _blob_reader(bundle: Bundle) -> Callable[[str], bytes | None]:
    blobs = {k.decode(): raw for (d, k), raw in bundle.payloads.items() if d == DB.BLOBS.value}

    def get_blob(digest: str) -> bytes | None:
        raw = blobs.get(digest)
        return None if raw is None else open_record(DB.BLOBS.value, digest.encode(), raw)[1]

    return get_blob


def snapshot_bases(bundle: Bundle) -> set[str]:
    """The git commits the bundle's file snapshots are relative to: a workspace it is imported into must
    have them, or its restore points' files cannot be read there."""
    get_blob = _blob_reader(bundle)
    found = (base_of_blob(get_blob(k.decode()) or b"") for d, k in bundle.payloads if d == DB.BLOBS.value)
    return {base for base in found if base}


def _check_chain(
    mid: str,
    digest: str,
    get_blob: Callable[[str], bytes | None],
    payloads: dict[tuple[str, bytes], bytes],
    retired: frozenset[str],
) -> None:
    """Every checkpoint of the chain from `digest`, and what it names, is in the bundle; the chain ends at a
    checkpoint retention removed (`retired`)."""
    while digest:
        data = get_blob(digest)
        if data is None and digest in retired:
            return
        if data is None:
            raise BundleError(f"bundle lacks checkpoint {digest[:16]} of mission {mid}: a record was dropped")
        manifest = msgspec.msgpack.decode(data, type=CheckpointManifest)
        refs = manifest_refs(manifest)
        for tree in manifest_trees(manifest):
            refs += tree_refs(get_blob, tree) or [tree]
        for ref in refs:
            if get_blob(ref) is None:
                raise BundleError(
                    f"bundle lacks blob {ref[:16]} that checkpoint {manifest.number} refers to: a record was dropped"
                )
        for unit, mark in manifest.units.items():
            lane = unit if mark.epoch == 0 else f"{unit}#{mark.epoch}"
            want = log_key(mission_prefix(mid) + lane.encode() + b"\x00", mark.journal_hwm)
            if mark.journal_hwm and (DB.JOURNAL.value, want) not in payloads:
                raise BundleError(
                    f"bundle lacks journal entry {lane}/{mark.journal_hwm} that checkpoint "
                    f"{manifest.number} refers to: a record was dropped"
                )
        digest = manifest.parent


def check_relative_path(path: str) -> None:
    """A bundle's workspace path must be one a workspace's files may have (protocol/treepaths.py)."""
    problem = path_problem(path)
    if problem:
        raise BundleError(f"bundle workspace path {path!r} {problem}; refusing it")


def _check_workspace(bundle: Bundle) -> None:
    ws = bundle.manifest.workspace
    for path in ws.paths:
        check_relative_path(path)
    keys = {k for d, k in bundle.payloads if d == WORKSPACE_DB}
    if ws.kind == "git":
        if len(ws.base_commit) not in (40, 64) or any(c not in "0123456789abcdef" for c in ws.base_commit):
            raise BundleError(f"bundle base commit {ws.base_commit!r} is not a commit id")
        expected = {PATCH_KEY} if ws.paths else set()  # a sandbox with no change carries no patch
    elif ws.kind == "files":
        expected = {p.encode() for p in ws.paths}
        bad = [p for p, mode in ws.modes.items() if mode not in ("x", "l") or p not in ws.paths]
        if bad:
            raise BundleError(f"bundle workspace modes are malformed for {bad[0]!r}")
    else:
        expected = set()
    if keys != expected:
        raise BundleError("bundle workspace section does not match its payloads (a file was dropped or added)")


# -- import: write ------------------------------------------------------------------------------------
def install_txn(txn: Txn, bundle: Bundle, record: MissionRecord) -> None:
    """Write a verified bundle's records (the mission record as re-rooted by the caller)."""
    mid = bundle.mission_id
    if (
        txn.exists(DB.MISSIONS, mid.encode())
        or txn.exists(DB.HEADS, mid.encode())
        or any(True for _ in txn.scan_raw(DB.EVENTS, mission_prefix(mid)))
    ):
        raise BundleError(f"mission {mid} already exists in this store; nothing was imported")
    for entry in bundle.manifest.entries:
        raw = bundle.payloads[(entry.db, entry.key)]
        if entry.db == DB.BLOBS.value:
            txn.put_blob(open_record(entry.db, entry.key, raw)[1])
        elif entry.db == DB.MISSIONS.value:
            txn.put(DB.MISSIONS, entry.key, record)
        elif entry.db in _TYPES:
            txn.put(DB(entry.db), entry.key, decode_value(entry.db, entry.key, raw, _TYPES[entry.db]))


def bundle_record(bundle: Bundle) -> MissionRecord:
    key = bundle.mission_id.encode()
    return decode_value(DB.MISSIONS.value, key, bundle.payloads[(DB.MISSIONS.value, key)], MissionRecord)
