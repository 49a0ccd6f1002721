"""The `keel` command as a user runs it: a real subprocess per call, real stores in tmp_path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from keel.storage import DB, Store
from keel.storage.keys import log_key, unit_prefix
from keel.storage.migrations import SCHEMA_VERSION, SchemaInfo
from tests.storage.raw import flip_byte
from tests.storage.test_verify import make_mission


def keel(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "KEEL_STORE"}
    return subprocess.run(
        [sys.executable, "-m", "keel.server.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**base, **(env or {})},
        timeout=60,
    )


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("keel: ")
    return lines[0]


def test_help_and_usage_errors(tmp_path: Path) -> None:
    proc = keel("--help")
    assert proc.returncode == 0 and "verify" in proc.stdout and "missions" in proc.stdout
    proc = keel("frobnicate")
    assert proc.returncode == 2 and "invalid choice: 'frobnicate'" in proc.stderr
    assert keel().returncode == 2


def test_verify_fresh_store_and_missing_store(tmp_path: Path) -> None:
    Store.open(tmp_path / "new").close()
    proc = keel("verify", "--store", str(tmp_path / "new"))
    assert proc.returncode == 0 and "0 problems" in proc.stdout, proc.stderr
    proc = keel("verify", "--store", str(tmp_path / "nothing"))
    assert proc.returncode == 6
    assert one_line_error(proc) == (
        f"keel: no keel store at {tmp_path / 'nothing'} (run a mission first, or pass --store DIR)"
    )
    assert not (tmp_path / "nothing").exists()  # looking did not create anything


def test_missions_and_status_without_a_store(tmp_path: Path) -> None:
    for verb in (["missions"], ["status"]):
        proc = keel(*verb, cwd=tmp_path)
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, "no missions\n", "")
    proc = keel("missions", "--json", cwd=tmp_path)
    assert json.loads(proc.stdout) == []
    assert not (tmp_path / ".keel").exists()
    proc = keel("status", "nope", cwd=tmp_path)
    assert proc.returncode == 6 and one_line_error(proc).startswith("keel: no keel store at")


def test_default_store_is_in_the_workspace_unless_flag_or_env(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    with Store.open(ws / ".keel" / "store") as store:
        make_mission(store, "m-default")
    assert (ws / ".keel" / ".gitignore").read_text().splitlines()[-1] == "*"
    with Store.open(tmp_path / "other") as store:
        make_mission(store, "m-other")
    assert not (tmp_path / ".gitignore").exists()  # only a `.keel` folder gets one
    assert "m-default" in keel("missions", cwd=ws).stdout
    assert "m-other" in keel("missions", "--store", str(tmp_path / "other"), cwd=ws).stdout
    assert "m-other" in keel("missions", cwd=ws, env={"KEEL_STORE": str(tmp_path / "other")}).stdout


def test_status_of_a_mission_text_and_json(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s") as store:
        make_mission(store, "mission-one")
    proc = keel("status", "mission-o", "--store", str(tmp_path / "s"))
    assert proc.returncode == 0, proc.stderr
    assert "mission mission-one: mission-one" in proc.stdout and "restore points 2" in proc.stdout
    data = json.loads(keel("status", "mission-one", "--json", "--store", str(tmp_path / "s")).stdout)
    assert data["mission"]["state"] == "running" and data["units"]["u1"]["journal_hwm"] == 2
    proc = keel("status", "UNKNOWN", "--store", str(tmp_path / "s"))
    assert proc.returncode == 6 and one_line_error(proc) == "keel: no mission 'UNKNOWN'"


def test_verify_names_a_flipped_record_and_json_parses(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with Store.open(path) as store:
        make_mission(store, "m1")
    proc = keel("verify", "--json", "--store", str(path))
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["ok"] and report["problems"] == [] and report["records"] > 10
    flip_byte(path, DB.JOURNAL, log_key(unit_prefix("m1", "u1"), 1), 47)
    proc = keel("verify", "--store", str(path))
    assert proc.returncode == 5
    assert "CORRUPT journal/m1/u1/1: digest mismatch (BLAKE2b-256)" in proc.stdout
    report = json.loads(keel("verify", "--json", "--store", str(path)).stdout)
    assert report["problems"] == [{"db": "journal", "key": "m1/u1/1", "message": "digest mismatch (BLAKE2b-256)"}]


def test_errors_are_one_line_and_tracebacks_only_with_debug(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with Store.open(path) as store:
        store.write(lambda t: t.put(DB.META, b"schema", SchemaInfo(version=SCHEMA_VERSION + 1, written_by="9.0")))
    proc = keel("missions", "--store", str(path))
    assert proc.returncode == 1
    assert f"has schema {SCHEMA_VERSION + 1}, written by keel 9.0" in one_line_error(proc)
    assert "upgrade keel" in proc.stderr
    proc = keel("verify", "--store", str(path))
    assert proc.returncode == 1 and "upgrade keel" in one_line_error(proc)
    proc = keel("missions", "--debug", "--store", str(path))
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "StoreTooNewError" in proc.stderr


def test_garbage_data_file_is_a_clean_integrity_error(tmp_path: Path) -> None:
    path = tmp_path / "s"
    Store.open(path).close()
    (path / "data.mdb").write_bytes(b"this is not an LMDB file" * 200)
    proc = keel("missions", "--store", str(path))
    assert proc.returncode == 5 and "the LMDB file is damaged" in one_line_error(proc)
    proc = keel("verify", "--store", str(path))
    assert proc.returncode == 5 and "the LMDB file is damaged" in proc.stdout


def test_a_relative_store_reaches_the_workers_as_an_absolute_path(tmp_path: Path) -> None:
    """Workers run in their unit's sandbox: a relative --store must not be resolved there."""
    mission = tmp_path / "m.toml"
    mission.write_text(
        '[mission]\nname = "rel"\nagent = ["python", "-m", "keel.agents.scripted"]\n'
        'workspace = "ws"\n\n[[units]]\nid = "a"\nparams = { steps = [{ now = true }] }\n'
    )
    (tmp_path / "ws").mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "keel.server.cli", "run", "m.toml", "--store", "rel/store"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "rel" / "store" / "data.mdb").exists()
