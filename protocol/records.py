"""Stored record types: mission records, journal entries, checkpoints, restore points, control, events.

Every type here is written to the store inside a sealed record (storage/record.py). Schema evolution:
new fields get defaults; a field never changes its type; a record that changes shape is rewritten by a
schema migration (storage/migrations.py).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from keel.protocol.spec import MissionSpec, UnitSpec
from keel.protocol.states import LeaseState, MissionState, PauseReason, QuestionKind, Resolution, UnitState

JournalKind = Literal[
    "model/complete", "tool/run", "human/ask", "now", "random", "state/save", "plan/add", "evidence/add"
]
ToolClass = Literal["read_only", "idempotent", "effectful"]


class HostInfo(msgspec.Struct, frozen=True, omit_defaults=True):
    """The process that runs a mission right now."""

    host_id: str
    pid: int
    started_at: float
    hostname: str = ""


class HostLease(msgspec.Struct, frozen=True, omit_defaults=True):
    """Which host may run a mission (storage/hostlease.py): one at a time, on any machine. `epoch` is the
    fencing token every write of that host checks; `heartbeat` is by the store's clock."""

    mission: str
    epoch: int
    host_id: str
    pid: int
    hostname: str
    heartbeat: float
    ttl_s: float


class Question(msgspec.Struct, frozen=True, omit_defaults=True):
    unit: str
    seq: int
    text: str
    choices: tuple[str, ...] = ()
    kind: QuestionKind = QuestionKind.ASK
    fingerprint: str = ""  # of the journaled request the answer belongs to
    lane: str = ""  # the journal lane (unit id, or unit id#epoch after a restore)
    epoch: int = 0  # of the unit's lease the question is about, which the answer acts on (0: asked by an older keel)


class MissionRecord(msgspec.Struct, frozen=True, omit_defaults=True):
    """The live row of a mission: identity, spec and lifecycle state."""

    id: str
    spec: MissionSpec
    state: MissionState
    created_at: float
    updated_at: float
    workspace: str
    sandbox: str = ""
    pause_reason: PauseReason | None = None
    question: Question | None = None
    error: str = ""
    host: HostInfo | None = None
    forked_from: str = ""
    mission_file: str = ""
    control_seen: int = 0  # the last Control record the host has acted on
    machine: str = ""  # the machine (node name) whose workspace holds `workspace` and `sandbox`; "" = unknown
    # checkpoints retention removed (`keel gc --keep-last/--keep`) that kept checkpoints name as their parent:
    # a chain ends there (storage/missions.parent_checkpoint); and the mission's first file snapshot, kept
    # for `keel apply` once the checkpoint that held it is gone
    retired: tuple[str, ...] = ()
    start_tree: str = ""


class WorkerPlace(msgspec.Struct, frozen=True, omit_defaults=True):
    """Where a `keel worker` ran a unit: kept in its lease once its files were brought to the mission host."""

    worker: str
    hostname: str = ""
    pid: int = 0
    sandbox: str = ""


class Placement(msgspec.Struct, frozen=True, omit_defaults=True):
    """Where a unit's files are: its sandbox and branch, the stored snapshots that can make the sandbox again
    (on another machine, from a restore point), and what its run left there (its commit, its result)."""

    sandbox: str = ""
    branch: str = ""
    base: str = ""  # the mission-branch commit a git sandbox started from ("" for a copy)
    tree: str = ""  # sandbox tree digest at `last_checkpoint` (the last journal entry that changed files)
    base_tree: str = ""  # on a shared store: the stored snapshot the sandbox started from (see `tree`)
    last_checkpoint: int = 0  # journal seq of the latest durable entry of this unit
    saved_at: int = -1  # journal seq of the lane's newest done `state/save` (0: none; -1: not known, read the lane)
    commit: str = ""  # the unit's commit on its branch (git sandboxes) once done
    merged: bool = False
    result: Any = None
    ran_on: WorkerPlace | None = None  # the worker that ran it, once its files were brought to its host
    # the sandbox is a plain folder, not a git worktree (a copy of a mission sandbox without git, or made from
    # the stored snapshots): merged file by file against the digests it started from, kept next to it
    copied: bool = False

    def is_copy(self) -> bool:
        """The sandbox is a plain folder (`copied`; records of older keels said so with `base` "copy")."""
        return self.copied or self.base == "copy"

    def made(self) -> bool:
        """A sandbox was made for the lease (a git worktree from its base commit, or a copy), not only named."""
        return bool(self.base) or self.is_copy()

    def started_in(self, sandbox: str, base: str) -> Placement:
        """Where a new worker of the unit's lane works: in `sandbox`, started from `base` (made as the lane's
        sandbox is: a copy stays one), going on from the lane's snapshots and journal mark (nothing of a
        finished run: no branch, commit, result)."""
        return Placement(
            sandbox=sandbox,
            base="" if base == "copy" else base,
            tree=self.tree,
            base_tree=self.base_tree,
            last_checkpoint=self.last_checkpoint,
            saved_at=self.saved_at,
            copied=self.is_copy() or base == "copy",
        )

    def kept(self) -> bool:
        """The sandbox can be made again from the store, anywhere (an outside agent's has no snapshot)."""
        return sandbox_kept(self.tree, self.base_tree)


