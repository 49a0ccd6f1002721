"""Machines for the tests: network namespaces with a link to the PostgreSQL server, and their own name.

A `Machine` is a network namespace (`ip netns`) joined to this one by a veth pair. The server listens on
127.0.0.1 only; a forwarder on this side of the pair (its address, a free port) relays each connection to
it, with TCP keepalives on the machine's side, so a machine that vanishes is noticed as it would be across
a real network. Every process a machine starts runs in its namespace and in a UTS namespace of its own
named after the machine (`unshare --uts`), so keel sees another node name there, and in a mount
namespace where the other machines' folders are empty (`hide`): what keel does not carry through the
store is not there. `cut()` takes the link
down (the machine's packets go nowhere, its connections hang), `mend()` brings it back, `kill()` SIGKILLs
every process in the namespace and removes the link: the machine is gone. Needs root, `ip` and `unshare`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import uuid
from pathlib import Path

from engine_helpers import read, record, wait_for

from keel.storage import missions as m
from keel.storage.location import URL_FILE
from tests.postgres.pgproxy import relay

NET = 77  # 10.77.<n>.0/24 per machine, n the first no interface of this host has (other runs', leftovers')
LOCK = Path(tempfile.gettempdir()) / "keel-machines.lock"  # held while a machine picks its subnet and takes it


def can_make_machines() -> str:
    """Why machines cannot be made here ("" when they can)."""
    if os.getuid() != 0:
        return "network namespaces need root"
    missing = [tool for tool in ("ip", "unshare", "hostname") if shutil.which(tool) is None]
    return f"missing {', '.join(missing)} (scripts/setup.sh --system installs iproute2)" if missing else ""


def _ip(*args: str, netns: str = "") -> None:
    command = ["ip", *(("netns", "exec", netns, "ip") if netns else ()), *args]
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {proc.stderr.strip()}")


def _free_subnet() -> int:
    """The first n whose 10.NET.n.0/24 no interface of this host has an address in."""
    taken = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True, check=True).stdout
    for n in range(1, 255):
        if f" 10.{NET}.{n}." not in taken:
            return n
    raise RuntimeError(f"no free subnet left in 10.{NET}.0.0/16")


class Machine:
    def __init__(self, name: str, server_port: int) -> None:
        tag = uuid.uuid4().hex[:5]
        self.name = name
        self.netns = f"keel-{name}-{tag}"
        with LOCK.open("a") as lock:  # two machines (of this run or another) never share a subnet
            fcntl.flock(lock, fcntl.LOCK_EX)
            n = _free_subnet()
            self.outer, inner = f"kv{n}o{tag}", f"kv{n}i{tag}"
            self.address = f"10.{NET}.{n}.1"  # this side: where the machine reaches the server
            inside = f"10.{NET}.{n}.2"
            _ip("netns", "add", self.netns)
            _ip("link", "add", self.outer, "type", "veth", "peer", "name", inner)
            _ip("link", "set", inner, "netns", self.netns)
            _ip("addr", "add", f"{self.address}/24", "dev", self.outer)
        _ip("link", "set", self.outer, "up")
        _ip("addr", "add", f"{inside}/24", "dev", inner, netns=self.netns)
        _ip("link", "set", inner, "up", netns=self.netns)
        _ip("link", "set", "lo", "up", netns=self.netns)
        self._server_port = server_port
        self.hide: list[Path] = []  # folders of other machines, not on this one's disk
        self._listener = socket.create_server((self.address, 0))
        self.port = int(self._listener.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, schema: str) -> str:
        return f"postgresql://postgres@{self.address}:{self.port}/postgres?options=-csearch_path%3D{schema}"

    def command(self, *args: str) -> list[str]:
        """A command line that runs `args` on this machine: its network, its node name, and its own disk
        (`hide`: other machines' folders, each covered by an empty tmpfs in a mount namespace of its own)."""
        hide = "".join(f" && mount -t tmpfs keel-elsewhere '{path}'" for path in self.hide)
        return [
            "ip", "netns", "exec", self.netns,
            "unshare", "--uts", "--mount", "sh", "-c", f'hostname "$0"{hide} && exec "$@"', self.name, *args,
        ]  # fmt: skip

    def keel(self, *args: str, env: dict[str, str] | None = None, **kwargs: object) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.command(sys.executable, "-m", "keel.server.cli", *args),
            text=True,
            env={**os.environ, **(env or {})},
            **kwargs,  # type: ignore[call-overload]
        )

    def pids(self) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", self.netns], capture_output=True, text=True).stdout
        return [int(pid) for pid in out.split()]

    def cut(self) -> None:
        _ip("link", "set", self.outer, "down")

    def mend(self) -> None:
        _ip("link", "set", self.outer, "up")

    def kill(self) -> list[int]:
        """SIGKILL everything running on the machine (again until nothing is left) and remove its link."""
        killed: list[int] = []
        for _ in range(20):
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
            killed += pids
        with contextlib.suppress(RuntimeError):
            _ip("link", "del", self.outer)
        return sorted(set(killed))

    def remove(self) -> None:
        self.kill()
        self._listener.close()
        with contextlib.suppress(RuntimeError):
            _ip("netns", "del", self.netns)

    # -- the forwarder ----------------------------------------------------------------------------
    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            client.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 5)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 2)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
            try:
                server = socket.create_connection(("127.0.0.1", self._server_port))
            except OSError:
                client.close()
                continue
            threading.Thread(target=relay, args=(client, server), daemon=True).start()
            threading.Thread(target=relay, args=(server, client), daemon=True).start()


def remove_all(machines: list[Machine], procs: list[subprocess.Popen[str]]) -> None:
    """Remove the machines (everything running on them), then end and reap the processes started here."""
    for machine in machines:
        machine.remove()
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


# -- what both machines' missions need ------------------------------------------------------------------
def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def git_workspace(ws: Path) -> None:
    """A workspace with one commit (machine B gets a clone of it)."""
    ws.mkdir(parents=True)
    (ws / "README.md").write_text("two machines\n")
    git(ws, "init", "-q", "-b", "main")
    git(ws, "add", "-A")
    git(ws, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "init")


def store_folder(ws: Path, url: str) -> Path:
    """A workspace's store folder naming the shared store by `url`."""
    folder = ws / ".keel" / "shared"
    folder.mkdir(parents=True)
    (folder / URL_FILE).write_text(url + "\n")
    return folder


def markers(side: Path) -> list[str]:
    """The effects made so far: the side log's lines."""
    return side.read_text().split() if side.exists() else []


def answer_from_side_log(machine: Machine, its_store: Path, store: Path, mid: str, side: Path) -> None:
    """An effect whose outcome the strike left unknown: answered from the side log, as a person would."""
    question = record(store, mid).question
    assert question is not None and question.kind == "uncertain-effect", f"unexpected question: {question}"
    entry = read(store, lambda t: m.journal_get(t, mid, question.lane, question.seq))
    cmd = str(entry.result.get("cmd", ""))
    marker = cmd.rsplit("echo ", 1)[1].split(" ")[0]
    choice = "skip" if marker in markers(side) else "rerun"
    answered = machine.keel(
        "answer", mid, choice, "--store", str(its_store), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = answered.communicate(timeout=60)
    assert answered.returncode == 0, f"keel answer: {out}{err}"
    wait_for(lambda: record(store, mid).question != question, timeout=180)  # a host on B took the answer up
