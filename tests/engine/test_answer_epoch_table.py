"""A person's answer about a unit's run acts on the lease of the run it was asked about
(engine/recovery.apply_answer, Question.epoch), never on a lease that replaced it since (a restore reopened
the unit, another host took it over): the answer is kept as evidence, and the unit is recovered as its
current lease says. A question an older keel asked names no epoch: it acts on the current lease of its lane."""

from __future__ import annotations

from pathlib import Path

import pytest

from keel.protocol.records import JournalEntry, Placement, Question
from keel.protocol.states import QuestionKind, Resolution
from keel.server.engine.recovery import apply_answer
from keel.storage import Store, leases
from keel.storage import missions as m

MID = "m1"
TREE = "1" * 64

# (kind, the epoch the question names, leases granted since it was asked) -> (resolution, tree) of the current lease
TABLE = [
    (QuestionKind.REEXECUTE, 1, 0, Resolution.RERUN, TREE),
    (QuestionKind.REEXECUTE, 1, 1, Resolution.NONE, TREE),  # the run it was about was replaced
    (QuestionKind.MERGE_CONFLICT, 1, 0, Resolution.RERUN, TREE),
    (QuestionKind.MERGE_CONFLICT, 1, 2, Resolution.NONE, TREE),
    (QuestionKind.REEXECUTE, 0, 1, Resolution.RERUN, TREE),  # asked by an older keel: its lane's current lease
    (QuestionKind.UNCERTAIN_EFFECT, 1, 0, Resolution.NONE, ""),  # "skip": the sandbox as it is is the reference
    (QuestionKind.UNCERTAIN_EFFECT, 1, 1, Resolution.NONE, TREE),
]


@pytest.mark.parametrize(("kind", "asked", "since", "resolution", "tree"), TABLE)
def test_answer_epoch_table(
    tmp_path: Path,
    kind: QuestionKind,
    asked: int,
    since: int,
    resolution: Resolution,
    tree: str,
) -> None:
    place = Placement(sandbox="/s/a", tree=TREE, base_tree=TREE)
    question = Question(unit="a", seq=2, text="?", kind=kind, lane="a", epoch=asked)
    answer = "skip" if kind == QuestionKind.UNCERTAIN_EFFECT else "rerun"
    with Store.open(tmp_path / "store") as store:  # the decision is the backends' alike (leases: spec-tested on both)
        for _ in range(1 + since):
            store.write(lambda t: leases.grant(t, MID, "a", lane="a", host_id="h", ttl_s=5, place=place))
        intent = JournalEntry(seq=2, kind="tool/run", fingerprint="f", phase="intent", tool_class="effectful")
        store.write(lambda t: m.journal_put(t, MID, "a", intent))
        store.write(lambda t: apply_answer(t, MID, question, answer))
        held = store.read(lambda t: leases.get(t, MID, "a"))
        assert held is not None and held.epoch == 1 + since
        assert (held.resolution, held.place.tree) == (resolution, tree)
        said = store.read(lambda t: [e for _, e in m.evidence_after(t, MID)])
        assert [e.kind for e in said] == ["answer"]  # the answer is kept, whichever lease it acted on