def is_tree_ref(value: str) -> bool:
    """A sandbox_tree naming a snapshot blob (checkpoints of older keels hold a 32-hex digest of the
    files instead, which names no blob: those points restore state but not files)."""
    return len(value) == 64


def sandbox_kept(tree: str, base_tree: str) -> bool:
    """A unit's sandbox can be made again from the store: both its snapshot and the snapshot of the
    sandbox it started from (its base) are stored, not only digests of them (a lease's `Placement`, a
    checkpoint's unit mark)."""
    return is_tree_ref(tree) and is_tree_ref(base_tree)


class WorkerOffer(msgspec.Struct, frozen=True, omit_defaults=True):
    """A unit's dealings with `keel worker`s (server/engine/units/remote.py): the worker holding it, the spec
    it was offered with, and why it came back to its mission host."""

    worker: str = ""  # the `keel worker` holding an offered unit; "" = none (yet)
    spec: UnitSpec | None = None  # an offered unit's spec, for the worker that claims it
    why: str = ""  # why its mission host runs it: what a returned unit needs of it, or a restore left no sandbox


class UnitLease(msgspec.Struct, frozen=True, omit_defaults=True):
    """A unit's lease in the subagent registry (storage/leases.py): who runs it, and the fencing token
    (`epoch`) every journal write and the completion of that unit must match. Stored as one record with
    where its files are (`place`) and, for a unit offered to `keel worker`s, the offer (`offer`; None for a
    unit its host runs with nothing to say why), so one write changes all three.

    `state`: its lifecycle (protocol/states.LeaseState, moved only by storage/leases.py's named operations):
    offered (waiting for a `keel worker`), running (heartbeating), returned (a worker handed it back),
    orphaned (the worker saw its parent die and stopped), expired (taken over: the
    heartbeat went stale), done (completion recorded: `place.result`, `place.commit`). Stored as the same
    strings as before it was an enum.
    """

    unit: str
    lane: str
    epoch: int
    host_id: str
    state: LeaseState = LeaseState.RUNNING
    pid: int = 0
    hostname: str = ""
    heartbeat: float = 0.0
    ttl_s: float = 15.0
    started_at: float = 0.0
    resolution: Resolution = Resolution.NONE  # a person's answer about this run, not yet acted on
    place: Placement = Placement()
    offer: WorkerOffer | None = None

    @property
    def worker(self) -> str:
        """The `keel worker` holding the unit; "" = its mission host."""
        return self.offer.worker if self.offer is not None else ""

    @property
    def why(self) -> str:
        """Why its mission host runs the unit (`WorkerOffer.why`); "" = nothing to say."""
        return self.offer.why if self.offer is not None else ""


class StepCost(msgspec.Struct, frozen=True, omit_defaults=True):
    wall_ms: float = 0.0
    tokens: int = 0


class EffectMark(msgspec.Struct, frozen=True, omit_defaults=True):
    """What an effect of an outside agent is, recorded with its intent: `key` names what it does (the
    normalised command or edit and its working folder, never an id or time the agent minted), `before`
    the digest of the sandbox's files it started from, `after` (once its outcome is recorded) the digest
    of the files it left; `text` is the normalised action for people."""

    key: str
    before: str
    after: str = ""
    text: str = ""


class LaneBase(msgspec.Struct, frozen=True, omit_defaults=True):
    """A journal lane that begins as another: its entries 1..`upto` are those of lane `lane` of the same
    mission, except where it holds an entry of its own (storage/missions.py reads them so). A restore's lane
    refers to the lane it restores instead of copying it; it is entry 0 of the lane (`JournalEntry.base`)."""

    lane: str
    upto: int


class JournalEntry(msgspec.Struct, frozen=True, omit_defaults=True, gc=False):
    """One recorded agent request of a unit, keyed by (mission, unit, seq).

    `phase` is "intent" for an effectful call that started but whose result is not yet recorded, and
    "done" once the result (or error) is; replay only ever returns "done" entries. A person's answer to an
    uncertain effect is typed, never read back from `summary` (which is words for people): `rerun_approved`
    (run it again) on the intent, or `skipped` (it had already happened) on the entry it became. Stores of
    schema 1 held both in the summary; storage/migrations.py moves them. keel marks `rerun_approved` itself
    on the intent of a verification a full disk failed (it ran to its end: only its verdict is lost).

    `gc=False`: a host holds a unit's whole journal (100k entries is an ordinary long unit) and never in a
    reference cycle (entries are frozen and built from decoded data), so the cycle collector need not
    track them; a resume's read of a long lane spent a fifth of its time in collections otherwise.
    """

    seq: int
    kind: str
    fingerprint: str
    phase: Literal["intent", "done"] = "done"
    result: Any = None
    error: str = ""
    tool_class: ToolClass | None = None
    served_model: str = ""
    at: float = 0.0
    cost: StepCost = StepCost()
    summary: str = ""
    rerun_approved: bool = False
    skipped: bool = False
    effect: EffectMark | None = None  # an effect's identity and the files it started from (engine/step/effects.py)
    base: LaneBase | None = None  # only on entry 0: the lane this one begins as (kind LANE_BASE)


