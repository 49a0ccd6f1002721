"""What an operator is told when a PostgreSQL store cannot be written or found: a write that waits too long for
another's lock names the holder (exit 7, busy); a URL whose schema does not exist, or is not the role's to
use, names the schema (exit 8, refused). Never "unreachable", never an internal error."""

from __future__ import annotations

from pathlib import Path

from keel.storage.pg import _LOCK_CLASS
from tests.pgserver import PgServer
from tests.postgres.pgcli import keel_in


def test_a_write_that_waits_past_its_limit_is_busy_and_names_the_holder(tmp_path: Path, pg_server: PgServer) -> None:
    schema = pg_server.new_schema()
    url = pg_server.store_url(schema)
    made = keel_in(tmp_path, "missions", "--store", url)  # the tables and the schema record
    assert made.returncode == 0, made.stderr
    with pg_server.connect() as holder:
        holder.execute("SET application_name = 'the nightly report'")
        holder.execute("BEGIN")
        holder.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (_LOCK_CLASS, schema))
        mission = tmp_path / "mission.toml"  # `keel run` writes at once: the mission's record
        mission.write_text('[mission]\nname = "m"\nagent = "true"\n\n[[units]]\nid = "u"\n')
        written = keel_in(tmp_path, "run", str(mission), "--store", url, env={"KEEL_WRITE_LOCK_TIMEOUT_S": "0.5"})
        holder.execute("ROLLBACK")
    assert written.returncode == 7, written.stdout + written.stderr
    assert "the nightly report" in written.stderr and "unreachable" not in written.stderr, written.stderr


def test_a_schema_that_does_not_exist_is_named(tmp_path: Path, pg_server: PgServer) -> None:
    listed = keel_in(tmp_path, "missions", "--store", pg_server.store_url("no_such_schema"))
    assert listed.returncode == 8, listed.stdout + listed.stderr
    assert "no_such_schema" in listed.stderr and "internal error" not in listed.stderr, listed.stderr


def test_a_schema_the_role_may_not_use_is_named(tmp_path: Path, pg_server: PgServer) -> None:
    role, password = pg_server.password_role()
    schema = pg_server.new_schema()  # owned by postgres, no USAGE granted to the role
    listed = keel_in(tmp_path, "missions", "--store", pg_server.role_url(role, schema), env={"PGPASSWORD": password})
    assert listed.returncode == 8, listed.stdout + listed.stderr
    assert schema in listed.stderr and "internal error" not in listed.stderr, listed.stderr
