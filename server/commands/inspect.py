"""`keel status [ID]`: one mission in detail (read-only): its state, question, units, the logs on this machine
(the host's, and each unit agent's stderr) and its subagents; or the list of all as `keel missions` prints it."""

from __future__ import annotations

import argparse
import time
from typing import Any

from keel.protocol.records import UnitLease, WorkerPlace
from keel.protocol.states import LeaseState
from keel.server.commands import help_of
from keel.server.commands.common import open_store, print_json, store_path
from keel.server.commands.missions import ago, run_missions
from keel.server.engine.files import places
from keel.server.engine.unitview import unit_states
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
                **_evidence(txn, mid),
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
    if (log := places.log_path(store_path(args), r.id)).exists():
        print(f"  log      {log}")
    for unit_id, state in data["states"].items():
        mark = data["units"].get(unit_id)
        print(f"  {state:<10} {unit_id}" + (f"  {mark.error}" if mark and mark.error else ""))
        if (agent_log := places.agent_log_path(store_path(args), r.id, unit_id)).exists():
            print(f"             agent's stderr: {agent_log}")
    _print_subagents(data["subagents"])
    if data["evidence"]:
        print("  evidence " + ", ".join(f"{n} {kind}" for kind, n in sorted(data["evidence"].items())))
        for item in data["notable"]:
            print(f"    {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(item.at))}  {item.kind:<14} {item.summary}")
    return Exit.OK


ROUTINE = ("tool", "diff")  # evidence of every step: counted; the rest (verifications, answers, …) listed
NOTABLE = m.RECENT  # the tally keeps as many of each kind


def _evidence(txn: Any, mission_id: str) -> dict[str, Any]:
    """The mission's evidence counted by kind, and its last NOTABLE items that are not routine: read from the
    mission's tally and those items alone, never the whole evidence log."""
    tally = m.evidence_tally(txn, mission_id)
    seqs = sorted(seq for kind, recent in tally.recent.items() if kind not in ROUTINE for seq in recent)[-NOTABLE:]
    notable = [item for seq in seqs for _, item in m.evidence_after(txn, mission_id, seq - 1, upto=seq)]
    return {"evidence": dict(tally.kinds), "notable": notable}


def _print_subagents(held: list[Any]) -> None:
    """The registry: one line per unit that ran under a lease (state, epoch, heartbeat, journal, where: the
    worker process and its sandbox, on the machine that ran it)."""
    if not held:
        return
    print("  subagents")
    now = time.time()
    for lease in held:
        state = "expired" if leases.expired(lease, now) else lease.state
        print(
            f"    {lease.unit:<12} {state:<9} epoch {lease.epoch:<3} heartbeat {ago(lease.heartbeat)}  "
            f"journal {lease.place.last_checkpoint}  {where_it_runs(lease)}"
            + (f"  handed back: {lease.why}" if lease.why else "")
        )


def where_it_runs(lease: UnitLease) -> str:
    """The process that runs (or ran) a unit and its sandbox, named by the machine they are on."""
    sandbox = lease.place.sandbox
    place = lease.place.ran_on or (
        WorkerPlace(lease.worker, lease.hostname, lease.pid, sandbox) if lease.worker else None
    )
    if place is not None:
        pid = f"pid {place.pid}" if place.pid else "not started yet"
        return f"worker {place.worker} on {place.hostname or '?'} ({pid}), sandbox there {place.sandbox or '-'}"
    if lease.state == LeaseState.OFFERED:
        return "offered to workers"
    pid = f"pid {lease.pid}" if lease.pid else "not started"
    return f"host ({pid}) on {lease.hostname or 'this machine'}, sandbox {sandbox or '-'}"