LANE_BASE = "lane/base"  # the kind of a lane's entry 0, which names the lane it begins as


class UnitMark(msgspec.Struct, frozen=True, omit_defaults=True):
    """A unit's state inside a checkpoint."""

    state: UnitState
    journal_hwm: int = 0
    attempts: int = 0
    result: Any = None
    error: str = ""
    agent_state: str = ""  # blob digest of the latest state/save
    epoch: int = 0
    # a unit that had not finished: the snapshot of its own sandbox at journal_hwm, and of the files it
    # started from (its lease's trees), so that a restore to this point makes that sandbox again
    tree: str = ""
    base_tree: str = ""


class CheckpointManifest(msgspec.Struct, frozen=True, omit_defaults=True):
    """A content-addressed snapshot of a mission; stored as a blob, named by its digest."""

    mission_id: str
    number: int
    reason: str
    created_at: float
    graph: str  # blob digest of the unit list (grows with plan/add)
    units: dict[str, UnitMark]
    config: str  # blob digest of permissions, policies and the active model
    parent: str = ""
    sandbox_tree: str = ""
    context: str = ""
    evidence_hwm: int = 0
    events_hwm: int = 0  # the mission's last event when it was written: a view reads only the events after it
    state: MissionState = MissionState.RUNNING
    files_restored: bool = False  # the sandbox was rewritten to sandbox_tree here (restore --files, fork)


class TreeEntry(msgspec.Struct, frozen=True, array_like=True):
    """One file of a sandbox snapshot: relative posix path, mode ("f", "x" executable, "l" symlink whose
    blob is its target) and the digest of the blob holding its bytes."""

    path: str
    mode: Literal["f", "x", "l"]
    blob: str


class SandboxTree(msgspec.Struct, frozen=True, tag="keel-tree"):
    """A snapshot of a sandbox's files (`.git` and `.keel` left out) as one flat list sorted by path.
    Keels before folder trees stored snapshots in this form, as one blob; today it is what a SandboxFolder
    tree reads as (storage/snapshots.load_tree), and a stored one still restores."""

    entries: tuple[TreeEntry, ...] = ()


class FolderEntry(msgspec.Struct, frozen=True, array_like=True):
    """One name in a snapshot folder: mode "f", "x" (executable), "l" (symlink; its blob is the target)
    or "d" (a subfolder; its blob is another SandboxFolder), and the raw 32-byte digest of that blob."""

    name: str
    mode: Literal["f", "x", "l", "d"]
    blob: bytes


class SandboxFolder(msgspec.Struct, frozen=True, tag="keel-folder"):
    """One folder of a sandbox snapshot, entries sorted by name; a snapshot is its root folder's blob,
    referenced by CheckpointManifest.sandbox_tree. Content-addressed like git's trees: a folder whose
    files did not change is the same blob in every snapshot, so a snapshot writes only the folders on the
    path to what changed. Folders holding no file are left out."""

    entries: tuple[FolderEntry, ...] = ()


class SandboxBased(msgspec.Struct, frozen=True, tag="keel-based"):
    """A snapshot of a git sandbox relative to a commit its repository has: the commit's files, less
    `removed` (paths of the commit the sandbox no longer holds as files), with the files of `files` (a
    SandboxFolder tree of what differs from the commit: new and changed files) laid over them. The store
    holds no copy of a file unchanged from the commit; reading the snapshot needs that commit
    (storage/snapshots.load_tree)."""

    base: str  # the commit, 40 hex digits
    files: str  # digest of the SandboxFolder of the files that differ from the commit
    removed: tuple[str, ...] = ()


class RestorePoint(msgspec.Struct, frozen=True, omit_defaults=True):
    id: str
    mission_id: str
    checkpoint: str
    reason: str
    created_at: float
    label: str = ""


class Control(msgspec.Struct, frozen=True, omit_defaults=True):
    """A durable operator request (pause, resume, cancel, answer), consumed by the mission host."""

    action: Literal["pause", "resume", "cancel", "answer"]
    at: float
    text: str = ""
    source: str = ""


class Evidence(msgspec.Struct, frozen=True, omit_defaults=True):
    """What happened, for a person to check: tool calls, file diffs, verifications, failovers."""

    kind: str
    at: float
    unit: str = ""
    summary: str = ""
    data: Any = None
    lane: str = ""  # with `seq`: the journal entry this evidence belongs to (the activity view joins them)
    seq: int = 0


class Event(msgspec.Struct, frozen=True, omit_defaults=True):
    """A mission event log line (state changes, unit starts and ends), for progress and the editor."""

    kind: str
    at: float
    unit: str = ""
    state: str = ""
    message: str = ""
