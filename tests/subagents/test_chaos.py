"""Chaos: SIGKILL keel's processes on conditions, resume, and check the product against an undisturbed run.

The mission: six units in a git workspace (four in parallel, then two that depend on them), each writing
its own files (so a merge conflict is always a bug), running effectful commands that append a marker to a
side log outside the sandbox (so a repeated effect is visible), with now/random, saved state and a
verification. Every iteration strikes on one *condition*, never on a wall-clock guess:

- `effect`: a unit's command has appended its marker (the effect ran) → kill the host and that unit's
  worker;
- `intent`: an effectful call's intent is journaled and its command is still running → kill the host;
- `worker`: kill a unit's worker (or its agent) after its effect ran, wait until the host started the
  worker again (the lease's epoch moved on) → kill the host;
- `merge`: a merge into the mission branch is in progress (a pre-merge-commit hook holds it) → kill the
  host and `git merge`;
- `completion`: a worker recorded its unit's completion that the host has not checkpointed yet → kill
  the host;
- `checkpoint`: the host is inside a checkpoint's write transaction (fault point) → kill it;
- `resume`: after an `effect` strike, kill the resuming host once it has started a worker again;
- `journal`: a unit's journal is past a random entry → kill a random mix of the host, workers and agents;
- `recovery`: after an `effect` strike, kill the resuming host as soon as it has claimed the mission
  (while it recovers: stops leftovers, repairs git state, takes completions over).

Each iteration asserts that the strike interrupted a live host of an unfinished mission. Then it resumes
until the mission completes, answering an uncertain effect as a person would (the side log tells whether
the command ran). Checked: every effect exactly once; the mission branch's files and the units' results
equal the undisturbed run's; every unit succeeded exactly once; no merge conflict, no re-execution, no
question other than an uncertain effect; the mission completes (never stuck). `KEEL_CHAOS_ITERATIONS`
runs more (CI: two per condition on LMDB, one on PostgreSQL); each condition is a test of its own (so a
parallel run spreads them over its workers), and its summary line goes to
test-artifacts/chaos-summary-<backend>-<condition>.txt. The whole test runs once per storage backend.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import os
import pickle
import random
import signal
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import files, keel, mission_id_of, read, record, sandbox_of, start_keel, unit_events, write_mission
from subagent_helpers import all_leases, git

from keel.protocol.states import MissionState
from keel.storage import missions as m

pytestmark = pytest.mark.usefixtures("store_backend")  # each test runs on LMDB and on PostgreSQL

PHASES = ("effect", "intent", "worker", "merge", "completion", "checkpoint", "resume", "journal", "recovery")
ITERATIONS = int(os.environ.get("KEEL_CHAOS_ITERATIONS", str(2 * len(PHASES))))
PG_ITERATIONS = int(os.environ.get("KEEL_CHAOS_ITERATIONS", str(len(PHASES))))  # the PostgreSQL pass: one each
UNITS = {"a": [], "b": [], "c": [], "d": [], "e": ["a", "b"], "f": ["c", "d", "e"]}
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
HOOK = """#!/bin/sh
# holds the first merge into a mission branch so that the test can kill it half-way
[ -n "$CHAOS_MERGE_MARK" ] || exit 0
[ -e "$CHAOS_MERGE_MARK" ] && exit 0
echo $PPID > "$CHAOS_MERGE_MARK.tmp" && mv "$CHAOS_MERGE_MARK.tmp" "$CHAOS_MERGE_MARK"
sleep 20
"""


class Missed(AssertionError):
    """The strike's condition was not reached while the mission ran: the harness failed, not keel."""


def _units(side: Path) -> list[dict[str, Any]]:
    def unit(uid: str) -> dict[str, Any]:
        diff = f"--- a/{uid}.py\n+++ b/{uid}.py\n@@ -1 +1 @@\n-{uid.upper()} = 1\n+{uid.upper()} = 2\n"
        return {
            "id": uid,
            "after": UNITS[uid],
            "params": {
                "steps": [
                    {"tool": "write_file", "args": {"path": f"{uid}.py", "content": f"{uid.upper()} = 1\n"}},
                    {"tool": "run", "args": {"cmd": f"sleep 0.2; echo {uid}-1 >> {side}"}},
                    {"now": True},
                    {"random": True},
                    {"tool": "apply_diff", "args": {"path": f"{uid}.py", "diff": diff}},
                    {
                        "tool": "run",
                        "args": {"cmd": f"python3 -m py_compile {uid}.py && echo {uid}-2 >> {side}", "verify": True},
                    },
                    {"save_state": {"unit": uid}},
                    {"sleep": 0.2},
                    {"tool": "read_file", "args": {"path": f"{uid}.py"}},
                ]
            },
        }

    return [unit(uid) for uid in UNITS]


