"""`keel demo --store DIR`: the demo records its mission in DIR (and keeps its sample repository), so the
mission can be looked at afterwards with the ordinary commands."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from keel.storage import Store
from keel.storage import missions as m


def test_demo_records_its_mission_in_the_given_store(tmp_path: Path) -> None:
    store = tmp_path / "demo-store"
    env = {k: v for k, v in os.environ.items() if k != "KEEL_STORE"}
    proc = subprocess.run(
        [sys.executable, "-m", "keel.server.cli", "demo", "--store", "demo-store"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
        env=env,
    )
    kept = re.search(r"its sample repository stays at (\S+)", proc.stdout)
    try:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert (store / "data.mdb").exists(), f"no store at {store}"
        with Store.open(store, create=False) as s:
            missions = s.read(m.list_missions)
        assert len(missions) == 1 and missions[0].state.value == "completed"
        assert f"the mission stays in store {store}" in proc.stdout
        assert kept and Path(kept.group(1)).is_dir() and (Path(kept.group(1)) / "test_shop.py").exists()
        shown = subprocess.run(
            [sys.executable, "-m", "keel.server.cli", "status", missions[0].id, "--json", "--store", str(store)],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["mission"]["state"] == "completed"
        named = re.search(r"\((keel [^)]*)\)", proc.stdout)  # the command the demo names to look further
        assert named, proc.stdout
        for argv in (named.group(1).split()[1:], ["status", missions[0].id, "--store", str(store)]):
            looked = subprocess.run(
                [sys.executable, "-m", "keel.server.cli", *argv], capture_output=True, text=True, timeout=60, env=env
            )
            assert looked.returncode == 0, f"keel {' '.join(argv)}: {looked.stdout}{looked.stderr}"
        logs = re.findall(r"agent's stderr: (\S+)", looked.stdout)
        assert len(logs) == 4 and all(Path(log).is_file() for log in logs), looked.stdout
        assert "verification   python -m unittest -q test_shop: passed" in looked.stdout, looked.stdout
        assert not (tmp_path / ".keel").exists()  # nothing went to the default store
    finally:
        if kept:
            shutil.rmtree(Path(kept.group(1)).parent, ignore_errors=True)
