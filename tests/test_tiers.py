"""The fast tier needs no PostgreSQL: a decision table touches no store, so it runs once, not once per
backend; a test that does touch a store runs on both where PostgreSQL is installed, and on a machine
without it its PostgreSQL run is skipped with the reason (as tests of other missing tools are), while its
LMDB run and every table still run. Each check runs pytest itself (tests/conftest.py draws the tiers)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TABLES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*_table.py"))
STORE_MODULE = "tests/storage/test_schema.py"  # fast, and every test of it opens a store
OUTCOME = re.compile(r"^(tests/\S+?::.+?) (PASSED|FAILED|SKIPPED|ERROR)\b.*\[ *\d+%\]$", re.MULTILINE)  # pytest -v
NO_POSTGRESQL = """
import tests.pgserver


def pytest_configure(config):
    tests.pgserver._bindir = lambda: None  # no initdb anywhere: as on a machine without PostgreSQL
"""


def _pytest(*args: str, plugin_dir: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(plugin_dir or ""), str(ROOT)]))}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_fast_tier_runs_where_postgresql_is_not_installed(tmp_path: Path) -> None:
    (tmp_path / "no_postgresql.py").write_text(NO_POSTGRESQL)
    done = _pytest("-v", "-m", "not slow", "-p", "no_postgresql", *TABLES, STORE_MODULE, plugin_dir=tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    summary = done.stdout.strip().splitlines()[-1]  # "== N passed, M skipped in …s ==": nothing failed or errored
    assert re.fullmatch(r"=+ \d+ passed, \d+ skipped in [^,]* =+", summary), out
    outcomes = [m.groups() for m in OUTCOME.finditer(done.stdout)]
    tables = {test: outcome for test, outcome in outcomes if "_table.py::" in test}
    assert tables and set(tables.values()) == {"PASSED"}, out
    assert not [test for test in tables if "[lmdb" in test or "[postgresql" in test], out  # once, on no backend
    stored = {test: outcome for test, outcome in outcomes if test.startswith(STORE_MODULE)}
    on_postgresql = [outcome for test, outcome in stored.items() if test.endswith("[postgresql]")]
    on_lmdb = [outcome for test, outcome in stored.items() if test.endswith("[lmdb]")]
    assert on_postgresql and set(on_postgresql) == {"SKIPPED"}, out
    assert len(on_lmdb) == len(on_postgresql) and set(on_lmdb) == {"PASSED"}, out
    assert "PostgreSQL is not installed (run scripts/setup.sh --system" in out
