"""A connection cut around COMMIT (a real TCP proxy, tests/postgres/pgproxy.py): keel reads the outcome
back instead of guessing. Cut after the server received COMMIT, the transaction committed although the
client never heard: running it again would append a second journal entry. Cut before, it never
committed: not running it again would lose the entry. Either way exactly one entry is stored, and the
write returns its sequence number."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from keel.protocol.records import JournalEntry
from keel.storage import DB, Store
from keel.storage.keys import unit_prefix
from keel.storage.location import URL_FILE
from tests.pgserver import PgServer
from tests.postgres.pgproxy import PgProxy


@pytest.fixture
def proxy(pg_server: PgServer) -> Iterator[PgProxy]:
    p = PgProxy(pg_server.port)
    yield p
    p.close()


@pytest.mark.parametrize("when", ["after", "before"])
def test_a_commit_whose_answer_is_lost_is_read_back_never_guessed(
    tmp_path: Path, pg_server: PgServer, proxy: PgProxy, when: str
) -> None:
    folder = tmp_path / "store"
    folder.mkdir()
    url = pg_server.store_url(pg_server.new_schema()).replace(f":{pg_server.port}/", f":{proxy.port}/")
    (folder / URL_FILE).write_text(url + "\n")
    prefix = unit_prefix("m1", "u1")
    entry = JournalEntry(seq=1, kind="now", fingerprint="f1", result=1)
    with Store.open(folder) as store:
        assert store.write(lambda t: t.append(DB.JOURNAL, prefix, entry)) == 1  # through the proxy, uncut
        proxy.cut(when)
        second = JournalEntry(seq=2, kind="now", fingerprint="f2", result=2)
        assert store.write(lambda t: t.append(DB.JOURNAL, prefix, second)) == 2
        assert proxy.strikes == 1, "the COMMIT was not cut: the test proves nothing"
        stored = store.read(lambda t: list(t.read_log(DB.JOURNAL, prefix, JournalEntry)))
    assert stored == [(1, entry), (2, second)]
