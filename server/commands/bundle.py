"""`keel export ID -o FILE` and `keel import FILE [--workspace DIR] [--allow-unsigned]`.

Export reads the mission's records in one read transaction, captures its sandbox (server/sandboxcopy.py)
and writes the bundle (storage/bundle.py), signed when a signing key is configured (server/signing.py).
Import verifies the whole bundle and the workspace first; then it rebuilds the sandbox and writes every
record in ONE write transaction at the very end, so a refused import leaves the store as it was (and
removes the sandbox it made). A mission id that already exists is refused.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from keel.protocol.states import TERMINAL_MISSION_STATES
from keel.server import sandboxcopy, signing
from keel.server.commands import help_of
from keel.server.commands.common import open_store, print_json, store_path
from keel.server.engine import checkpoint
from keel.server.engine.files import places, trees
from keel.server.engine.hostlock import host_alive
from keel.server.engine.units import registry
from keel.server.exits import Exit
from keel.storage import Store, Txn, leases
from keel.storage import bundle as b
from keel.storage import missions as m
from keel.storage.location import prepare_keel_dir, store_exists


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("export", parents=[common], help=help_of("export"))
    p.add_argument("id", help="mission id (or a unique prefix)")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="bundle file to write")
    p.add_argument(
        "--base",
        default="",
        metavar="COMMIT",
        help="commit the sandbox changes are relative to (default: where the sandbox branched off)",
    )
    p.set_defaults(run=run_export)
    p = sub.add_parser("import", parents=[common], help=help_of("import"))
    p.add_argument("file", help="bundle file")
    p.add_argument(
        "--workspace",
        default=".",
        metavar="DIR",
        help="the workspace the mission continues in (a clone holding the base commit); default .",
    )
    p.add_argument("--allow-unsigned", action="store_true", help="accept a bundle that carries no signature")
    p.set_defaults(run=run_import)


def run_export(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        mission_id = store.read(lambda t: m.resolve_mission_id(t, args.id))
        record = store.read(lambda t: m.get_mission(t, mission_id))
        if record.state not in TERMINAL_MISSION_STATES and host_alive(record):
            raise b.BundleError(
                f"mission {mission_id} is running; pause it first (`keel pause {mission_id} --wait 30`), then export"
            )
        sandbox = Path(record.sandbox or places.sandbox_path(store_path(args), mission_id))
        if record.state not in TERMINAL_MISSION_STATES:
            _carry_unit_work(store, mission_id, sandbox)
        records = store.read(lambda t: b.collect_records(t, mission_id))
    section, payloads = sandboxcopy.capture(sandbox, Path(record.workspace or "."), args.base)
    records += [(b.WORKSPACE_DB, key, data) for key, data in payloads]
    key = signing.signing_key()
    data = b.write_bundle(mission_id, records, section, signing_key=key)
    out = Path(args.output)
    tmp = out.with_name(out.name + ".part")
    tmp.write_bytes(data)
    os.replace(tmp, out)
    summary = {
        "mission": mission_id,
        "file": str(out),
        "bytes": len(data),
        "records": len(records),
        "workspace": section.kind,
        "base_commit": section.base_commit,
        "signed": key is not None,
    }
    if args.json:
        print_json(summary)
    else:
        print(
            f"exported mission {mission_id} to {out}: {len(records)} records, {len(data)} bytes, "
            f"workspace {section.kind}" + (f" against {section.base_commit[:12]}" if section.base_commit else "")
        )
        if key is None:
            print("keel: note: the bundle is NOT signed (no signing key; `keel key set --signing`)", file=sys.stderr)
    return Exit.OK


def _carry_unit_work(store: Store, mission_id: str, sandbox: Path) -> None:
    """A bundle carries the mission sandbox only: unfinished units' work goes into it first."""
    carried, conflict = registry.carry_unfinished(store, mission_id, sandbox)
    if carried:
        _checkpoint_carried(store, mission_id, sandbox, carried)
        print(
            f"keel: merged the unfinished work of unit(s) {', '.join(carried)} into the mission sandbox "
            f"(their sandboxes stay on this machine)",
            file=sys.stderr,
        )
    if conflict is not None:
        raise b.BundleError(
            f"cannot export mission {mission_id}: {conflict} (work of an unfinished unit, "
            f"which the bundle would lose); resume the mission until that unit finishes, "
            f"then export"
        )


