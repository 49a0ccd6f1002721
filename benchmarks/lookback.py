"""Benchmark: what an appending agent's request costs the step core as its history grows.

    python benchmarks/lookback.py [--sizes 1000,10000,50000] [--repeat 30]

An outside agent's lane of N entries (three in five a paid model request with an 8 KB answer, the rest
effects that changed the files), then a new model request and a new effect: the step core's decision
fed the whole journal (as a host held it before `step/lookback.py`) against the page `Lookback` gives.
Prints medians in milliseconds and the memory each form holds. Not a test.
"""

from __future__ import annotations

import argparse
import statistics
import time
import tracemalloc
from collections.abc import Callable

from keel.protocol.records import EffectMark, JournalEntry
from keel.server.engine.step.core import Request, next_step
from keel.server.engine.step.effects import Effect
from keel.server.engine.step.lookback import Lookback


def _lane(n: int) -> list[JournalEntry]:
    entries = []
    for seq in range(1, n + 1):
        if seq % 5 < 3:
            result = {"session": "s", "ordinal": seq, "body": f"event: message_stop {seq} " + "x" * 8000}
            entries.append(JournalEntry(seq=seq, kind="model/forward", fingerprint=f"fp{seq}", result=result))
        else:
            mark = EffectMark(key=Effect("run", f"make t{seq}").key, before=f"f{seq}", after=f"f{seq + 1}")
            entries.append(JournalEntry(seq=seq, kind="effect/ask", fingerprint=f"e{seq}", effect=mark))
    return entries


def _median_ms(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,50000")
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    print(f"{'entries':>8} {'request':>8} {'whole ms':>9} {'page ms':>8} {'whole MB':>9} {'index MB':>9}")
    for n in (int(size) for size in args.sizes.split(",")):
        tracemalloc.start()
        whole = {e.seq: e for e in _lane(n)}
        whole_mb = tracemalloc.get_traced_memory()[0] / 1e6
        tracemalloc.stop()
        tracemalloc.start()
        lookback = Lookback()
        for entry in _lane(n):
            lookback.add(entry)
        index_mb = tracemalloc.get_traced_memory()[0] / 1e6
        tracemalloc.stop()
        requests = {
            "model": Request(n + 1, "model/forward", "fp-new", ordinal=n + 1),
            "effect": Request(n + 1, "effect/ask", "new", Effect("run", "make new"), files="f0"),
        }
        for name, request in requests.items():
            assert next_step(lookback.page(request), request, True) == next_step(whole, request, True)
            old = _median_ms(lambda r=request, w=whole: next_step(w, r, True), args.repeat)
            new = _median_ms(lambda r=request, lb=lookback: next_step(lb.page(r), r, True), args.repeat)
            print(f"{n:>8} {name:>8} {old:>9.3f} {new:>8.4f} {whole_mb:>9.1f} {index_mb:>9.1f}")


if __name__ == "__main__":
    main()
