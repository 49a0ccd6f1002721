"""Silence is counted only while the judge could reach the store (`silence` and `Reach`), and a holder
acts only while nobody can have judged it silent (`may_act`): by table."""

from __future__ import annotations

import time

import pytest

from keel.storage.reach import Reach, may_act, silence


@pytest.mark.parametrize(
    ("heartbeat", "now", "since", "silent"),
    [
        (100.0, 105.0, 0.0, 5.0),  # reached all along: silent since its last beat
        (100.0, 140.0, 138.0, 2.0),  # back from a 30 s outage 2 s ago: 2 s of evidence, not 40
        (139.0, 140.0, 138.0, 1.0),  # it beat after the outage
        (0.0, 140.0, 140.0, 0.0),  # the first look of a new judge: no evidence yet
    ],
)
def test_silence(heartbeat: float, now: float, since: float, silent: float) -> None:
    assert silence(heartbeat, now, since) == silent


@pytest.mark.parametrize(
    ("renewed", "now", "ttl", "acts"),
    [
        (10.0, 10.02, 3.0, True),  # the intent's write answered at once: the effect starts
        (10.0, 11.49, 3.0, True),  # a slow write, still inside half the ttl
        (10.0, 11.5, 3.0, False),  # half the ttl gone: renew first
        (10.0, 12.9, 3.0, False),  # not yet silent for anyone, but too close to act on
        (10.0, 95.0, 3.0, False),  # a COMMIT whose answer was read back after a cut: the lease may be another's
        (10.0, 9.0, 3.0, False),  # a clock that went backwards is no evidence
        (10.0, 14.0, 10.0, True),  # a mission host's 10 s lease
    ],
)
def test_may_act(renewed: float, now: float, ttl: float, acts: bool) -> None:
    assert may_act(renewed, now, ttl) is acts


def test_reach_starts_at_the_first_read_and_again_after_a_gap() -> None:
    reach = Reach(gap_s=0.2)
    t = time.monotonic()
    assert reach.note(t, 1000.0) == 1000.0  # the first read
    assert reach.note(time.monotonic(), 1000.1) == 1000.0  # read again at once: no gap
    assert reach.note(time.monotonic() - 0.5, 1031.0) == 1031.0  # a read that waited 0.5 s for the store
    time.sleep(0.3)
    assert reach.note(time.monotonic(), 1031.5) == 1031.5  # no read for longer than the gap
    assert reach.note(time.monotonic(), 1031.6) == 1031.5
