"""editors/emacs/keel.el in Debian's Emacs (28, eglot 1.9 from elpa-eglot), headless: the README's snippet
verbatim, then a mission file opened in conf-toml-mode, keel-start, keel-pause, keel-resume and keel-answer
with mission ids completed from keel/missions, questions asked at a prompt, the mode line following
keel/missionChanged in words, and eglot's shutdown — against a real `keel serve`, a real store and real
mission hosts.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from keel.storage import Store
from keel.storage import missions as m
from tests.editors import editor_session
from tests.hosts import kill_hosts
from tests.lsp.conftest import mission_toml

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "editors" / "emacs"
DRIVER = Path(__file__).with_name("driver.el")
STOCK_DRIVER = Path(__file__).with_name("stock_driver.el")
EMACS = shutil.which("emacs")


@pytest.mark.skipif(EMACS is None, reason="emacs is not installed (run scripts/setup.sh --system)")
def test_keel_el_follows_pauses_resumes_and_answers_a_mission(tmp_path: Path) -> None:
    assert EMACS is not None
    session = editor_session(tmp_path, "Emacs", "init.el")
    args = [EMACS, "--batch", "-L", str(PLUGIN), "-l", str(session.init), "-l", str(DRIVER)]
    try:
        proc, seen = session.run(args)
        assert proc.returncode == 0 and seen.get("ok") is True, (proc.returncode, seen, proc.stderr[-3000:])
        mission_id = seen["mission"]
        assert seen["major-mode"] == "conf-toml-mode"
        assert seen["prompted"] == [
            [f"keel · ship ({mission_id}) asks: Ship it? ", ["yes", "no"]],
            [f"keel · ship ({mission_id}) asks: Really? ", ["yes", "no"]],
        ], seen
        assert seen["pause-offered"] == [mission_id]
        assert seen["pause-annotations"][0].startswith(f"  ship ({mission_id}) running"), seen
        # an older server answers the state it saw, a newer one the acknowledged transition
        assert seen["pause-state"] in ("pausing", "paused", "running"), seen
        assert seen["answer-offered"] == [["Answer mission: ", [mission_id]], ["Really? ", ["yes", "no"]]], seen
        # the mode line in words, with units done of all and the running unit (no raw states, no lost `%')
        assert " keel[ship running 0/1 0% · work Do the work]" in seen["modeline-unit"], seen
        assert " keel[ship paused (operator) 0/1 0%]" in seen["modeline-paused"], seen
        assert " keel[ship waiting for an answer 0/1 0%]" in seen["modeline-waiting_input"], seen
        assert " keel[ship completed 1/1 100%]" in seen["modeline-completed"], seen
        assert f"keel: ship ({mission_id}) completed" in proc.stderr, proc.stderr[-3000:]
        assert seen["missions"] == [f"ship ({mission_id}) completed"], seen
        assert "no mission 'm-no-such-mission'" in seen["error"], seen
        # keel serve exits by itself on eglot's shutdown/exit: not killed ("exited with status 9")
        assert seen["server-exit"] == "exit 0", seen
        assert "exited with status 9" not in proc.stderr, proc.stderr[-3000:]
        with Store.open(session.store) as s:
            assert s.read(lambda t: m.get_mission(t, mission_id)).state.value == "completed"
    finally:
        kill_hosts(session.store)


@pytest.mark.skipif(EMACS is None, reason="emacs is not installed (run scripts/setup.sh --system)")
def test_keel_el_asks_the_questions_missions_wait_on_when_it_connects(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs of one mission file wait on the same question before Emacs starts: each is asked at its own
    prompt, and each answer reaches its own mission."""
    assert EMACS is not None
    session = editor_session(tmp_path, "Emacs", "init.el")
    twin = tmp_path / "twin.toml"
    twin.write_text(mission_toml("twin", [{"id": "ask", "steps": [{"ask": "Ship it?", "choices": ["yes", "no"]}]}]))
    keel = Path(sys.executable).with_name("keel")
    try:
        ids = [
            subprocess.run(
                [str(keel), "run", "--detach", str(twin)], cwd=tmp_path, capture_output=True, text=True, check=True
            ).stdout.split()[-1]
            for _ in range(2)
        ]
        _wait_waiting(session.store, ids)
        monkeypatch.setenv("KEEL_EDITOR_SCENARIO", "waiting")
        args = [EMACS, "--batch", "-L", str(PLUGIN), "-l", str(session.init), "-l", str(DRIVER)]
        proc, seen = session.run(args)
        assert proc.returncode == 0 and seen.get("ok") is True, (proc.returncode, seen, proc.stderr[-3000:])
        assert sorted(seen["missions"]) == sorted(ids), seen
        assert sorted(seen["prompted"]) == sorted([f"keel · twin ({i}) asks: Ship it? ", ["yes", "no"]] for i in ids)
        assert "keel answer" not in proc.stderr, proc.stderr[-3000:]
        with Store.open(session.store) as s:
            for mission_id in ids:
                record = s.read(lambda t, i=mission_id: m.get_mission(t, i))
                assert record.state.value == "completed", record
    finally:
        kill_hosts(session.store)


