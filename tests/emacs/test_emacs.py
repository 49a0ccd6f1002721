"""editors/emacs/keel.el in Debian's Emacs (28, eglot 1.9 from elpa-eglot), headless: the README's snippet
verbatim, then a mission file opened in conf-toml-mode, keel-start, keel-pause, keel-resume and keel-answer
with mission ids completed from keel/missions, and the mode line following keel/missionChanged — against a
real `keel serve`, a real store and a real mission host.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from keel.storage import Store
from keel.storage import missions as m
from tests.editors import editor_session
from tests.hosts import kill_hosts

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "editors" / "emacs"
DRIVER = Path(__file__).with_name("driver.el")
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
            ["keel · ship asks: Ship it? ", ["yes", "no"]],
            ["keel · ship asks: Really? ", ["yes", "no"]],
        ], seen
        assert seen["pause-offered"] == [mission_id]
        assert seen["pause-annotations"][0].startswith(f"  ship ({mission_id}) running"), seen
        # an older server answers the state it saw, a newer one the acknowledged transition
        assert seen["pause-state"] in ("pausing", "paused", "running"), seen
        assert seen["answer-offered"] == [["Answer mission: ", [mission_id]], ["Really? ", ["yes", "no"]]], seen
        assert " keel[ship running " in seen["modeline-running"], seen
        assert " keel[ship paused 0%]" in seen["modeline-paused"], seen
        assert " keel[ship waiting_input 0% ?]" in seen["modeline-waiting_input"], seen
        assert " keel[" not in seen["modeline-completed"], seen
        assert seen["missions"] == [f"ship ({mission_id}) completed"], seen
        assert "no mission 'm-no-such-mission'" in seen["error"], seen
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
