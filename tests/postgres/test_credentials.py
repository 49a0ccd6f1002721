"""A store whose role logs in with a password (scram-sha-256, as a stock PostgreSQL 15 admits roles over TCP),
the password given in $PGPASSWORD: keel's own processes that open the store (a unit's subagent, a worker) get
it, their agents and commands never do; a worker process that cannot open the store pauses the mission with
the server's words instead of being started again and again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from engine_helpers import write_mission

from keel.storage.location import URL_FILE
from tests.pgserver import PgServer
from tests.postgres.pgcli import keel_in


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """keel's environment: no ~/.pgpass (HOME is empty), the password only where `extra` puts it."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    return {**base, "HOME": str(home), "KEEL_STORE_RECONNECT_S": "2", **extra}


def test_units_run_when_the_password_is_in_pgpassword(tmp_path: Path, pg_server: PgServer) -> None:
    role, password = pg_server.password_role()
    url = pg_server.role_url(role, pg_server.role_schema(role))
    side = tmp_path / "seen.txt"
    steps = [{"tool": "run", "args": {"cmd": f"env > {side}"}}, {"now": True}]
    mission = write_mission(tmp_path, [{"id": "a", "params": {"steps": steps}}, {"id": "b", "after": ["a"]}])
    env = _env(tmp_path, PGPASSWORD=password)
    ran = keel_in(tmp_path, "run", str(mission), "--json", "--store", url, whole_env=env)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    mid = json.loads(ran.stdout.splitlines()[0])["mission"]
    status = keel_in(tmp_path, "status", mid, "--json", "--store", url, whole_env=env)
    assert json.loads(status.stdout)["mission"]["state"] == "completed"
    seen = side.read_text()
    assert password not in seen and "PGPASSWORD" not in seen


def test_keel_workers_run_units_when_the_password_is_in_pgpassword(tmp_path: Path, pg_server: PgServer) -> None:
    role, password = pg_server.password_role()
    url = pg_server.role_url(role, pg_server.role_schema(role))
    units = [{"id": u, "params": {"steps": [{"now": True}]}} for u in ("a", "b")]
    mission = write_mission(tmp_path, units, workers=True)
    env = _env(tmp_path, PGPASSWORD=password)
    first = keel_in(tmp_path, "missions", "--store", url, whole_env=env)  # the store exists before the worker
    assert first.returncode == 0, first.stderr
    worker = subprocess.Popen(
        [sys.executable, "-m", "keel.server.cli", "worker", "--store", url, "--units", "2"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        ran = keel_in(tmp_path, "run", str(mission), "--json", "--store", url, whole_env=env, timeout=120)
    finally:
        worker.terminate()
        said, _ = worker.communicate(timeout=60)
    assert ran.returncode == 0, ran.stdout + ran.stderr + said
    mid = json.loads(ran.stdout.splitlines()[0])["mission"]
    assert f"{mid}/a: succeeded" in said and f"{mid}/b: succeeded" in said, said


def test_a_worker_process_that_cannot_open_the_store_pauses_the_mission(tmp_path: Path, pg_server: PgServer) -> None:
    role, password = pg_server.password_role()
    other, _ = pg_server.password_role()  # a role whose password this machine does not have
    schema = pg_server.role_schema(role)
    url = pg_server.role_url(role, schema)
    folder = tmp_path / "store"
    folder.mkdir()
    (folder / URL_FILE).write_text(url + "\n")
    # unit a points the store's folder at the other role: every worker process started after it is refused
    refused = tmp_path / "refused.url"
    refused.write_text(pg_server.role_url(other, schema) + "\n")
    swap = {"tool": "run", "args": {"cmd": f"cp {refused} {folder / URL_FILE}"}}
    mission = write_mission(
        tmp_path, [{"id": "a", "params": {"steps": [swap]}}, {"id": "b", "after": ["a"], "params": {"steps": []}}]
    )
    env = _env(tmp_path, PGPASSWORD=password)
    started = time.monotonic()
    ran = keel_in(tmp_path, "run", str(mission), "--json", "--store", str(folder), whole_env=env)
    took = time.monotonic() - started
    (folder / URL_FILE).write_text(url + "\n")
    status = keel_in(tmp_path, "status", "--json", "--store", str(folder), whole_env=env)
    (listed,) = json.loads(status.stdout)
    shown = keel_in(tmp_path, "status", listed["id"], "--store", str(folder), whole_env=env).stdout
    assert listed["state"] == "paused" and listed["pause_reason"] == "store", (ran.stdout, ran.stderr, shown)
    assert f'password authentication failed for user "{other}"' in shown, shown
    assert "unit b" in shown and "3 times" in shown, shown
    assert took < 120, took


def test_a_wrong_password_fails_at_once_with_the_servers_words(tmp_path: Path, pg_server: PgServer) -> None:
    role, _ = pg_server.password_role()
    url = pg_server.role_url(role, pg_server.role_schema(role))
    env = {**_env(tmp_path, PGPASSWORD="not-the-password"), "KEEL_STORE_RECONNECT_S": "30"}
    started = time.monotonic()
    listed = keel_in(tmp_path, "missions", "--store", url, whole_env=env)
    took = time.monotonic() - started
    assert listed.returncode == 8, (listed.returncode, listed.stderr)  # README: 8 store refused
    assert f'password authentication failed for user "{role}"' in listed.stderr, listed.stderr
    assert "could not be reached" not in listed.stderr and took < 15, (took, listed.stderr)
