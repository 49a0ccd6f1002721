"""The mission page at scale, in real VS Code (code-server + the packaged VSIX + headless Chromium at 1400x860,
tests/vscode/scale.mjs), one session driving every check:

- a 1,000-unit mission (the scripted agent, four units at a time) is watched while it runs: the page's own
  measures (first paint, each update's script and layout) and the states it drew against the store's, sampled
  here (how far behind the store the page was; never an older state after a newer one); keyboard focus and a
  text selection survive the updates; one tab stop for the graph; shots in both themes;
- legibility: whole titles inside their boxes, no id before a title, one line per activity row, the activity
  in the first screen, a legible state badge in both themes, two missions of one name in two different tabs,
  a fork's origin by name;
- a mission started from the palette opens its page; its row opens it at the first click, every time; a
  free-text question is answered in a field on the page;
- every open page comes back after a window reload;
- a failed verification's cause is on the page, with Why, Show Output and Retry This Unit.
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time
from pathlib import Path

import pytest

from keel.server.lsp.convert import unit_counts
from keel.server.lsp.snapshot import read_view
from keel.storage import Store
from keel.storage import missions as m
from tests.hosts import kill_hosts

from .conftest import ARTIFACTS, keel, mission_file, workspace
from .test_ui_items import ANSWER, asking_mission, run_scene, wait_for

UNITS = 1000
LEVEL = 100
WATCH_MS = 12_000
MISSING = "structlog_is_not_installed"


def big_mission(ws: Path) -> Path:
    """`scale`: 1,000 units in ten levels of a hundred (folders part0 … part9: ids part0.u0000 …), each after the unit a
    level before it, each a short sleep; four run at a time, so it runs for minutes."""
    units = [
        (
            f"part{i // LEVEL}.u{i:04d}",
            f"Migrate handler {i} of the billing service to the async storage layer",
            [f"part{i // LEVEL - 1}.u{i - LEVEL:04d}"] if i >= LEVEL else [],
            "[{ sleep = 0.3 }]",
        )
        for i in range(UNITS)
    ]
    path = mission_file(ws, "scale", units)
    path.write_text(path.read_text().replace('name = "scale"', 'name = "scale"\nmax_parallel = 4', 1))
    return path


def start_missions(ws: Path) -> dict[str, str]:
    store = ws / ".keel" / "store"
    hello = '[{ tool = "write_file", args = { path = "t.txt", content = "t" } }]'
    twin = mission_file(ws, "twin", [("t1", "Say hello", [], hello)])
    check = f"{sys.executable} -c 'import {MISSING}'"
    verify = f'[{{ tool = "run", args = {{ cmd = "{check}", verify = true }} }}]'
    deps = mission_file(ws, "deps", [("check", "Check the dependencies", [], verify)])
    mission_file(ws, "fresh", [(f"f{i}", f"Fresh step {i}", [], "[{ sleep = 0.5 }]") for i in range(30)])
    ids = {
        "twin1": keel("run", str(twin), "--detach", cwd=ws),
        "asking": keel("run", str(asking_mission(ws)), "--detach", cwd=ws),
        "deps": keel("run", str(deps), "--detach", cwd=ws),
    }
    wait_for(store, "twin 1 completed", lambda t: m.get_mission(t, ids["twin1"]).state.value == "completed")
    ids["twin2"] = keel("run", str(twin), "--detach", cwd=ws)
    ids["fork"] = keel("fork", ids["twin1"], "p1", "--name", "twin-fork", cwd=ws).split()[1]  # "mission ID forked…"
    wait_for(store, "the question", lambda t: m.get_mission(t, ids["asking"]).state.value == "waiting_input")
    wait_for(store, "deps failed", lambda t: m.get_mission(t, ids["deps"]).state.value == "failed")
    wait_for(store, "twin 2 completed", lambda t: m.get_mission(t, ids["twin2"]).state.value == "completed")
    ids["big"] = keel("run", str(big_mission(ws)), "--detach", cwd=ws)
    return ids


class StoreSampler(threading.Thread):
    """How many units of a mission the store says are done, every 0.25 s, with the wall time, until the scene
    says it has watched the page (`watched` exists): then the mission is paused, so that its four units at a
    time stop taking the machine from the rest of the scene and the other tests."""

    def __init__(self, ws: Path, mission: str, watched: Path) -> None:
        super().__init__(daemon=True)
        self.ws, self.mission, self.watched = ws, mission, watched
        self.samples: list[tuple[float, int]] = []
        self.done = threading.Event()

    def run(self) -> None:
        with Store.open(self.ws / ".keel" / "store") as store:
            while not self.done.is_set() and not self.watched.exists():
                at = time.time()
                self.samples.append((at, unit_counts(read_view(store, self.mission)).done))
                time.sleep(0.25)
        if self.watched.exists():
            keel("pause", self.mission, cwd=self.ws)


def lag_behind_store(samples: list[tuple[float, int]], updates: list[dict]) -> float:
    """The longest time the page took to draw a count of done units the store had: for each store sample in
    the window the page was watched, from the sample to the first update that drew at least that count."""
    first, last = updates[0]["at"] / 1000, updates[-1]["at"] / 1000
    worst = 0.0
    for at, done in samples:
        if at < first or at > last - 2:
            continue
        drawn = next((u["at"] / 1000 for u in updates if u["done"] >= done and u["at"] / 1000 >= at - 1), None)
        worst = max(worst, (drawn if drawn is not None else last) - at)
    return worst


@pytest.mark.timeout(900)
def test_mission_page_at_scale(code_server, drive, vsix: Path, tmp_path: Path) -> None:
    ws = workspace(tmp_path / "ws")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    store = ws / ".keel" / "store"
    sampler: StoreSampler | None = None
    try:
        ids = start_missions(ws)
        watched = tmp_path / "big-watched"
        sampler = StoreSampler(ws, ids["big"], watched)
        sampler.start()
        names = {
            "big": "scale",
            "asking": "release-notes",
            "twin": "twin",
            "fork": "twin-fork",
            "deps": "deps",
            "fresh": "fresh",
        }
        config = {
            "missions": names,
            "answer": ANSWER,
            "freshFile": "fresh.mission.toml",
            "watchMs": WATCH_MS,
            "bigWatchedFile": str(watched),
            "viewport": {"width": 1400, "height": 860},
        }
        seen = run_scene(code_server, drive, vsix, ws, "scale", config, "scale.mjs")
        with Store.open(store) as opened:
            checks = opened.read(lambda t: [e for _, e in m.events_after(t, ids["deps"]) if e.unit == "check"])
    finally:
        if sampler is not None:  # what the store said while the page was watched, kept next to the page's measures
            sampler.done.set()
            sampler.join()
            (ARTIFACTS / "page-scale-store.json").write_text(json.dumps(sampler.samples))
        kill_hosts(store)

    timings = seen["timings"]
    updates = [u for u in timings["updates"] if u["total"] == UNITS]
    ms = [u["ms"] for u in updates[1:]]
    assert sampler is not None
    lag = lag_behind_store(sampler.samples, updates)
    report = {
        "paintMs": timings["paintMs"],
        "openMs": seen["openMs"],
        "updates": len(ms),
        "medianUpdateMs": statistics.median(ms),
        "maxUpdateMs": max(ms),
        "lagS": lag,
        "askingClick": seen["askingClick"],  # "opened", or what the window showed when its first click did not
    }
    (ARTIFACTS / "page-scale-timings.json").write_text(json.dumps(report, indent=2))
    (ARTIFACTS / "page-scale-updates.json").write_text(json.dumps(updates))  # beside page-scale-store.json
    # 1: measured in the page; never an older state drawn after a newer one. The targets (a paint within 1 s,
    # updates of 50 ms, at most 1 s behind the store) are what page-scale-timings.json is read against; the
    # bounds asserted here leave room for a CI machine running four workers on two cores, with every keel
    # process of the run at normal priority (tests/conftest.py: 5 to 14 s behind in full runs), and still fail a
    # page that rebuilds itself on every change (minutes behind at this size)
    assert len(ms) >= 5, seen["timings"]
    assert timings["paintMs"] <= 3000, report
    assert statistics.median(ms) <= 200, report
    assert lag <= 20.0, report
    done = [u["done"] for u in updates]
    assert done == sorted(done), done
    assert seen["focusedBefore"] and seen["focusedAfter"] == seen["focusedBefore"], seen
    assert seen["selectedBefore"] and seen["selectedAfter"] == seen["selectedBefore"], seen
    assert seen["updatesWatched"] >= 5
    # 2: grouped, counted, one tab stop for the graph; PageDown goes to the next group
    assert any("succeeded" in c for c in seen["counts"]) and any("running" in c for c in seen["counts"]), seen["counts"]
    assert len(seen["groups"]) == 10 and all(
        g[2:].startswith(f"Level {i + 1} · 100") for i, g in enumerate(seen["groups"])
    )
    assert seen["tabStops"] < 60, seen["tabStops"]
    assert seen["pageDown"].startswith("g:"), seen["pageDown"]
    # 7: legible
    legible = seen["bigLegible"]
    assert legible["overflowing"] == 0 and legible["wrapped"] == 0, legible
    assert legible["titles"], legible
    for title, label in legible["titles"]:
        assert title.startswith("Migrate handler") and len(title) > 24 and title in label, legible["titles"]
    assert legible["activityTop"] + 100 < legible["viewHeight"], legible
    assert seen["contrast"]["light"]["ratio"] >= 4.5 and seen["contrast"]["dark"]["ratio"] >= 4.5, seen["contrast"]
    assert len(seen["twinTabs"]) == 2 and seen["twinTabs"][0] != seen["twinTabs"][1], seen["twinTabs"]
    assert "Forked from twin at p1" in seen["origin"] and ids["twin1"] not in seen["origin"], seen["origin"]
    # 8: a started mission's page, its row at the first click, the answer typed on the page
    assert any("fresh" in t for t in seen["startedTabs"]), seen["startedTabs"]
    assert seen["rowClicks"] == ["opened"] * 3, seen["rowClicks"]
    assert seen["answered"] == "completed" and not seen["quickInputShown"]
    with Store.open(store) as opened:
        answered = opened.read(lambda t: m.get_mission(t, ids["asking"]))
    assert answered.state.value == "completed"
    # 3: the pages open before the reload are back, drawn
    assert sorted(seen["tabsAfterReload"]) == sorted(seen["tabsBeforeReload"]), seen
    assert len(seen["pagesAfterReload"]) == 3, seen["pagesAfterReload"]
    # 6: the cause on the page, the output in an editor, Why in the Activity view, the unit run again
    assert f"ModuleNotFoundError: No module named '{MISSING}'" in seen["failureCause"], seen["failureCard"]
    assert seen["failureButtons"] == ["Why", "Show Output", "Retry This Unit"], seen["failureButtons"]
    assert "ModuleNotFoundError" in seen["outputText"]
    assert any("failed" in r or "verification" in r for r in seen["whyRows"]), seen["whyRows"]
    assert sum(1 for e in checks if e.state == "running") >= 2, checks
