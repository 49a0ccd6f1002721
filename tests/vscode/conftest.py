"""Real VS Code (code-server 4.139.1) in headless Debian Chromium, for the keel extension's tests.

Session fixtures install the tools (scripts/editor-tools.sh, cached in .tools/) and package the VSIX
(`npm run package`: tsc, esbuild, vsce). `code_server(...)` starts an isolated instance on a free
loopback port — own user-data, extensions and XDG folders, no gallery, no telemetry, no update check —
under its own session, and stops the whole process group afterwards. `drive(...)` runs drive.mjs (or
another driver, items.mjs) with Node 24 and returns its JSON. Mission hosts are detached on purpose; every
test kills the ones it made.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "vscode"
BUILD_LOCK = ROOT / "test-artifacts" / "vscode-build.lock"  # held while installing or packaging; names its run
USER_SETTINGS = {
    "workbench.startupEditor": "none",
    "workbench.tips.enabled": False,
    "workbench.enableExperiments": False,
    "security.workspace.trust.enabled": False,
    "extensions.autoCheckUpdates": False,
    "extensions.autoUpdate": False,
    "telemetry.telemetryLevel": "off",
    "update.mode": "none",
    "window.restoreWindows": "none",
    "chat.disableAIFeatures": True,
    "workbench.secondarySideBar.defaultVisibility": "hidden",
}


@pytest.fixture(scope="session")
def tools() -> dict[str, str]:
    """NODE_BIN, CODE_SERVER, CHROMIUM: installed (or found in the cache) by scripts/editor-tools.sh, one
    worker at a time (BUILD_LOCK)."""
    BUILD_LOCK.parent.mkdir(exist_ok=True)
    with BUILD_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        script = str(ROOT / "scripts" / "editor-tools.sh")
        done = subprocess.run(["bash", script], capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        pytest.fail(f"scripts/editor-tools.sh failed ({done.returncode}):\n{done.stderr[-3000:]}")
    found = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    return {**found, "PATH": f"{found['NODE_BIN']}{os.pathsep}{os.environ.get('PATH', '')}"}


@pytest.fixture(scope="session")
def vsix(tools: dict[str, str], request: pytest.FixtureRequest) -> Path:
    """The packaged extension, built the way a release is: typecheck, esbuild bundle, vsce package. Built
    once per test run, into the checkout: the VS Code tests run on two workers (tests/conftest.py), and the
    first to get here builds while the other waits on BUILD_LOCK, then finds the run's id in it and uses
    the same build (a build under a test that runs the extension from the checkout would pull it away)."""
    run = getattr(request.config, "workerinput", {}).get("testrunuid", "")  # one id per run, shared by its workers
    with BUILD_LOCK.open("a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        lock.seek(0)
        if not run or lock.read() != run:
            _package(tools)
            lock.truncate(0)
            lock.write(run)
    return ROOT / "keel.vsix"


def _package(tools: dict[str, str]) -> None:
    done = subprocess.run(
        ["npm", "run", "package"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PATH": tools["PATH"]},
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"npm run package failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class CodeServer:
    """One isolated code-server instance (a process group of its own)."""

    def __init__(self, tools: dict[str, str], home: Path) -> None:
        self.tools = tools
        self.home = home
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.extensions = home / "extensions"
        self.proc: subprocess.Popen[bytes] | None = None
        user = home / "user-data" / "User"
        user.mkdir(parents=True)
        (user / "settings.json").write_text(json.dumps(USER_SETTINGS))
        (home / "config.yaml").write_text("auth: none\ncert: false\n")
        self.env = {
            **os.environ,
            "PATH": tools["PATH"],
            "EXTENSIONS_GALLERY": "{}",
            "XDG_CONFIG_HOME": str(home / "xdg-config"),
            "XDG_DATA_HOME": str(home / "xdg-data"),
            "HOME": str(home),
        }

    def args(self) -> list[str]:
        return [
            self.tools["CODE_SERVER"],
            "--config",
            str(self.home / "config.yaml"),
            "--user-data-dir",
            str(self.home / "user-data"),
            "--extensions-dir",
            str(self.extensions),
        ]

    def install(self, vsix: Path) -> None:
        done = subprocess.run(
            [*self.args(), "--install-extension", str(vsix)],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, f"--install-extension failed: {done.stdout}\n{done.stderr}"

    def start(self, *extra: str) -> None:
        log = (self.home / "code-server.log").open("wb")
        self.proc = subprocess.Popen(
            [
                *self.args(),
                "--bind-addr",
                f"127.0.0.1:{self.port}",
                "--disable-telemetry",
                "--disable-update-check",
                "--disable-workspace-trust",
                "--disable-getting-started-override",
                *extra,
            ],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"code-server did not come up: {self.log_tail()}")
            time.sleep(0.2)

    def log_tail(self) -> str:
        path = self.home / "code-server.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def stop(self) -> None:
        """TERM the whole group, then KILL it: code-server's children linger ~10 s after it exits."""
        if self.proc is None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5)


@pytest.fixture
def code_server(tools: dict[str, str], tmp_path: Path) -> Iterator[Callable[[], CodeServer]]:
    made: list[CodeServer] = []

    def make() -> CodeServer:
        server = CodeServer(tools, tmp_path / f"code-server-{len(made)}")
        made.append(server)
        return server

    yield make
    for server in made:
        server.stop()


@pytest.fixture
def drive(tools: dict[str, str]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def run(config: dict[str, Any], timeout: float = 180, script: str = "drive.mjs") -> dict[str, Any]:
        done = subprocess.run(
            ["node", str(Path(__file__).with_name(script)), json.dumps({"chromium": tools["CHROMIUM"], **config})],
            cwd=ROOT,
            env={**os.environ, "PATH": tools["PATH"]},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        lines = done.stdout.strip().splitlines()
        assert lines, f"drive.mjs printed nothing (exit {done.returncode}): {done.stderr[-3000:]}"
        return dict(json.loads(lines[-1]))

    return run


def workspace(root: Path, python: str = sys.executable) -> Path:
    """A workspace folder whose settings point keel at this test run's interpreter."""
    root.mkdir(parents=True, exist_ok=True)
    (root / ".vscode").mkdir(exist_ok=True)
    (root / ".vscode" / "settings.json").write_text(json.dumps({"keel.python": python}))
    return root


def mission_file(folder: Path, name: str, units: list[tuple[str, str, list[str], str]]) -> Path:
    """A mission file for the scripted agent; units are (id, title, after, TOML steps array)."""
    lines = [
        "[mission]",
        f"name = {json.dumps(name)}",
        f"agent = {json.dumps(sys.executable + ' -m keel.agents.scripted')}",
        "",
    ]
    for uid, title, after, steps in units:
        lines += [
            "[[units]]",
            f"id = {json.dumps(uid)}",
            f"title = {json.dumps(title)}",
            f"after = {json.dumps(after)}",
            f"params = {{ steps = {steps} }}",
            "",
        ]
    path = folder / f"{name}.mission.toml"
    path.write_text("\n".join(lines))
    return path


def keel(*args: str, cwd: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "keel.server.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, f"keel {' '.join(args)} failed ({done.returncode}): {done.stderr}"
    return done.stdout.strip()
