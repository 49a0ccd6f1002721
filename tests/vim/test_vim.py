"""Vim 9's built-in LSP channel as a client of keel serve, through the README's Vim snippet run verbatim.

Vim answers a server's request only when its id is a number (E475 otherwise, vim/vim#14091), so this is
where keel's integer ids for `window/showMessageRequest` and `window/workDoneProgress/create` matter.
Vim runs headless (`-es`, commands on stdin): the snippet starts a mission whose agent asks a question,
Vim's `inputlist()` reads the choice "1" from stdin, and the mission runs to completion with progress.
Needs Debian's `vim` (scripts/setup.sh --system installs it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from keel.storage import Store
from keel.storage import missions as m
from tests.hosts import kill_hosts
from tests.lsp.conftest import mission_toml

VIM = shutil.which("vim")
ROOT = Path(__file__).resolve().parents[2]
HARNESS = Path(__file__).with_name("harness.vim")


def readme_block(language: str, after: str) -> str:
    """The first ```language block of README.md after the line starting with `after`."""
    text = (ROOT / "README.md").read_text()
    start = text.index(after)
    match = re.compile(rf"^```{language}\n(.*?)^```$", re.S | re.M).search(text, start)
    assert match is not None, f"README.md has no {language} block after {after!r}"
    return match.group(1)


def _vim_version() -> tuple[int, int]:
    if VIM is None:
        return (0, 0)
    first = subprocess.run([VIM, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    found = re.search(r"Vi IMproved (\d+)\.(\d+)", first)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


@pytest.mark.skipif(_vim_version() < (9, 0), reason="needs Vim 9 with the LSP channel (scripts/setup.sh --system)")
def test_readme_vim_snippet_answers_a_question_and_shows_progress(tmp_path: Path) -> None:
    snippet = tmp_path / "keel.vim"
    snippet.write_text(readme_block("vim", "**Vim**"))
    mission = tmp_path / "vim.toml"
    steps = [{"ask": "Ship it?", "choices": ["yes", "no"]}, *[{"sleep": 0.1}] * 5]
    mission.write_text(mission_toml("vim", [{"id": "u", "steps": steps}]))
    store, out = tmp_path / ".keel" / "store", tmp_path / "seen.json"
    commands = [
        f"source {snippet}",
        f"source {HARNESS}",
        f"cd {tmp_path}",
        f"KeelStart {mission.name}",
        "call KeelTestWait('completed', 40)",
        "1",  # read by inputlist() when the question arrives during the wait (else a harmless `:1`)
        f"call KeelTestWrite('{out}')",
        "qa!",
    ]
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "HOME": str(tmp_path),
    }
    try:
        proc = subprocess.run(
            [VIM, "-Nu", "NONE", "-i", "NONE", "-n", "-es"],
            input="\n".join(commands) + "\n",
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        seen = json.loads(out.read_text()) if out.exists() else {}
        assert seen, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
        messages = seen["messages"]
        assert not [line for line in messages if "E475" in line] and "E475" not in seen["errmsg"], messages
        assert list(seen["missions"].values()) == ["completed"], seen
        assert any(re.match(r"keel: .*\d+%$", line) for line in messages), messages  # $/progress begin/report
        assert any(re.fullmatch(r"keel: \S+ created", line) for line in messages), messages
        (mid,) = seen["missions"]
        with Store.open(store) as s:
            controls = s.read(lambda t: [c for _, c in m.controls_after(t, mid, 0)])
        assert [(c.action, c.text, c.source) for c in controls] == [("answer", "yes", "lsp")], controls
    finally:
        kill_hosts(store)
