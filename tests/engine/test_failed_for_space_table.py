"""Whether a failure is a full disk's doing (a pause, never a result), as tables: a command's end
(protocol/diskspace.command_failed_for_space), any failure judged by what it said and the space seen
(failed_for_space), and which failed units a resume runs again (engine/graph.retried_on_resume)."""

from __future__ import annotations

import pytest

from keel.protocol.diskspace import NEARLY_FULL_BYTES, command_failed_for_space, failed_for_space
from keel.protocol.records import UnitMark
from keel.protocol.states import UnitState
from keel.server.engine.graph import retried_on_resume

KIB = 1024
ROOMY = 500 * 1024 * KIB
LOW = NEARLY_FULL_BYTES - 1
NO_SPACE = "sh: 1: cannot create out.txt: No space left on device"
KEEL_FULL = "disk full: the filesystem mounted at /mnt (0 KiB free) cannot take a write to the store at /mnt/s"

# (exit code, timed out, stderr, least free seen, keel's own write met a full disk) -> a full disk's doing?
COMMANDS = [
    (0, False, "", LOW, "", False),  # it passed on a full disk: its result
    (0, False, NO_SPACE, 0, KEEL_FULL, False),  # passed while printing the words: still its result
    (2, False, "", ROOMY, "", False),  # an ordinary failure with room to spare
    (1, False, "FAILED test_x - AssertionError", ROOMY, "", False),
    (2, False, NO_SPACE, ROOMY, "", True),  # it cleaned up after itself: the words tell
    (2, False, "head: error writing 'standard output': Disk quota exceeded", ROOMY, "", True),
    (2, False, "", LOW, "", True),  # said nothing, but the disk was full while it ran
    (2, False, "", NEARLY_FULL_BYTES, "", False),  # the margin itself is room enough
    (2, False, "", None, "", False),  # free space unknown, nothing said: its result
    (2, False, "", ROOMY, KEEL_FULL, True),  # the store spent its reserve there meanwhile: room says nothing
    (-9, False, "", LOW, "", True),  # killed by a signal on a full disk
    (None, False, NO_SPACE, ROOMY, "", True),
    (124, True, NO_SPACE, LOW, KEEL_FULL, False),  # keel's time limit ended it: a timeout, whatever else
]


@pytest.mark.parametrize(("code", "timed_out", "stderr", "least", "known", "full"), COMMANDS)
def test_command_end(code: int | None, timed_out: bool, stderr: str, least: int | None, known: str, full: bool) -> None:
    why = command_failed_for_space(code, timed_out, stderr, least, known)
    assert bool(why) is full, why


# (what it said, least free seen, bytes it needed) -> why, in part ("" for its own failure)
FAILURES = [
    ("fatal: Could not reset index file to revision 'HEAD'.", ROOMY, 600 * KIB, ""),
    ("error: unable to write file 'big.bin'", 292 * KIB, 600 * KIB, "292 KiB were free and it needed 600 KiB"),
    ("error: unable to write file 'big.bin'", 292 * KIB, 0, ""),  # needed unknown: room is room
    ("error: unable to write file 'big.bin'", 100 * KIB, 0, "100 KiB were free"),
    ("error: unable to write file 'small'", 100 * KIB, 4 * KIB, "100 KiB were free"),  # under the margin
    ("fatal: Out of diskspace", ROOMY, 0, "no space"),  # git's words
    ("[Errno 28] No space left on device: '/mnt/sb/a.txt'", None, 0, "no space"),
    ("permission denied", None, 600 * KIB, ""),
]


@pytest.mark.parametrize(("words", "least", "needed", "why"), FAILURES)
def test_failure(words: str, least: int | None, needed: int, why: str) -> None:
    found = failed_for_space(words, least, needed)
    assert (why in found) if why else found == "", found


def test_keel_having_met_a_full_disk_there_says_why() -> None:
    assert KEEL_FULL[:100] in failed_for_space("", ROOMY, 0, KEEL_FULL)


U = UnitState
SANDBOX_FULL = "cannot make the sandbox of unit c: [Errno 28] No space left on device: '/mnt/sandboxes/c/big.bin'"

# (unit state, its error, the mission failed) -> run again on resume
RETRIES = [
    (U.FAILED, "agent failed the unit: boom", True, True),  # keel resume retries a failed mission's units
    (U.FAILED, "agent failed the unit: boom", False, False),  # a paused mission: its failure stands
    (U.FAILED, SANDBOX_FULL, False, True),  # a full disk recorded as a failure (an older keel): runs again
    (U.FAILED, "git worktree add: fatal: Out of diskspace", False, True),
    (U.FAILED, SANDBOX_FULL, True, True),
    (U.SUCCEEDED, "", True, False),
    (U.RESUMABLE, SANDBOX_FULL, False, False),  # not failed: resumes from its journal anyway
    (U.PENDING, "", True, False),
]


@pytest.mark.parametrize(("state", "error", "mission_failed", "again"), RETRIES)
def test_retried_on_resume(state: UnitState, error: str, mission_failed: bool, again: bool) -> None:
    assert retried_on_resume(UnitMark(state=state, error=error), mission_failed) is again
