"""Helpers for the ACP tests: find the installed agents, make a workspace whose mission an outside agent
does against the scripted model server, run and kill real hosts, agents and both, read the outcome."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scripted import CALC, NEW_CALC, RUN_TESTS, TEST_CALC, ScriptedModel

from keel.agents.acp.presets import PRESETS, find

ROOT = Path(__file__).resolve().parents[2]
KEEL = str(Path(sys.executable).with_name("keel"))
KEY = "sk-acp-provider-Zq81mWv3"  # a made-up provider key, only ever sent to 127.0.0.1
KIND = {"claude": "anthropic", "gemini": "gemini", "codex": "openai-compatible"}
__all__ = ["CALC", "NEW_CALC", "RUN_TESTS", "TEST_CALC", "ScriptedModel"]


def agents_dir() -> str:
    return os.environ.get("KEEL_ACP_AGENTS") or str(ROOT / ".tools" / "acp-agents")


def require_agent(name: str) -> None:
    """Skip (with the reason) when the agent's npm package could not be installed here."""
    os.environ.setdefault("KEEL_ACP_AGENTS", agents_dir())
    if find(PRESETS[name]) is None:
        log = Path(agents_dir()) / f"npm-{PRESETS[name].package.split('/')[-1].split('@')[0]}.log"
        why = log.read_text()[-300:] if log.exists() else "run scripts/acp-agents.sh"
        pytest.skip(f"{PRESETS[name].title} is not installed in {agents_dir()}: {why}")


