"""A real mission's store, truncated: every verb ends with exit 5 and one line naming data.mdb, never a signal.

LMDB maps data.mdb; a page past the end of a truncated file is a SIGBUS (exit 135, no message) and an
empty file is silently re-initialised as a new store. keel checks the file with plain reads first.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from keel.storage.lmdbfile import DataFile, newest
from keel.storage.lmdbwalk import _Walk
from tests.bundles.kit import keel
from tests.rewind.kit import mission

PAGE = 4096
SIZES = ["0", "8k", "16k", "40k", "one page short"]


def _last_used_page(data: Path) -> int:
    with DataFile(data) as f:
        walker = _Walk(f, newest(f.metas()))
        assert walker.run() == []
    return max(walker.owner)


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """(store, mission id, a restore point) of a completed mission run through the CLI."""
    tmp = tmp_path_factory.mktemp("damage")
    _, store, mission_id = mission(tmp)
    points = keel("points", mission_id, "--json", store=store)
    assert points.returncode == 0, points.stderr
    point = json.loads(points.stdout)[0]["id"]
    assert keel("verify", store=store).returncode == 0
    return store, mission_id, str(point)


@pytest.mark.parametrize("size", SIZES)
def test_every_verb_on_a_truncated_store_exits_5_with_a_message(
    finished: tuple[Path, str, str], tmp_path: Path, size: str
) -> None:
    source, mission_id, point = finished
    store = tmp_path / "store"
    shutil.copytree(source, store)
    data = store / "data.mdb"
    full = data.stat().st_size
    assert full > 40 * 1024 + PAGE
    # "one page short": of the last page in use (pages after it are free; see the next test)
    length = _last_used_page(data) * PAGE if size == "one page short" else int(size.rstrip("k")) * 1024
    with open(data, "r+b") as f:
        f.truncate(length)
    verbs = [
        ["missions"],
        ["status"],
        ["status", mission_id],
        ["points", mission_id],
        ["resume", mission_id],
        ["restore", mission_id, point],
        ["verify"],
    ]
    for verb in verbs:
        proc = keel(*verb, store=store)
        assert proc.returncode == 5, f"keel {' '.join(verb)} on {length} bytes: exit {proc.returncode} {proc.stderr}"
        assert "Traceback" not in proc.stderr
        said = proc.stdout if verb == ["verify"] else proc.stderr
        assert "data.mdb" in said or "truncated" in said or "past the end" in said, (verb, said)
        if verb != ["verify"]:
            assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
            assert f"{data} is {length} bytes" in proc.stderr, proc.stderr
        assert data.stat().st_size == length  # nothing re-initialised or rewritten


def test_losing_only_free_pages_at_the_end_is_not_damage(finished: tuple[Path, str, str], tmp_path: Path) -> None:
    """LMDB never writes a page freed in the transaction that allocated it, so a healthy file may end before
    its last free pages; a file cut after its last used page loses nothing and still opens."""
    source, mission_id, _ = finished
    store = tmp_path / "store"
    shutil.copytree(source, store)
    data = store / "data.mdb"
    end = (_last_used_page(data) + 1) * PAGE
    if end == data.stat().st_size:
        pytest.skip("this store's last page is in use")
    with open(data, "r+b") as f:
        f.truncate(end)
    assert keel("verify", store=store).returncode == 0
    proc = keel("status", mission_id, store=store)
    assert proc.returncode == 0 and "completed" in proc.stdout, proc.stderr