def _wait_waiting(store: Path, ids: list[str]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if os.path.exists(store / "data.mdb"):
            with Store.open(store) as s:
                states = [s.read(lambda t, i=i: m.get_mission(t, i)).state.value for i in ids]
            if states == ["waiting_input"] * len(ids):
                return
        time.sleep(0.1)
    raise AssertionError(f"missions {ids} never all waited on their question")


@pytest.mark.skipif(EMACS is None, reason="emacs is not installed (run scripts/setup.sh --system)")
def test_stock_eglot_prompts_for_the_questions_and_shows_progress(tmp_path: Path) -> None:
    """No keel.el: eglot 1.9 (Emacs 28) as it comes, with `keel serve` for TOML files. It announces no window
    capability; the questions come as requests it prompts for with their choices, the progress as messages
    it shows in the echo area (stderr in batch)."""
    assert EMACS is not None
    session = editor_session(tmp_path, "Emacs", "init.el")
    session.init.write_text("")  # the stock setup is in the driver: nothing of keel's
    args = [EMACS, "--batch", "-l", str(STOCK_DRIVER)]
    try:
        proc, seen = session.run(args)
        assert proc.returncode == 0 and seen.get("ok") is True, (proc.returncode, seen, proc.stderr[-3000:])
        mission_id = seen["mission"]
        asked = [p for p in seen["prompts"] if "keel · ship asks:" in p[0]]
        assert [(p[0].split("asks: ")[1].split("\n")[0], p[1]) for p in asked] == [
            ("Ship it?", ["yes", "no"]),
            ("Really?", ["yes", "no"]),
        ], seen
        assert "keel answer" not in proc.stderr, proc.stderr[-3000:]
        shown = [line for line in proc.stderr.splitlines() if f"keel: ship ({mission_id})" in line]
        assert any(line.endswith("(0%)") for line in shown)  # running, or already at its unit, proc.stderr[-3000:]
        assert shown[-1].endswith("completed (100%)"), shown
        with Store.open(session.store) as s:
            assert s.read(lambda t: m.get_mission(t, mission_id)).state.value == "completed"
    finally:
        kill_hosts(session.store)


@pytest.mark.skipif(EMACS is None, reason="emacs is not installed (run scripts/setup.sh --system)")
def test_keel_el_byte_compiles_without_warnings(tmp_path: Path) -> None:
    assert EMACS is not None
    copy = tmp_path / "keel.el"
    shutil.copyfile(PLUGIN / "keel.el", copy)
    args = [EMACS, "--batch", "-L", str(tmp_path), "--eval", "(setq byte-compile-error-on-warn t)"]
    proc = subprocess.run([*args, "-f", "batch-byte-compile", str(copy)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and copy.with_suffix(".elc").exists(), proc.stderr[-3000:]