@dataclass
class Workspace:
    root: Path
    store: Path
    env: dict[str, str]

    def keel(self, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [KEEL, *args], cwd=self.root, env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def start(self, mission: str = "task.mission.toml", env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        """`keel run` of the mission; `env` adds to this run's environment only (fault points)."""
        return self.spawn("run", mission, env=env)

    def worker(self) -> subprocess.Popen[str]:
        """A `keel worker` of this workspace: it takes the units a `workers = true` mission offers."""
        return self.spawn("worker", "--units", "1")

    def spawn(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [KEEL, *args],
            cwd=self.root,
            env={**self.env, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def mission_id(self) -> str:
        rows = json.loads(self.keel("missions", "--json").stdout or "[]")
        assert rows, "no mission in the store"
        return str(rows[-1]["id"])

    def state(self, mission: str) -> str:
        return str(json.loads(self.keel("status", mission, "--json").stdout)["mission"]["state"])

    def sandbox(self, mission: str) -> Path:
        """The mission's sandbox: where finished units' files are merged."""
        return self.root / ".keel" / "sandboxes" / mission

    def unit_sandbox(self, mission: str, unit: str = "u1") -> Path:
        """Where a unit works while it runs."""
        return self.root / ".keel" / "sandboxes" / f"{mission}-units" / unit


def workspace(tmp: Path, agent: str, servers: list[ScriptedModel], permissions: str = "") -> Workspace:
    root = tmp / "ws"
    root.mkdir()
    (root / "calc.py").write_text(CALC)
    providers = "".join(
        f'[[providers]]\nname = "p{i}"\nkind = "{KIND[agent]}"\nmodel = "scripted-{i}"\n'
        'api_key_env = "KEEL_ACP_TEST_PASS"\n'
        f'endpoints = [{{ url = "{s.url}{"/v1" if agent == "codex" else ""}" }}]\n\n'
        for i, s in enumerate(servers)
    )
    network = "[network]\nbase_delay_s = 0.01\nmax_delay_s = 0.05\nmax_attempts = 2\nread_timeout_s = 60\n\n"
    (root / ".keel").mkdir()
    (root / ".keel" / "config.toml").write_text(network + providers)
    (root / "task.mission.toml").write_text(
        '[mission]\nname = "add-mul"\ngoal = "Add a mul function to calc.py with a unittest, and run the tests."\n'
        f'agent = {{ acp = "{agent}" }}\n{permissions}\n[[units]]\nid = "u1"\ntitle = "add mul"\ntimeout_s = 240\n'
    )
    env = dict(
        os.environ,
        KEEL_ACP_AGENTS=agents_dir(),
        KEEL_ACP_TEST_PASS=KEY,
        PYTHON_KEYRING_BACKEND="keyring.backends.null.Keyring",
    )
    return Workspace(root, root / ".keel" / "store", env)


def wait_for(what: str, probe: Callable[[], object], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def processes_in(root: Path, match: Callable[[list[bytes]], bool]) -> list[int]:
    """Processes working under the workspace `root` whose argv `match` accepts (the tests' strikes never
    touch another workspace's processes)."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            argv = cmdline.read_bytes().split(b"\0")
            if os.readlink(cmdline.parent / "cwd").startswith(str(root)) and match(argv):
                pids.append(int(cmdline.parent.name))
    return pids


def agent_pids(name: str, root: Path) -> list[int]:
    """Processes of the outside agent working in the workspace `root` (their command line names the
    preset's executable)."""
    binary = f"acp-agents/node_modules/.bin/{PRESETS[name].binary}".encode()
    return processes_in(root, lambda argv: any(binary in arg for arg in argv))


def kill_agent(name: str, root: Path) -> list[int]:
    """SIGKILL the outside agent: its process and every process below it (Claude Code's CLI runs under
    its adapter), all at once, as a crash of the agent would."""
    return kill_tree(agent_pids(name, root))


def kill_tree(pids: list[int]) -> list[int]:
    """SIGKILL these processes and every process below them, all at once; returns the pids struck."""
    tree: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        tree.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    victims, todo = [], list(pids)
    while todo:
        pid = todo.pop()
        victims.append(pid)
        todo.extend(tree.get(pid, []))
    for pid in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return victims


def kill_keel_process(module: str, root: Path) -> list[int]:
    """SIGKILL the keel process running `module` (the unit's worker, or the ACP bridge) in the workspace
    `root`, and only it."""

    def runs_module(argv: list[bytes]) -> bool:  # its own `-m MODULE`: a worker's argv also holds the agent's
        return b"-m" in argv and argv[argv.index(b"-m") + 1 :][:1] == [module.encode()]

    pids = processes_in(root, runs_module)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


def finish(proc: subprocess.Popen[str], timeout: float = 240) -> str:
    out, _ = proc.communicate(timeout=timeout)
    return out


def kill_host(proc: subprocess.Popen[str]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def settle(name: str, root: Path, timeout: float = 15) -> None:
    """Every process of the killed host goes (worker, bridge, agent)."""
    wait_for(f"the {name} agent's processes to end", lambda: not agent_pids(name, root), timeout)


class Side:
    """The test command's side log and HOLD file, outside the workspace: the command appends a line, then
    blocks while HOLD exists (a strike lands while it runs; no restore can hide a repeat)."""

    def __init__(self, tmp: Path) -> None:
        self.folder = tmp / "side"
        self.folder.mkdir()
        self.log = self.folder / "effects.log"
        self.hold = self.folder / "HOLD"
        self.inner = ""  # the detached process's command (detached())

    def command(self) -> str:
        return (
            f"echo ran >> {self.log}; while [ -e {self.hold} ]; do sleep 0.05; done; "
            "python3 -m unittest -q test_calc 2>&1 | tail -n 1"
        )

    def detached(self) -> str:
        """A test command whose effect a detached process makes (a double fork and setsid: out of the shell's
        process group and session) once HOLD is gone; the command waits for it, then runs the tests."""
        done = self.folder / "done"
        self.inner = f"while [ -e {self.hold} ]; do sleep 0.05; done; echo ran >> {self.log}; touch {done}"
        return (
            f"( setsid sh -c '{self.inner}' >/dev/null 2>&1 & ); while [ ! -e {done} ]; do sleep 0.05; done; "
            f"rm -f {done}; python3 -m unittest -q test_calc 2>&1 | tail -n 1"
        )

    def detached_running(self) -> bool:
        """Whether a detached process of `detached()` runs (its argv ends with its own text)."""
        inner = self.inner.encode()
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            with contextlib.suppress(OSError):
                if cmdline.read_bytes().split(b"\0")[-2:-1] == [inner]:
                    return True
        return False

    def lines(self) -> int:
        return len(self.log.read_text().splitlines()) if self.log.exists() else 0

    def wait_running(self) -> None:
        wait_for("the test command to run (its side log line written)", lambda: self.lines() >= 1)


WAITS_OR_ENDED = ("completed", "failed", "cancelled", "waiting_input")


def answer_truthfully(ws: Workspace, mission: str, side: Side) -> int:
    """Answer each question about an effect in doubt as things are: "skip" when it happened, else "rerun"."""
    asked = 0
    while True:
        wait_for("the mission to end or ask", lambda: ws.state(mission) in WAITS_OR_ENDED, timeout=200)
        record = json.loads(ws.keel("status", mission, "--json").stdout)["mission"]
        if record["state"] != "waiting_input":
            return asked
        question = record["question"]
        assert question["kind"] == "uncertain-effect", question
        sandbox = ws.unit_sandbox(mission)
        if "effects.log" in question["text"] or str(side.folder) in question["text"]:
            happened = side.lines() >= 1
        elif "test_calc.py" in question["text"]:
            happened = (sandbox / "test_calc.py").exists() and (sandbox / "test_calc.py").read_text() == TEST_CALC
        else:
            happened = (sandbox / "calc.py").read_text() == NEW_CALC
        side.hold.unlink(missing_ok=True)  # a struck command's leftover would make its effect now: too late
        answered = ws.keel("answer", mission, "skip" if happened else "rerun")
        assert answered.returncode == 0, answered.stdout + answered.stderr
        asked += 1
        assert asked <= 4, "asked again and again"
        seen = record.get("control_seen")
        wait_for(
            "the host to take the answer",
            lambda seen=seen: (
                json.loads(ws.keel("status", mission, "--json").stdout)["mission"].get("control_seen") != seen
            ),
        )
