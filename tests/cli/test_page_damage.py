"""A real mission's store with one page zeroed (a leaf of the evidence or the journal, a branch page, the main
tree's root): `keel status`, `log`, `points` and `resume` end with exit 5 and one line naming data.mdb and the
damaged database, never with liblmdb's abort (SIGABRT, exit 134), which no Python code can catch."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from keel.storage.lmdbfile import P_BRANCH, P_LEAF, DataFile, PageHeader, newest
from keel.storage.lmdbwalk import MAIN_DB, _Walk
from tests.bundles.kit import keel
from tests.rewind.kit import UNITS, mission

PAGE = 4096
# a third unit with enough tool steps that the evidence and journal trees are two levels deep
MANY = {
    "id": "u3",
    "after": ["u2"],
    "params": {"steps": [{"repeat": 60, "steps": [{"tool": "run", "args": {"cmd": "echo hi"}}]}]},
}


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, dict[str, tuple[int, str]]]:
    """(store, mission id, {damage kind: (page, database)}) of a mission run through the CLI."""
    _, store, mission_id = mission(tmp_path_factory.mktemp("pages"), [*UNITS, MANY])
    data = store / "data.mdb"
    with DataFile(data) as f:
        meta = newest(f.metas())
        walker = _Walk(f, meta)
        assert walker.run() == []
    raw = data.read_bytes()

    def page(db: str, flags: int) -> tuple[int, str]:
        roots = {name: record.root for name, record in walker.named}
        found = [
            p
            for p, owner in sorted(walker.owner.items())
            if owner == db and PageHeader.parse(raw[p * PAGE : p * PAGE + 16]).flags == flags and p != roots.get(db)
        ]
        return (found or [roots[db]])[-1], db  # the last leaf: a cursor steps onto it from the one before

    pages = {
        "evidence leaf": page("evidence", P_LEAF),
        "journal leaf": page("journal", P_LEAF),
        "evidence branch": ({n: r.root for n, r in walker.named}["evidence"], "evidence"),
        "main tree root": (meta.main.root, MAIN_DB),
    }
    assert PageHeader.parse(raw[pages["evidence branch"][0] * PAGE :]).flags == P_BRANCH  # two levels deep
    assert keel("verify", store=store).returncode == 0
    return store, mission_id, pages


@pytest.mark.parametrize("kind", ["evidence leaf", "journal leaf", "evidence branch", "main tree root"])
def test_read_verbs_on_a_zeroed_page_exit_5_naming_it(
    finished: tuple[Path, str, dict[str, tuple[int, str]]], tmp_path: Path, kind: str
) -> None:
    source, mission_id, pages = finished
    pgno, db = pages[kind]
    store = tmp_path / "store"
    shutil.copytree(source, store)
    data = store / "data.mdb"
    with open(data, "r+b") as f:
        f.seek(pgno * PAGE)
        f.write(bytes(PAGE))
    damaged = data.read_bytes()
    verbs = [["status", mission_id], ["log", mission_id], ["points", mission_id], ["resume", mission_id]]
    with ThreadPoolExecutor(max_workers=2) as pool:
        procs = list(pool.map(lambda verb: keel(*verb, store=store), verbs))
    codes = {verb[0]: proc.returncode for verb, proc in zip(verbs, procs, strict=True)}
    assert codes == dict.fromkeys(codes, 5), f"page {pgno} ({kind}) zeroed: exit codes {codes}"
    for verb, proc in zip(verbs, procs, strict=True):
        said = f"keel {' '.join(verb)} with page {pgno} ({kind}) zeroed: exit {proc.returncode} {proc.stderr}"
        assert proc.returncode == 5, said
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, said
        assert f"the LMDB file is damaged: {data}" in proc.stderr, said
        if db != MAIN_DB:
            assert f"page {pgno} of the {db} database" in proc.stderr, said
        else:
            assert f"damaged main tree root: page {pgno}'s header" in proc.stderr, said
    assert data.read_bytes() == damaged  # nothing was written
    verify = keel("verify", store=store)
    assert verify.returncode == 5 and f"page {pgno}" in verify.stdout, verify.stdout
