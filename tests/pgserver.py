"""A real PostgreSQL server for the tests: a throwaway cluster started once per test run.

Debian's PostgreSQL (15+; `scripts/setup.sh --system` installs it) from /usr/lib/postgresql/*/bin.
`initdb` refuses to run as root, so as root the cluster belongs to the `postgres` user and lives in
/tmp (not under /root, which that user cannot enter). It listens on 127.0.0.1 only, on a free port,
with fsync on: commits are as durable as a real deployment's. Each test gets its own schema, named in
its store URL's search_path, so tests never see each other's records.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import psycopg

from keel.storage.location import URL_FILE


def _bindir() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name))
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    return Path(initdb).resolve().parent if initdb else None


def pg_missing() -> str:
    """Why no cluster can be started here ("" when one can)."""
    if _bindir() is None:
        return "PostgreSQL is not installed (run scripts/setup.sh --system: Debian's postgresql)"
    return ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgServer:
    """One running cluster; `stop()` ends it."""

    def __init__(self, stock: bool = False) -> None:
        """`stock`: pg_hba.conf as a stock PostgreSQL 15 has it (TCP by scram-sha-256; the unix socket, in
        `root`, by trust here, where a package install has peer), instead of trust everywhere."""
        bindir = _bindir()
        if bindir is None:
            raise RuntimeError(pg_missing())
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="keel-pg-", dir="/tmp"))
        self.data = self.root / "data"
        self.port = _free_port()
        self.user = pwd.getpwuid(os.getuid()).pw_name
        if os.getuid() == 0:
            self.user = "postgres"
            shutil.chown(self.root, "postgres")
        auth = ["--auth-local=trust", "--auth-host=scram-sha-256"] if stock else ["-A", "trust"]
        self._run("initdb", "-D", str(self.data), *auth, "-U", "postgres", "--no-instructions")
        self.start()

    def _run(self, tool: str, *args: str) -> subprocess.CompletedProcess[str]:
        command = [str(self.bindir / tool), *args]
        if os.getuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        proc = subprocess.run(command, capture_output=True, text=True, cwd=self.root)
        if proc.returncode != 0:
            raise RuntimeError(f"{tool} failed: {proc.stdout}{proc.stderr}")
        return proc

    def start(self) -> None:
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} -c fsync=on -c max_connections=300"
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.root / "log"), "-w", "start")

    def restart_immediate(self) -> None:
        """A crash and restart: `pg_ctl restart -m immediate` (no shutdown checkpoint; recovery replays WAL)."""
        log = str(self.root / "log")  # the new server must not write to (and hold open) our pipe
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-l", log, "-w", "restart")

    def crash(self) -> None:
        """Stop the server at once (`pg_ctl stop -m immediate`): it stays down until `start()`."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def stop(self) -> None:
        try:
            self.crash()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    @property
    def base_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def connect(self) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(self.base_url, autocommit=True)

    def new_schema(self) -> str:
        name = "t" + uuid.uuid4().hex[:12]
        with self.connect() as conn:
            conn.execute(f"CREATE SCHEMA {name}")
        return name

    def store_url(self, schema: str) -> str:
        return f"{self.base_url}?options=-csearch_path%3D{schema}"

    def password_role(self) -> tuple[str, str]:
        """A new login role with a password, admitted over TCP only by `scram-sha-256` (as a stock
        PostgreSQL 15 admits every role): (name, password). Every other role keeps `trust`."""
        name, password = "r" + uuid.uuid4().hex[:12], uuid.uuid4().hex
        with self.connect() as conn:
            conn.execute("SET password_encryption = 'scram-sha-256'")
            conn.execute(f"CREATE ROLE {name} LOGIN PASSWORD '{password}'")
            conn.execute(f"GRANT ALL ON DATABASE postgres TO {name}")
        hba = self.data / "pg_hba.conf"
        hba.write_text(f"host all {name} 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
        self._run("pg_ctl", "-D", str(self.data), "reload")
        url = f"postgresql://{name}@127.0.0.1:{self.port}/postgres"
        for _ in range(500):  # until the server reads the new rule: no password, no entry
            try:
                psycopg.connect(url, connect_timeout=5).close()
            except psycopg.OperationalError as exc:
                if "password" in str(exc):
                    return name, password
            time.sleep(0.01)
        raise RuntimeError(f"the server did not take the scram-sha-256 rule for {name}")

    def role_url(self, role: str, schema: str) -> str:
        """The store URL of `schema` for `role` (no password: libpq finds it in $PGPASSWORD or ~/.pgpass)."""
        return f"postgresql://{role}@127.0.0.1:{self.port}/postgres?options=-csearch_path%3D{schema}"

    def role_schema(self, role: str) -> str:
        """A new schema owned by `role`."""
        name = "t" + uuid.uuid4().hex[:12]
        with self.connect() as conn:
            conn.execute(f"CREATE SCHEMA {name} AUTHORIZATION {role}")
        return name

    def store_folder(self, folder: Path) -> Path:
        """A store folder naming a new, empty PostgreSQL store (its own schema)."""
        folder.mkdir(parents=True, exist_ok=True)
        (folder / URL_FILE).write_text(self.store_url(self.new_schema()) + "\n")
        return folder


def schema_of(folder: Path) -> str:
    """The schema a PostgreSQL store folder's URL names."""
    url = (folder / URL_FILE).read_text().strip()
    return url.rsplit("search_path%3D", 1)[1]
