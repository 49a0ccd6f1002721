"""Teams sharing one PostgreSQL server, each with a role and a database of its own (docs/postgres.md, "Teams
sharing a server"): one team's role cannot reach the other's store (refused, naming why: exit 8), and holding
every lock keel takes in its own database does not stall the other team's writes (advisory locks are the
database's). The same lock held in the other team's database would: that is why a database each."""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg

from keel.storage.pg import _LOCK_CLASS
from tests.pgserver import PgServer
from tests.postgres.pgcli import keel_in

MISSION = '[mission]\nname = "m"\nagent = "true"\n\n[[units]]\nid = "u"\n'


def _team(pg_server: PgServer) -> tuple[str, str, str]:
    """A role with a password and a database it owns that nobody else may connect to: (role, password, url)."""
    role, password = pg_server.password_role()
    database = "k" + uuid.uuid4().hex[:12]
    with pg_server.connect() as conn:
        conn.execute(f"CREATE DATABASE {database} OWNER {role}")
        conn.execute(f"REVOKE CONNECT ON DATABASE {database} FROM PUBLIC")
    return role, password, f"postgresql://{role}@127.0.0.1:{pg_server.port}/{database}"


def test_a_team_cannot_reach_or_stall_another_teams_store(tmp_path: Path, pg_server: PgServer) -> None:
    role_a, password_a, url_a = _team(pg_server)
    role_b, password_b, url_b = _team(pg_server)
    a, b = {"PGPASSWORD": password_a}, {"PGPASSWORD": password_b}
    for url, env in ((url_a, a), (url_b, b)):  # each team's tables and schema record, made by its own role
        made = keel_in(tmp_path, "missions", "--store", url, env=env)
        assert made.returncode == 0, made.stderr

    intruding = keel_in(tmp_path, "missions", "--store", url_a.replace(role_a, role_b), env=b)
    assert intruding.returncode == 8, intruding.stdout + intruding.stderr
    assert "CONNECT" in intruding.stderr or "permission denied" in intruding.stderr, intruding.stderr

    (tmp_path / "mission.toml").write_text(MISSION)
    quick = {**a, "KEEL_WRITE_LOCK_TIMEOUT_S": "2"}
    # in team B's database, the lock every write of a store in schema `public` takes (a superuser's session)
    with psycopg.connect(url_b.replace(f"{role_b}@", "postgres@"), autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s, hashtext('public'))", (_LOCK_CLASS,))
        written = keel_in(tmp_path, "run", str(tmp_path / "mission.toml"), "--queue", "--store", url_a, env=quick)
        assert written.returncode == 0, written.stdout + written.stderr
    # the same lock held in team A's own database stalls A's writes: one database for both teams would
    with psycopg.connect(url_a.replace(f"{role_a}@", "postgres@"), autocommit=True) as same:
        same.execute("SELECT pg_advisory_lock(%s, hashtext('public'))", (_LOCK_CLASS,))
        stalled = keel_in(tmp_path, "run", str(tmp_path / "mission.toml"), "--queue", "--store", url_a, env=quick)
    assert stalled.returncode == 7, stalled.stdout + stalled.stderr
