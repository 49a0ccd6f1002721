"""`keel status [ID]`: one mission in detail (read-only), or the list of all as `keel missions` prints it."""

from __future__ import annotations

import argparse
import time
from typing import Any

from keel.server.commands import help_of
from keel.server.commands.common import open_store, print_json
from keel.server.commands.missions import ago, run_missions
from keel.server.engine.control import unit_states
from keel.server.exits import Exit
from keel.storage import leases
from keel.storage import missions as m


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("status", parents=[common], help=help_of("status"))
    p.add_argument("id", nargs="?", help="mission id (or a unique prefix)")
    p.set_defaults(run=run_status)


def run_status(args: argparse.Namespace) -> int:
    if not args.id:
        return run_missions(args)
    with open_store(args, readonly=True) as store:

        def read(txn: Any) -> dict[str, Any]:
            mid = m.resolve_mission_id(txn, args.id)
            record = m.get_mission(txn, mid)
            manifest = m.head_checkpoint(txn, mid)
            return {
                "mission": record,
                "units": manifest.units if manifest else {},
                "states": unit_states(txn, mid),
                "points": len(m.restore_points(txn, mid)),
                "subagents": leases.list_leases(txn, mid),
            }

        data = store.read(read)
    if args.json:
        print_json(data)
        return Exit.OK
    r = data["mission"]
    print(f"mission {r.id}: {r.spec.name}")
    print(f"  state    {r.state.value}" + (f" ({r.pause_reason.value})" if r.pause_reason else ""))
    if r.question:
        print(f"  question {r.question.text}  (unit {r.question.unit}; answer with `keel answer {r.id} TEXT`)")
    if r.error:
        print(f"  error    {r.error}")
    print(f"  restore points {data['points']}")
    for unit_id, state in data["states"].items():
        mark = data["units"].get(unit_id)
        print(f"  {state:<10} {unit_id}" + (f"  {mark.error}" if mark and mark.error else ""))
    _print_subagents(data["subagents"])
    return Exit.OK


def _print_subagents(held: list[Any]) -> None:
    """The registry: one line per unit that ran under a lease (state, epoch, pid, heartbeat, sandbox)."""
    if not held:
        return
    print("  subagents")
    now = time.time()
    for lease in held:
        state = "expired" if leases.expired(lease, now) else lease.state
        print(
            f"    {lease.unit:<12} {state:<9} epoch {lease.epoch:<3} pid {lease.pid:<7} "
            f"heartbeat {ago(lease.heartbeat)}  journal {lease.last_checkpoint}  {lease.sandbox}"
            + (f"  worker {lease.worker} on {lease.hostname}" if lease.worker else "")
            + (f"  handed back: {lease.why}" if lease.why else "")
        )
