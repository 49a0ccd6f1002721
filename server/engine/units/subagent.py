"""A subagent: the worker process that runs one unit's agent in the unit's own sandbox, under a lease.

    python -m keel.server.engine.units.subagent --store S --mission M --unit U --epoch E --sandbox DIR --ttl T \
        [--cgroup CG] -- AGENT...

The host speaks the agent protocol to this process's stdin/stdout exactly as to an agent; the worker
passes every frame through to the real agent (its child, working in DIR) and adds what needs a process
of its own next to the agent:
- a heartbeat on its lease (storage/leases.py), fenced by its epoch: once another epoch holds the
  lease, this worker stops (after a short grace) without writing anything;
- the unit's completion: when the agent answers `unit/run`, the unit's changes are committed on its
  branch and the completion (result, commit, tree digest) is recorded in ONE transaction that checks the
  epoch — a stale worker's late completion is rejected, logged as an event, and never reaches the host;
- replay: a restarted agent's requests that the journal recorded as done are answered here from the
  table the host sends before `unit/run`, while they match it; the first frame that does not goes to the
  host, after a notice of how many were answered (server/engine/step/replay.py);
- a store it cannot open (a password it was not given, a role the server refuses): it exits at once with
  EXIT_NO_STORE and the reason as its last line, which the host reports (unitrun.py);
- parent death: stdin closing (or the parent pid changing) makes it record `orphaned`, stop the agent
  and exit within 2 s. Journal entries stay with the host (its group-committing writer).
- its run's processes: it enters its run's cgroup before it starts its agent (`--cgroup`, made by the
  host; runtree.py) and is a child subreaper, so that whatever the agent starts, however it detaches, is
  below it or in the cgroup; on every way out it kills all of it.
- a full disk: a heartbeat that cannot be written is skipped (never the store's reserve: that is the
  host's); a completion that cannot be committed on the branch or recorded answers `unit/run` with
  ERR_DISK_FULL, so that the host pauses (disk_full) and the unit completes when the mission resumes.
This module starts the agent with little loaded; the loops are units/workerloop.py, loaded while the agent
starts. Depends on protocol and the engine's units/runtree and units/workerloop; never on the host.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from keel.protocol.environblock import blank_secrets, without_store_env
from keel.protocol.lean import import_msgspec
from keel.server.engine.units import agentfork, runtree


def start_agent(command: list[str], sandbox: Path) -> agentfork.AgentChild:
    """The unit's agent, working in its sandbox. It gets nothing from the host until this worker holds
    the lease (workerloop.Worker.run), so it starts before the rest of the worker is loaded and while the
    store opens; a worker that does not get the lease stops it. One of keel's own agents is a fork of this
    worker (units/agentfork.py), anything else a new process."""
    env = without_store_env(os.environ)  # the store's settings are this process's, never its agent's
    forked = agentfork.start(command, sandbox, env)
    if forked is not None:
        return forked
    # Its own process group, inside this worker's session: _stop_agent kills the group (the agent and
    # whatever it started), and a host that kills this worker kills the session, agent included.
    return subprocess.Popen(
        command,
        cwd=str(sandbox),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        bufsize=0,  # stdin unbuffered: each frame is one write; stdout is read buffered (_from_agent)
        process_group=0,
    )


def main(argv: list[str] | None = None) -> int:
    blank_secrets()  # the store's settings it was given: its agent cannot read them from its /proc environ
    parser = argparse.ArgumentParser(prog="keel-subagent")
    for name in ("store", "mission", "unit", "sandbox"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--epoch", type=int, required=True)
    parser.add_argument("--ttl", type=float, default=15.0)
    parser.add_argument("--cgroup", default="", help="the run's cgroup, made by the host (runtree.py)")
    parser.add_argument("agent", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    args.agent = args.agent[1:] if args.agent[:1] == ["--"] else args.agent
    if not args.agent:
        parser.error("no agent command after --")
    if why := runtree.enter(args.cgroup):  # before anything is started: all of it is in the run's cgroup
        sys.stderr.write(f"keel subagent {args.mission}/{args.unit}: {why}\n")
    agent = start_agent(args.agent, Path(args.sandbox))
    # The rest of the worker (its loops, the store, git and snapshots: about 60 ms of imports) loads while the
    # agent starts: a unit's start, and recovery, wait for the slower of the two instead of both in turn.
    code = load_loops().serve(args, agent)
    sys.stderr.flush()
    os._exit(code)


def load_loops() -> ModuleType:
    """The worker's loops (units/workerloop.py), with msgspec loaded at less cost (protocol/lean.py)."""
    import_msgspec()
    from keel.server.engine.units import workerloop

    return workerloop


if __name__ == "__main__":
    main()
