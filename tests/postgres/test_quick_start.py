"""The README's PostgreSQL quick start, run as printed against a fresh cluster whose pg_hba.conf is a stock
PostgreSQL 15's (TCP by scram-sha-256): its lines are read from README.md at test time, so an edit that
breaks them fails here. What cannot run on a test machine is mapped, never rewritten: `sudo -u postgres`
becomes the cluster's superuser over its unix socket, `db.internal:5432` the cluster's address, `pip
install` a dry run from this checkout (no network), and HOME a fresh folder (its ~/.pgpass is the one the
quick start writes). The mission lines run on this one machine: `keel run … --detach`, `keel missions`,
`keel pause ID` and `keel resume ID` with the id `keel missions` printed; the mission completes."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from engine_helpers import write_mission

from tests.pgserver import PgServer

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def _quick_start() -> list[str]:
    """The command lines of the first sh block of the README's PostgreSQL section, comments dropped."""
    text = README.read_text(encoding="utf-8")
    section = text.split("## Team / cloud: one PostgreSQL, several machines", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    lines = [line.split("  #", 1)[0].rstrip() for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def test_the_readme_quick_start_runs_as_printed(tmp_path: Path) -> None:
    server = PgServer(stock=True)
    try:
        home = tmp_path / "home"
        home.mkdir()
        ws = tmp_path / "app"
        ws.mkdir()
        write_mission(ws, [{"id": "u", "params": {"steps": [{"now": True}]}}], workspace=".")
        (ws / "mission.toml").rename(ws / "migrate.mission.toml")
        bindir = str(Path(sys.executable).parent)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "KEEL_"))}
        env.update(HOME=str(home), PATH=f"{bindir}:{server.bindir}:{env['PATH']}")
        lines = _quick_start()
        assert any("createuser" in line for line in lines) and any("PASSWORD" in line for line in lines)
        where = f"127.0.0.1:{server.port}"
        seen: list[str] = []  # what each `keel missions` printed
        for line in lines:
            command, cwd, extra = line.replace("db.internal:5432", where), ws, {}
            if command.startswith("sudo -u postgres "):  # the superuser, over the cluster's unix socket
                command = command.replace("sudo -u postgres ", "")
                extra = {"PGHOST": str(server.root), "PGPORT": str(server.port), "PGUSER": "postgres"}
            if command.startswith("pip install "):  # from this checkout, without the network
                (target,) = shlex.split(command)[2:]
                assert target.startswith((".", "/")) and f"'{target}'" in command, f"not a quoted checkout: {line}"
                dry = "--dry-run --no-deps --no-index --no-build-isolation"
                command = command.replace("pip install", f"{sys.executable} -m pip install {dry}", 1)
                cwd = ROOT
            if command.startswith("export "):
                name, value = command.removeprefix("export ").split("=", 1)
                env[name] = value
                continue
            if "ID" in shlex.split(command):
                command = command.replace(" ID", f" {seen[-1].split()[0]}")
            ran = subprocess.run(
                command, shell=True, cwd=cwd, env={**env, **extra}, capture_output=True, text=True, timeout=120
            )
            assert ran.returncode == 0, f"{line!r} failed ({ran.returncode}): {ran.stdout}{ran.stderr}"
            if command.startswith("keel missions"):
                seen.append(ran.stdout.strip())
        assert seen[0] == "no missions", seen  # first contact with the new database
        assert len(seen) == 2 and seen[1].split()[1] in ("created", "running", "completed"), seen
        listed = subprocess.run(["keel", "missions", "--json"], cwd=ws, env=env, capture_output=True, text=True)
        assert [m["state"] for m in json.loads(listed.stdout)] == ["completed"], listed.stdout + listed.stderr
        assert re.search(r"scram-sha-256", (server.data / "pg_hba.conf").read_text())
    finally:
        server.stop()