def _checkpoint_carried(store: Store, mission_id: str, sandbox: Path, carried: list[str]) -> None:
    """The mission sandbox now holds the carried work: a checkpoint names its files, and, for each unit,
    the snapshot of its sandbox at its mark both as its files and as the files it started from (its lease
    since the carry), so a restore to this point makes each unit's sandbox again with nothing left to merge
    of what was carried, replays its journal and goes on. A resume that checks the sandbox against its
    HEAD's files (after a restore with files) finds them too, here and where the bundle is imported."""
    files = trees.Snapshotter()
    scan = files.scan(sandbox)

    def write(txn: Txn) -> None:
        head = m.head_checkpoint(txn, mission_id)
        if head is None:
            return
        manifest = msgspec.structs.replace(
            head,
            number=head.number + 1,
            reason=f"export: carried the work of unit(s) {', '.join(carried)}",
            created_at=time.time(),
            parent=m.head(txn, mission_id) or "",
            units=checkpoint.with_unit_trees(head.units, leases.list_leases(txn, mission_id)),
            sandbox_tree=files.store_txn(txn, sandbox, scan),
        )
        m.commit_checkpoint(txn, manifest)

    store.write(write)


def run_import(args: argparse.Namespace) -> int:
    path = store_path(args).resolve()
    try:
        data = Path(args.file).read_bytes()
    except OSError as exc:
        raise b.BundleError(f"cannot read bundle {args.file}: {exc.strerror}") from None
    bundle = b.read_bundle(data, signing_key=signing.signing_key(), allow_unsigned=args.allow_unsigned)
    workspace = Path(args.workspace).resolve()
    if not workspace.is_dir():
        raise b.BundleError(f"workspace {workspace} is not a folder")
    mission_id = bundle.mission_id
    if store_exists(path):
        with Store.open(path, create=False) as store:
            if store.read(lambda t: m.find_mission(t, mission_id)) is not None:
                raise b.BundleError(
                    f"mission {mission_id} already exists in the store at {path}; "
                    "nothing was imported (import into another store)"
                )
    sandboxcopy.check_applicable(bundle, workspace)
    record = _rerooted(bundle, workspace, path)
    sandboxcopy.rebuild(bundle, workspace, Path(record.sandbox), mission_id)
    try:
        prepare_keel_dir(path)
        with Store.open(path) as store:
            store.write(lambda t: b.install_txn(t, bundle, record))
    except BaseException:
        sandboxcopy.remove(workspace, Path(record.sandbox), mission_id, git=bundle.manifest.workspace.kind == "git")
        raise
    if args.json:
        print_json(
            {
                "mission": mission_id,
                "state": record.state.value,
                "signed": bundle.signed,
                "sandbox": record.sandbox,
                "records": len(bundle.manifest.entries),
            }
        )
    else:
        print(
            f"imported mission {mission_id} ({record.state.value}, "
            f"{'signed' if bundle.signed else 'UNSIGNED'}); continue with `keel resume {mission_id}`"
        )
    return Exit.OK


def _rerooted(bundle: b.Bundle, workspace: Path, store: Path) -> Any:
    record = b.bundle_record(bundle)
    mission_file = workspace / record.mission_file if record.mission_file else None
    sandbox = places.sandbox_path(store, record.id) if bundle.manifest.workspace.kind != "none" else None
    return msgspec.structs.replace(
        record,
        workspace=str(workspace),
        sandbox=str(sandbox) if sandbox else "",
        host=None,
        mission_file=str(mission_file) if mission_file is not None and mission_file.is_file() else "",
    )
