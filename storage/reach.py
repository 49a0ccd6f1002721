"""Since when a process has been reaching its store without a gap: the ground for judging another's silence.

Nobody can renew a lease while the store is away, so a heartbeat older than its ttl is evidence of a dead
holder only when the one who judges could reach the store all that time. A `Reach` notes each read (its
start and end on this process's monotonic clock, the store's clock it saw) and answers `since`: the store's
clock at the first read after the last gap (a read that took longer than `gap_s`, or no read for longer
than `gap_s`). `silence` counts a holder's silence from its last heartbeat, but never from before
`since`. A gap only ever delays a judgement.

The holder's side of the same clock: `may_act` says whether a holder may still start an effect, from when it
sent the last write that renewed its lease. Knows nothing of missions or processes.
"""

from __future__ import annotations

import time

GAP_S = 1.5  # a read that took longer, or a pause between reads longer, than this is a gap in reaching the store


def gap_for(ttl_s: float) -> float:
    """The longest read, or pause between reads, that is not a gap when judging leases of this ttl: half of
    it (a holder renews every quarter of its ttl, so an outage this short still leaves it time to renew
    before it could be judged silent), never less than GAP_S. A busy machine's slow reads are no gap."""
    return max(GAP_S, ttl_s / 2)


def silence(heartbeat: float, now: float, since: float) -> float:
    """How long a lease's holder has been silent as a reader who has reached the store since `since` (the
    store's clock) can tell: from its last heartbeat, or from `since` when that is later."""
    return now - max(heartbeat, since)


def may_act(renewed: float, now: float, ttl_s: float) -> bool:
    """Whether the holder of a lease may start an effect at `now` (its monotonic clock) when the last fenced
    write that renewed its lease was sent at `renewed`. That write committed no earlier than it was sent,
    so nobody can judge the lease silent before `renewed + ttl_s` (by any clock that runs at about the same
    rate); half of that is the holder's to act in, the rest a margin for the effect to get going. A write
    whose answer came late (a connection cut while it committed, read back once the link is back; a frozen
    process) leaves no time: the holder must renew again, fenced, before it acts."""
    return 0.0 <= now - renewed < ttl_s / 2


class Reach:
    def __init__(self, gap_s: float = GAP_S) -> None:
        self.gap_s = gap_s
        self.since = 0.0
        self._last_end: float | None = None

    def note(self, started: float, store_now: float) -> float:
        """A read that started at `started` (time.monotonic()) and saw the store's clock `store_now` ended
        now; returns `since`."""
        ended = time.monotonic()
        if self._last_end is None or ended - started > self.gap_s or started - self._last_end > self.gap_s:
            self.since = store_now
        self._last_end = ended
        return self.since
