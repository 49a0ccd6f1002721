"""The first command an operator runs against a new (or half-made) PostgreSQL database is often a read-only
one: it answers as on any empty store, or names what is missing; never "opened read-only"."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg

from keel.storage.pg import _TABLES
from tests.pgserver import PgServer
from tests.postgres.pgcli import keel_in


def _read_only_verbs(tmp_path: Path, url: str, env: dict[str, str] | None = None) -> None:
    listed = keel_in(tmp_path, "missions", "--store", url, env=env)
    assert listed.returncode == 0 and listed.stdout.strip() == "no missions", listed.stdout + listed.stderr
    status = keel_in(tmp_path, "status", "--json", "--store", url, env=env)
    assert status.returncode == 0 and json.loads(status.stdout) == [], status.stderr
    verified = keel_in(tmp_path, "verify", "--store", url, env=env)
    assert verified.returncode == 0 and "0 problems" in verified.stdout, verified.stdout + verified.stderr


def test_read_only_verbs_answer_on_an_empty_database(tmp_path: Path, pg_server: PgServer) -> None:
    _read_only_verbs(tmp_path, pg_server.store_url(pg_server.new_schema()))


def test_read_only_verbs_answer_when_the_tables_exist_without_a_schema_record(
    tmp_path: Path, pg_server: PgServer
) -> None:
    schema = pg_server.new_schema()
    with psycopg.connect(pg_server.store_url(schema), autocommit=True) as conn:
        conn.execute(_TABLES)
    _read_only_verbs(tmp_path, pg_server.store_url(schema))


def test_a_role_that_may_not_make_the_tables_is_told_which_are_missing(tmp_path: Path, pg_server: PgServer) -> None:
    role, password = pg_server.password_role()
    schema = pg_server.new_schema()  # owned by postgres: the role may use it, not create in it
    with pg_server.connect() as conn:
        conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
    listed = keel_in(tmp_path, "missions", "--store", pg_server.role_url(role, schema), env={"PGPASSWORD": password})
    assert listed.returncode != 0
    assert "has no keel table yet (keel_records)" in listed.stderr, listed.stderr
    assert "read-only" not in listed.stderr
