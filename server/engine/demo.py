"""`keel demo`: a self-contained, offline show of what keel keeps when its host is killed.

Makes a sample git repository in a temporary folder, runs a multi-unit migration mission with the
scripted agent (real file edits, real verification commands, units in parallel), SIGKILLs its own host
midway, resumes, and prints what survived. Uses the real CLI in subprocesses, exactly as a person would.
`keel demo --store DIR` records the mission in DIR (and keeps the sample repository) for a look after.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, TextIO

from keel.server import gitrun
from keel.storage import Store
from keel.storage import missions as m

SAMPLE = {
    "shop/pricing.py": 'def label(name, price):\n    return "%s costs %.2f" % (name, price)\n',
    "shop/stock.py": 'def report(item, count):\n    return "%s: %d left" % (item, count)\n',
    "shop/orders.py": 'def receipt(order_id, total):\n    return "order %s: %.2f" % (order_id, total)\n',
    "shop/__init__.py": "",
    "test_shop.py": (
        "import unittest\nfrom shop.pricing import label\nfrom shop.stock import report\n"
        "from shop.orders import receipt\n\n\nclass Shop(unittest.TestCase):\n"
        "    def test_texts(self):\n        self.assertEqual(label('tea', 2.5), 'tea costs 2.50')\n"
        "        self.assertEqual(report('tea', 3), 'tea: 3 left')\n"
        "        self.assertEqual(receipt('7', 9), 'order 7: 9.00')\n\n\n"
        "if __name__ == '__main__':\n    unittest.main()\n"
    ),
}
MIGRATED = {
    "shop/pricing.py": 'def label(name, price):\n    return f"{name} costs {price:.2f}"\n',
    "shop/stock.py": 'def report(item, count):\n    return f"{item}: {count} left"\n',
    "shop/orders.py": 'def receipt(order_id, total):\n    return f"order {order_id}: {total:.2f}"\n',
}


def _git(cwd: Path, *args: str) -> None:
    def failed(message: str) -> subprocess.CalledProcessError:
        return subprocess.CalledProcessError(1, ["git", *args], stderr=message)

    gitrun.run(cwd, "-c", "user.email=demo@keel.invalid", "-c", "user.name=keel demo", *args, fail=failed)


def make_repository(root: Path) -> Path:
    repo = root / "shop"
    for rel, text in SAMPLE.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "sample shop")
    return repo


def _toml(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value)


def write_mission(root: Path, repo: Path) -> Path:
    lines = [
        "[mission]",
        'name = "migrate %-formatting to f-strings"',
        'agent = "python -m keel.agents.scripted"',
        f"workspace = {json.dumps(str(repo))}",
        "max_parallel = 3",
        "",
    ]
    for index, (rel, text) in enumerate(MIGRATED.items()):
        uid = Path(rel).stem
        pace = 0.2 + 0.5 * index  # staggered, so the kill finds units at different points
        steps = [
            {"tool": "read_file", "args": {"path": rel}},
            {"sleep": pace},
            {"tool": "write_file", "args": {"path": rel, "content": text}},
            {"tool": "run", "args": {"cmd": f"python -m py_compile {rel}", "verify": True, "idempotent": True}},
            {"sleep": pace},
            {"evidence": {"kind": "note", "summary": f"{rel} migrated"}},
        ]
        lines += [
            "[[units]]",
            f'id = "{uid}"',
            f"title = {json.dumps('migrate ' + rel)}",
            f"params = {_toml({'steps': steps})}",
            "",
        ]
    verify = [{"tool": "run", "args": {"cmd": "python -m unittest -q test_shop", "verify": True, "idempotent": True}}]
    lines += [
        "[[units]]",
        'id = "verify"',
        'after = ["pricing", "stock", "orders"]',
        f"params = {_toml({'steps': verify})}",
        "",
    ]
    path = root / "mission.toml"
    path.write_text("\n".join(lines))
    return path


def _keel(*args: str) -> list[str]:
    return [sys.executable, "-m", "keel.server.cli", *args]


def run_demo(out: TextIO, store: Path | None = None) -> int:
    """The demo in a temporary folder, store included; with `store`, the mission is recorded there
    instead and the folder with the sample repository (the mission's workspace) is kept, so that
    `keel status`, `keel points` or `keel apply` can look at what the demo did afterwards."""
    if store is None:
        with tempfile.TemporaryDirectory(prefix="keel-demo-") as tmp:
            return _demo(out, Path(tmp), Path(tmp) / ".keel" / "store")
    root = Path(tempfile.mkdtemp(prefix="keel-demo-"))
    store = store.resolve()  # the host's workers run in sandboxes: a relative path would point elsewhere
    code = _demo(out, root, store)
    print(
        f"the mission stays in store {store} (keel status --store {store}); its sample repository "
        f"stays at {root / 'shop'}",
        file=out,
        flush=True,
    )
    return code


def _demo(out: TextIO, root: Path, store: Path) -> int:
    started = time.monotonic()
    repo = make_repository(root)
    mission = write_mission(root, repo)

    def say(text: str) -> None:
        print(text, file=out, flush=True)

    say(f"sample repository: {repo} (3 modules to migrate, 1 test)")
    host = subprocess.Popen(
        _keel("run", str(mission), "--json", "--store", str(store)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    mid, done_before = _watch_until_first_unit(host, say)
    host.send_signal(signal.SIGKILL)
    host.communicate(timeout=10)
    say(f"SIGKILL sent to the mission host (pid {host.pid}) after {len(done_before)} of 4 units finished")
    with Store.open(store, create=False) as s:
        state = s.read(lambda t: m.get_mission(t, mid)).state.value
        head = s.read(lambda t: m.head_checkpoint(t, mid))
    done_before = [u for u, mk in head.units.items() if mk.state.value == "succeeded"] if head else []
    say(f"the store says: mission {mid} is '{state}' with no host; resuming it")
    resumed = subprocess.run(
        _keel("resume", mid, "--json", "--store", str(store)), capture_output=True, text=True, timeout=120
    )
    events = [json.loads(line) for line in resumed.stdout.splitlines() if line.startswith("{")]
    return _report(say, store, repo, mid, done_before, events, resumed.returncode, started)


def _watch_until_first_unit(host: subprocess.Popen[str], say: Any) -> tuple[str, list[str]]:
    assert host.stdout is not None
    mid, done = "", []
    for line in host.stdout:
        event = json.loads(line)
        if event["event"] == "mission":
            mid = event["mission"]
            say(f"mission {mid} started: {event['units']} units, up to 3 in parallel")
        elif event["event"] == "unit_started":
            say(f"  unit {event['unit']} started")
        elif event["event"] == "unit_succeeded":
            done.append(event["unit"])
            say(f"  unit {event['unit']} succeeded")
            time.sleep(0.4)  # let the other units get midway through their steps
            break
    return mid, done


def _report(
    say: Any,
    store: Path,
    repo: Path,
    mid: str,
    done_before: list[str],
    events: list[dict[str, Any]],
    rc: int,
    started: float,
) -> int:
    rerun = [e["unit"] for e in events if e["event"] == "unit_started" and e["unit"] in done_before]
    exit_event = next((e for e in events if e["event"] == "host_exit"), {})
    with Store.open(store, create=False) as s:
        record = s.read(lambda t: m.get_mission(t, mid))
        evidence = [e for _, e in s.read(lambda t: list(m.evidence_after(t, mid)))]
    sandbox = Path(record.sandbox)
    verified = [e for e in evidence if e.kind == "verification"]
    clean = gitrun.run(repo, "status", "--porcelain").stdout == ""
    migrated = all((sandbox / rel).read_text() == text for rel, text in MIGRATED.items())
    say("")
    say(f"resumed host finished: mission {record.state.value} (exit {rc})")
    say(f"  units kept from before the kill : {len(done_before)} ({', '.join(done_before)}), re-executed: {len(rerun)}")
    say(f"  calls replayed from the journal : {exit_event.get('replayed', 0)} (no tool run twice)")
    say(
        f"  calls run after the resume      : {exit_event.get('executed', 0)} "
        f"(the rest of the work, including what was in flight at the kill)"
    )
    say(f"  effects reconciled with sandbox : {exit_event.get('reconciled', 0)}")
    say(
        f"  verifications recorded          : {sum(1 for e in verified if e.data.get('ok'))} passed, "
        f"{sum(1 for e in verified if not e.data.get('ok'))} failed"
    )
    say(f"  migrated files (branch keel/...): {'all 3 correct' if migrated else 'WRONG'} on keel/{mid}")
    say(f"  your working tree               : {'untouched' if clean else 'CHANGED'}")
    say(f"demo took {time.monotonic() - started:.1f} s")
    ok = rc == 0 and not rerun and migrated and clean
    return 0 if ok else 4
