"""`--store postgresql://…` and $KEEL_STORE: a URL names the store; each workspace keeps a local folder for
it (`.keel/pg-<hash>`: logs, locks and sandboxes beside it) holding only the URL; a URL with a password
is refused before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

from engine_helpers import write_mission

from keel.storage.location import URL_FILE
from tests.pgserver import PgServer
from tests.postgres.pgcli import keel_in


def test_a_mission_runs_and_is_listed_through_a_store_url(tmp_path: Path, pg_server: PgServer) -> None:
    url = pg_server.store_url(pg_server.new_schema())
    mission = write_mission(tmp_path, [{"id": "u", "params": {"steps": [{"now": True}]}}])
    ran = keel_in(tmp_path, "run", str(mission), "--json", "--store", url)
    assert ran.returncode == 0, ran.stderr
    mid = json.loads(ran.stdout.splitlines()[0])["mission"]
    (folder,) = (tmp_path / ".keel").glob("pg-*")
    assert (folder / URL_FILE).read_text().strip() == url and sorted(p.name for p in folder.iterdir()) == [URL_FILE]
    elsewhere = tmp_path / "other"
    elsewhere.mkdir()
    listed = keel_in(elsewhere, "missions", "--json", env={"KEEL_STORE": url})  # another workspace, same store
    assert listed.returncode == 0, listed.stderr
    assert [m["id"] for m in json.loads(listed.stdout)] == [mid]


def test_a_store_url_with_a_password_is_refused(tmp_path: Path, pg_server: PgServer) -> None:
    url = f"postgresql://postgres:secret@127.0.0.1:{pg_server.port}/postgres"
    mission = write_mission(tmp_path, [{"id": "u", "params": {"steps": [{"now": True}]}}])
    refused = keel_in(tmp_path, "run", str(mission), "--store", url)
    assert refused.returncode != 0
    assert "must not hold a password" in refused.stderr and "secret" not in refused.stderr
    assert not (tmp_path / ".keel").exists()
