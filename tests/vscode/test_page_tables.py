"""The mission page's decisions as tables, with no browser (tests/vscode/page_tables.mjs runs the page's pure
TypeScript under Node): levels of the `after` graph, groups by level / folder / state with their counts and
which start folded, the keyboard's walk, a failure's cause read from its output, timeline marks that share a
bin, and tab titles of missions that share a name."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from .conftest import ROOT


def unit(uid: str, state: str = "pending", after: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"id": uid, "title": f"title of {uid}", "state": state, "after": list(after), "attempts": 0, "error": ""}


def run(tools: dict[str, str], cases: list[dict[str, Any]]) -> list[Any]:
    done = subprocess.run(
        ["node", str(Path(__file__).with_name("page_tables.mjs")), json.dumps(cases)],
        cwd=ROOT,
        env={"PATH": tools["PATH"]},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout))


DIAMOND = [
    unit("a", "succeeded"),
    unit("b", "running", ("a",)),
    unit("c", "failed", ("a",)),
    unit("d", after=("b", "c")),
]
MANY = [unit(f"api.u{i}", "succeeded") for i in range(60)] + [
    unit(f"web.u{i}", "running" if i == 0 else "pending", (f"api.u{i}",)) for i in range(40)
]


def mark(key: str, lane: str, at: float, failed: bool = False) -> dict[str, Any]:
    return {"key": key, "lane": lane, "at": at, "label": key, "failed": failed}


CASES: list[tuple[str, dict[str, Any], Any]] = [
    ("levels of a diamond", {"fn": "levels", "args": [DIAMOND]}, {"a": 0, "b": 1, "c": 1, "d": 2}),
    (
        "an unknown after and a cycle still have levels",
        {"fn": "levels", "args": [[unit("x", after=("nowhere",)), unit("p", after=("q",)), unit("q", after=("p",))]]},
        {"x": 0, "p": 2, "q": 1},
    ),
    (
        "by state: what needs a person first, counts per group",
        {"fn": "groupUnits", "args": [DIAMOND, "state", None]},
        [
            {"key": "s:failed", "label": "failed", "units": ["c"], "counts": {"failed": 1}, "folded": False},
            {"key": "s:running", "label": "running", "units": ["b"], "counts": {"running": 1}, "folded": False},
            {"key": "s:pending", "label": "pending", "units": ["d"], "counts": {"pending": 1}, "folded": False},
            {"key": "s:succeeded", "label": "succeeded", "units": ["a"], "counts": {"succeeded": 1}, "folded": False},
        ],
    ),
    (
        "by level, the asking unit counted as asking",
        {"fn": "groupUnits", "args": [DIAMOND, "level", "d"]},
        [
            {"key": "l:000000", "label": "Level 1", "units": ["a"], "counts": {"succeeded": 1}, "folded": False},
            {
                "key": "l:000001",
                "label": "Level 2",
                "units": ["b", "c"],
                "counts": {"running": 1, "failed": 1},
                "folded": False,
            },
            {"key": "l:000002", "label": "Level 3", "units": ["d"], "counts": {"asking": 1}, "folded": False},
        ],
    ),
    (
        "by folder in a large mission: a group with nothing to watch starts folded",
        {"fn": "groupUnits", "args": [MANY, "folder", None]},
        [
            {
                "key": "f:api",
                "label": "api.*",
                "units": [f"api.u{i}" for i in range(60)],
                "counts": {"succeeded": 60},
                "folded": True,
            },
            {
                "key": "f:web",
                "label": "web.*",
                "units": [f"web.u{i}" for i in range(40)],
                "counts": {"running": 1, "pending": 39},
                "folded": False,
            },
        ],
    ),
    (
        "units in view: asking, failed, running, paused; the rest counted",
        {"fn": "inView", "args": [[*DIAMOND, unit("e", "resumable"), unit("f", "running")], "d", 3]},
        {"shown": [DIAMOND[3], DIAMOND[2], DIAMOND[1]], "more": 2},
    ),
    ("arrow down from a header", {"fn": "nextStop", "args": [["g:1", "a", "b", "g:2", "c"], "g:1", "ArrowDown"]}, "a"),
    ("arrow up stays at the top", {"fn": "nextStop", "args": [["g:1", "a"], "g:1", "ArrowUp"]}, "g:1"),
    ("page down: the next group", {"fn": "nextStop", "args": [["g:1", "a", "b", "g:2", "c"], "a", "PageDown"]}, "g:2"),
    ("page up: this group's header", {"fn": "nextStop", "args": [["g:1", "a", "b", "g:2", "c"], "b", "PageUp"]}, "g:1"),
    ("page down in the last group: its end", {"fn": "nextStop", "args": [["g:1", "g:2", "c"], "g:2", "PageDown"]}, "c"),
    ("end", {"fn": "nextStop", "args": [["g:1", "a", "g:2", "c"], "a", "End"]}, "c"),
    ("another key moves nothing", {"fn": "nextStop", "args": [["g:1", "a"], "a", "x"]}, None),
    (
        "the cause under a generic verification failure",
        {
            "fn": "causeOf",
            "args": [
                {
                    "id": "v/1",
                    "kind": "verification",
                    "at": 1,
                    "title": "verification failed",
                    "text": 'Traceback (most recent call last):\n  File "x.py", line 1\n'
                    "ModuleNotFoundError: No module named 'structlog'\n",
                },
                "verification failed: exit code 1",
            ],
        },
        "ModuleNotFoundError: No module named 'structlog'",
    ),
    (
        "no cause line: the output's last line",
        {"fn": "causeOf", "args": [{"id": "v", "kind": "tool", "at": 1, "title": "t", "text": "one\ntwo\n"}, "e"]},
        "two",
    ),
    (
        "a line that only repeats the error is no cause",
        {"fn": "causeOf", "args": [{"id": "v", "kind": "tool", "at": 1, "title": "t", "text": "boom"}, "failed: boom"]},
        None,
    ),
    ("no output: no cause", {"fn": "causeOf", "args": [None, "verification failed"]}, None),
    (
        "marks closer than the bin share it, per lane",
        {
            "fn": "binMarks",
            "args": [
                [
                    mark("i:1", "steps", 0),
                    mark("i:2", "steps", 1, True),
                    mark("i:3", "model", 1),
                    mark("i:4", "steps", 50),
                ],
                0,
                100,
                100,
                7,
            ],
        },
        [
            {"key": "i:1", "lane": "steps", "count": 2, "failed": True},
            {"key": "i:3", "lane": "model", "count": 1, "failed": False},
            {"key": "i:4", "lane": "steps", "count": 1, "failed": False},
        ],
    ),
]


@pytest.fixture(scope="module")
def answers(tools: dict[str, str]) -> list[Any]:
    return run(tools, [case for _, case, _ in CASES])


@pytest.mark.parametrize("index", range(len(CASES)), ids=[name for name, _, _ in CASES])
def test_page_decision(answers: list[Any], index: int) -> None:
    _, _, expected = CASES[index]
    assert answers[index] == expected


def test_tab_titles_tell_missions_of_one_name_apart(tools: dict[str, str]) -> None:
    def summary(mid: str, name: str, created: float) -> dict[str, Any]:
        return {"id": mid, "name": name, "state": "running", "createdAt": created, "updatedAt": created}

    a, b, c = summary("m1", "build", 1_700_000_000), summary("m2", "build", 1_700_000_600), summary("m3", "docs", 0)
    one, two, alone = run(
        tools,
        [
            {"fn": "tabTitle", "args": [a, [a, b, c]]},
            {"fn": "tabTitle", "args": [b, [a, b, c]]},
            {"fn": "tabTitle", "args": [c, [a, b, c]]},
        ],
    )
    assert one.startswith("build · started ") and two.startswith("build · started ") and one != two
    assert alone == "docs" and "m1" not in one
    # two started within one second (a mission that ends at once, started again): numbered as they started
    d, e = summary("m5", "twin", 1_700_000_000.9), summary("m4", "twin", 1_700_000_000.2)
    first, second = run(tools, [{"fn": "tabTitle", "args": [e, [d, e]]}, {"fn": "tabTitle", "args": [d, [e, d]]}])
    assert first.endswith(" (1)") and second.endswith(" (2)") and first[:-4] == second[:-4], (first, second)