def _workspace(folder: Path, kind: str) -> None:
    ws = folder / "ws"
    ws.mkdir()
    (ws / "README.md").write_text("chaos\n")
    if kind == "plain":  # no git: sandboxes are copies, merged file by file
        return
    git(ws, "init", "-q", "-b", "main")
    git(ws, "add", "-A")
    git(ws, "commit", "-q", "-m", "init")
    hook = ws / ".git" / "hooks" / "pre-merge-commit"
    hook.write_text(HOOK)
    hook.chmod(0o755)


def _markers(side: Path) -> list[str]:
    return side.read_text().split() if side.exists() else []


def _until(predicate: Any, what: str, proc: subprocess.Popen[str] | None, timeout: float = 60) -> Any:
    """Poll `predicate` until it returns something truthy; Missed if the host ended first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        if proc is not None and proc.poll() is not None:
            raise Missed(f"the host exited ({proc.returncode}) before {what}")
        time.sleep(0.005)
    raise Missed(f"{what}: not reached in {timeout} s")


def _kill(*pids: int) -> None:
    for pid in pids:
        if pid > 0:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


class Run:
    """One mission in its own folder, struck on one condition."""

    def __init__(self, folder: Path, seed: int, kind: str, store_folder: Callable[[Path], Path]) -> None:
        self.folder, self.rng = folder, random.Random(seed)
        self.store, self.side = store_folder(folder / "store"), folder / "side.log"
        self.merge_mark = folder / "merge.mark"
        self.fault_mark = folder / "checkpoint.mark"
        _workspace(folder, kind)
        self.mission = write_mission(folder, _units(self.side), max_parallel=3)
        self.mid = ""
        self.kind = kind
        self.questions: list[str] = []

    def _leases(self) -> dict[str, Any]:
        return {x.unit: x for x in all_leases(self.store, self.mid)}

    def start(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        return start_keel(*args, store=self.store, env=env)

    def first_run(self, phase: str) -> subprocess.Popen[str]:
        env = {}
        if phase == "merge":
            env["CHAOS_MERGE_MARK"] = str(self.merge_mark)
        if phase == "checkpoint":
            env["KEEL_FAULT_CHECKPOINT"] = f"{self.fault_mark}:0.2"
        host = self.start("run", str(self.mission), env=env)
        self.mid = mission_id_of(host)
        return host

    # -- strikes: each returns the pids it killed, the host's among them -------------------------------
    def strike(self, phase: str, host: subprocess.Popen[str]) -> list[int]:
        unit = self.rng.choice(list(UNITS))
        if phase in ("effect", "resume", "recovery"):
            _until(lambda: f"{unit}-1" in _markers(self.side), f"unit {unit}'s effect", host)
            worker = self._leases()[unit].pid
            return self._killed(host, worker)
        if phase == "journal":
            k = self.rng.randint(1, 8)
            _until(
                lambda: read(self.store, lambda t: m.journal_get(t, self.mid, unit, k)) is not None,
                f"unit {unit}'s journal entry {k}",
                host,
            )
            workers = [x.pid for x in self._leases().values() if x.state == "running" and x.pid > 0]
            agents = [c for pid in workers for c in _children(pid)]
            victims = self.rng.sample(workers + agents, self.rng.randint(0, len(workers + agents)))
            _kill(*victims)
            return [*victims, *self._killed(host)]
        if phase == "intent":

            def intent() -> bool:
                return any(
                    e.phase == "intent"
                    for lane in {x.lane for x in self._leases().values()}
                    for e in read(self.store, lambda t, ln=lane: m.journal_entries(t, self.mid, ln))
                )

            _until(intent, "an effect's intent", host)
            return self._killed(host)
        if phase == "worker":
            _until(lambda: f"{unit}-1" in _markers(self.side), f"unit {unit}'s effect", host)
            held = self._leases()[unit]
            victim = held.pid if self.rng.random() < 0.6 else (_children(held.pid) or [held.pid])[0]
            _kill(victim)
            _until(
                lambda: (x := self._leases()[unit]).epoch > held.epoch and x.pid > 0 and x.pid != held.pid,
                f"unit {unit}'s worker started again",
                host,
            )
            return [victim, *self._killed(host)]
        if phase == "merge":
            pid = _until(
                lambda: self.merge_mark.exists() and self.merge_mark.read_text().strip(), "a merge in progress", host
            )
            return self._killed(host, int(pid))
        if phase == "completion":

            def completed() -> bool:
                head = read(self.store, lambda t: m.head_checkpoint(t, self.mid))
                return any(
                    x.state == "done" and head.units[u].state.value != "succeeded" for u, x in self._leases().items()
                )

            _until(completed, "a completion not yet checkpointed", host)
            return self._killed(host)
        assert phase == "checkpoint"
        _until(
            lambda: (
                self.fault_mark.exists()
                and record(self.store, self.mid).state == MissionState.RUNNING
                and any(x.state == "done" for x in self._leases().values())
            ),
            "a checkpoint in progress",
            host,
        )
        self.fault_mark.unlink()
        _until(self.fault_mark.exists, "the next checkpoint's transaction", host)
        return self._killed(host)

    def _killed(self, host: subprocess.Popen[str], *others: int) -> list[int]:
        assert host.poll() is None, f"the host had already exited ({host.returncode}): the strike came too late"
        _kill(host.pid, *others)
        host.communicate(timeout=30)
        state = record(self.store, self.mid).state
        assert state not in (MissionState.COMPLETED, MissionState.FAILED), f"struck a finished mission ({state})"
        return [host.pid, *others]

    def strike_resume(self, phase: str) -> list[int]:
        """Kill a resuming host once it has taken the mission (`recovery`) or started a worker again."""
        host = self.start("resume", self.mid)

        def working() -> bool:
            rec = record(self.store, self.mid)
            return (
                rec.host is not None
                and rec.host.pid == host.pid
                and (
                    phase == "recovery"
                    or any(x.host_id == rec.host.host_id and x.pid > 0 for x in self._leases().values())
                )
            )

        try:
            _until(working, "the resumed host started a worker", host)
        except Missed:
            if record(self.store, self.mid).state == MissionState.WAITING_INPUT:
                host.communicate(timeout=30)
                return []  # it stopped for a question first: nothing to strike in this resume
            raise
        return self._killed(host)

    # -- to the end ------------------------------------------------------------------------------------
    def finish(self) -> None:
        for _round in range(12):
            rec = record(self.store, self.mid)
            if rec.state == MissionState.COMPLETED:
                return
            if rec.state == MissionState.WAITING_INPUT:
                self._answer(rec)
            done = keel("resume", self.mid, store=self.store, timeout=120)
            assert done.returncode in (0, 3), f"resume exited {done.returncode}: {done.stderr[-2000:]}"
        raise AssertionError(f"stuck: mission {self.mid} is {record(self.store, self.mid).state} after 12 resumes")

    def _answer(self, rec: Any) -> None:
        question = rec.question
        assert question is not None and question.kind == "uncertain-effect", f"unexpected question: {question}"
        self.questions.append(question.kind)
        entry = read(self.store, lambda t: m.journal_get(t, self.mid, question.lane, question.seq))
        cmd = str(entry.result.get("cmd", ""))
        marker = cmd.rsplit("echo ", 1)[1].split(" ")[0] if "echo " in cmd else ""
        happened = not marker or marker in _markers(self.side)
        keel("answer", self.mid, "skip" if happened else "rerun", "--no-resume", store=self.store, check_rc=0)

    def outcome(self) -> dict[str, Any]:
        head = read(self.store, lambda t: m.head_checkpoint(t, self.mid))
        evidence = [e.kind for _, e in read(self.store, lambda t: list(m.evidence_after(t, self.mid)))]
        return {
            "files": files(sandbox_of(self.store, self.mid)),
            "side": _markers(self.side),
            "results": {
                u: [o if isinstance(o, dict) or o is None else "v" for o in mk.result["outputs"]]
                for u, mk in head.units.items()
            },
            "events": unit_events(self.store, self.mid),
            "evidence": evidence,
            "questions": self.questions,
        }


def _kind(seed: int) -> str:
    """Every other round of conditions runs in a workspace without git (but merges need git's hook)."""
    phase = PHASES[seed % len(PHASES)]
    return "plain" if (seed // len(PHASES)) % 2 and phase != "merge" else "git"


def _iteration(folder: Path, seed: int, store_folder: Callable[[Path], Path]) -> dict[str, Any]:
    phase = PHASES[seed % len(PHASES)]
    run = Run(folder, seed, _kind(seed), store_folder)
    host = run.first_run(phase)
    killed = run.strike(phase, host)
    if phase in ("resume", "recovery"):
        killed += run.strike_resume(phase)
    run.finish()
    return {"phase": phase, "kind": run.kind, "kills": len(killed), **run.outcome()}


def _reference(folder: Path, kind: str, store_folder: Callable[[Path], Path]) -> dict[str, Any]:
    folder.mkdir()
    run = Run(folder, 0, kind, store_folder)
    host = run.first_run("none")
    host.communicate(timeout=120)
    assert host.returncode == 0, "the undisturbed run did not complete"
    return run.outcome()


_REFERENCES: dict[str, dict[str, Any]] = {}  # the undisturbed runs, made once per test run


@pytest.fixture
def references(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The undisturbed runs (a git and a plain workspace) every condition's iterations are checked against:
    made once, on LMDB (the product does not depend on the store), and shared by the run's xdist workers
    through a file named by the run's id."""
    if _REFERENCES:
        return _REFERENCES
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    shared = tmp_path_factory.getbasetemp().parent / f"chaos-references-{run_id}.pickle" if run_id else None
    with contextlib.ExitStack() as held:
        if shared is not None:
            lock = held.enter_context(shared.with_suffix(".lock").open("w"))
            fcntl.flock(lock, fcntl.LOCK_EX)  # one worker makes them; the others wait and read them
            if shared.exists():
                _REFERENCES.update(pickle.loads(shared.read_bytes()))
                return _REFERENCES
        root = tmp_path_factory.mktemp("chaos-references")
        made = {kind: _reference(root / kind, kind, lambda folder: folder) for kind in ("git", "plain")}
        for reference in made.values():
            assert sorted(reference["side"]) == sorted(f"{u}-{k}" for u in UNITS for k in (1, 2))
        if shared is not None:
            shared.write_bytes(pickle.dumps(made))
        _REFERENCES.update(made)
    return _REFERENCES


@pytest.mark.slow
@pytest.mark.timeout(max(1800, ITERATIONS * 20))
@pytest.mark.parametrize("phase", PHASES)
def test_kills_on_conditions_never_lose_or_repeat_work(
    tmp_path: Path, store_folder: Callable[[Path], Path], backend: str, phase: str, references: Any
) -> None:
    def one(i: int) -> dict[str, Any]:
        folder = tmp_path / f"run{i}"
        folder.mkdir()
        try:
            return _iteration(folder, i, store_folder)
        except Exception as exc:  # a keel process that printed nothing, an assertion: this iteration failed
            return {"phase": PHASES[i % len(PHASES)], "error": f"{type(exc).__name__}: {exc}"}

    total = PG_ITERATIONS if backend == "postgresql" else ITERATIONS
    seeds = [i for i in range(total) if PHASES[i % len(PHASES)] == phase]  # this condition's share of the rounds
    if not seeds:
        pytest.skip(f"{total} iterations run no round of the {phase} condition")
    with ThreadPoolExecutor(max_workers=2) as pool:
        outcomes = list(pool.map(one, seeds))
    problems = collections.Counter()
    failures = []
    for i, out in zip(seeds, outcomes, strict=True):
        if "error" in out:
            problems["missed" if out["error"].startswith("Missed") else "stuck or failed"] += 1
            failures.append(f"iteration {i} ({out['phase']}): {out['error'][:600]}")
            continue
        reference = references[out["kind"]]
        counts = collections.Counter(out["side"])
        if any(n > 1 for n in counts.values()):
            problems["duplicated effects"] += sum(n - 1 for n in counts.values())
            failures.append(f"iteration {i} ({out['phase']}): effects repeated: {out['side']}")
        if set(counts) != set(reference["side"]):
            problems["lost effects"] += 1
            failures.append(f"iteration {i} ({out['phase']}): effects {sorted(counts)}")
        if out["files"] != reference["files"]:
            problems["wrong trees"] += 1
            failures.append(f"iteration {i} ({out['phase']}): mission branch files differ: {sorted(out['files'])}")
        if out["results"] != reference["results"]:
            problems["wrong results"] += 1
            failures.append(f"iteration {i} ({out['phase']}): unit results differ")
        for unit in UNITS:
            states = [s for u, s in out["events"] if u == unit]
            if states.count("succeeded") != 1 or states[-1] != "succeeded":
                problems["units redone"] += 1
                failures.append(f"iteration {i} ({out['phase']}): unit {unit}: {states}")
        if {"reexecuted", "merge-conflict"} & set(out["evidence"]):
            problems["re-executions or conflicts"] += 1
            failures.append(f"iteration {i} ({out['phase']}): evidence {out['evidence']}")
    ok = [o for o in outcomes if "error" not in o]
    kinds = collections.Counter(o["kind"] for o in ok)
    summary = (
        f"chaos ({phase}): {len(outcomes)} iterations ({kinds['git']} git, {kinds['plain']} plain), "
        f"{sum(o['kills'] for o in ok)} kills, "
        f"{sum(len(o['side']) for o in ok)} effects checked, "
        f"{sum(len(o['questions']) for o in ok)} uncertain effects answered; "
        f"duplicates {problems['duplicated effects']}, stuck {problems['stuck or failed']}, "
        f"wrong trees {problems['wrong trees']}, missed strikes {problems['missed']}"
    )
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / f"chaos-summary-{backend}-{phase}.txt").write_text(summary + "\n" + "\n".join(failures) + "\n")
    print(summary)
    assert not failures, summary + "\n" + "\n".join(failures[:20])
