"""`keel run FILE` and `keel resume ID`: run a mission's host in the foreground, or detached.

Exit codes: 0 completed, 3 paused (operator, waiting for an answer, policy, disk full) or offline, 4 failed, 2 usage
(e.g. a host already runs this mission), 6 not found. With `--wait-online` an offline mission does not
end the host: it probes the providers and resumes the mission when one answers (docs/providers.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from keel.protocol.states import MissionState, PauseReason
from keel.server.commands import help_of
from keel.server.commands.common import open_store, store_path
from keel.server.engine import control
from keel.server.engine.step.progress import Progress
from keel.server.exits import Exit
from keel.server.hoststart import start_host
from keel.storage import Store
from keel.storage import missions as m
from keel.storage.location import prepare_keel_dir


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("run", parents=[common], help=help_of("run"))
    p.add_argument("file", help="mission file (TOML)")
    _host_flags(p)
    p.add_argument(
        "--queue",
        action="store_true",
        help="record the mission running with no host, for a `keel supervise` of the store to host; print the id",
    )
    p.set_defaults(run=run_mission)
    p = sub.add_parser("resume", parents=[common], help=help_of("resume"))
    p.add_argument("id", help="mission id (or a unique prefix)")
    _host_flags(p)
    p.set_defaults(run=resume_mission)


def _host_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--detach", action="store_true", help="run the host as a detached process; print the id")
    p.add_argument("--plain", action="store_true", help="plain progress lines even on a terminal")
    p.add_argument(
        "--wait-online",
        action="store_true",
        help="when every model provider is unreachable, wait (probing) and resume by itself "
        "instead of exiting with code 3",
    )


def exit_for_state(state: MissionState) -> int:
    if state == MissionState.COMPLETED:
        return Exit.OK
    if state == MissionState.FAILED or state == MissionState.CANCELLED:
        return Exit.MISSION_FAILED
    return Exit.PAUSED


def run_mission(args: argparse.Namespace) -> int:
    path = store_path(args)
    prepare_keel_dir(path)
    with Store.open(path) as store:
        if args.queue:
            print(control.queue_mission(store, Path(args.file)).id)
            return Exit.OK
        record = control.create_mission(store, Path(args.file))
        if not args.detach:
            progress = Progress.for_terminal(args.json, args.plain)
            progress.event("mission", mission=record.id, name=record.spec.name, units=len(record.spec.units))
            return _foreground(path, record.id, progress, store, args.wait_online)
    start_host(path, record.id)  # with the store closed: the host may be a fork of this process
    print(record.id)
    return Exit.OK


def resume_mission(args: argparse.Namespace) -> int:
    path = store_path(args)
    with open_store(args) as store:
        mission_id = store.read(lambda t: m.resolve_mission_id(t, args.id))
        if not args.detach:
            control.wait_for_stopping_host(store, path, mission_id)
            progress = Progress.for_terminal(args.json, args.plain)
            return _foreground(path, mission_id, progress, store, args.wait_online)
    control.resume(path, mission_id, detach=True, start=start_host)  # with the store closed, as above
    print(mission_id)
    return Exit.OK


def _foreground(path: Path, mission_id: str, progress: Progress, store: Store, wait_online: bool) -> int:
    # The host's code (about 150 ms of imports) is loaded only by the process that hosts: `--detach` starts
    # the host at once, and recovery by hand is the time until that process runs.
    from keel.server.engine.host import run_host_blocking

    state = run_host_blocking(path, mission_id, progress, store, wait_online)
    record = store.read(lambda t: m.find_mission(t, mission_id))
    if record is None:  # deleted once its host let go (a cancelled mission, at once): the host's end stands
        progress.line(f"mission {mission_id} ended {state.value} and was deleted since")
    elif record.question is not None and state == MissionState.WAITING_INPUT:
        progress.line(
            f"mission {mission_id} waits for an answer: {record.question.text}\n"
            f"  answer with: keel answer {mission_id} TEXT"
        )
    elif state == MissionState.OFFLINE:
        progress.line(
            f"mission {mission_id} is offline: {record.error}\n"
            f"  continue when a provider answers again: keel resume {mission_id} --wait-online"
        )
    elif state == MissionState.PAUSED and record.pause_reason == PauseReason.DISK_FULL:
        progress.line(f"mission {mission_id} paused (disk_full): {record.error} (keel resume {mission_id})")
    elif state == MissionState.PAUSED and record.error:
        progress.line(
            f"mission {mission_id} paused ({record.pause_reason}): {record.error}\n"
            f"  continue with: keel resume {mission_id}"
        )
    elif state == MissionState.PAUSED:
        progress.line(f"mission {mission_id} paused; continue with: keel resume {mission_id}")
    elif state == MissionState.FAILED:
        progress.line(f"mission {mission_id} failed: {record.error}")
    return exit_for_state(state)
