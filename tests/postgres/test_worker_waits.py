"""A `keel worker` started while its database cannot be reached (a server restarting, full, or behind a cut
link) waits for it however long it takes, as a mission host does, and starts taking units once it is there:
it never exits because its first contact failed."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.pgserver import PgServer
from tests.postgres.pgproxy import relay


def _forward(listener: socket.socket, port: int, stop: threading.Event) -> None:
    """Relay every connection made to `listener` to the server on `port` (the server 'comes back')."""
    listener.settimeout(0.2)
    while not stop.is_set():
        try:
            client, _ = listener.accept()
        except TimeoutError:
            continue
        server = socket.create_connection(("127.0.0.1", port))
        threading.Thread(target=relay, args=(client, server), daemon=True).start()
        threading.Thread(target=relay, args=(server, client), daemon=True).start()


def _until(proc: subprocess.Popen[str], words: str) -> str:
    assert proc.stdout is not None
    said = ""
    deadline = time.monotonic() + 60
    while words not in said and time.monotonic() < deadline and (line := proc.stdout.readline()):
        said += line
    assert words in said, said
    return said


def test_a_worker_waits_for_a_database_it_cannot_reach_at_first(tmp_path: Path, pg_server: PgServer) -> None:
    probe = socket.create_server(("127.0.0.1", 0))
    port = int(probe.getsockname()[1])
    probe.close()  # nothing listens there yet: every connection is refused
    url = pg_server.store_url(pg_server.new_schema()).replace(f":{pg_server.port}/", f":{port}/")
    env = {**os.environ, "KEEL_STORE_RECONNECT_S": "1"}  # a short-lived verb would give up after 1 s
    worker = subprocess.Popen(
        [sys.executable, "-m", "keel.server.cli", "worker", "--store", url, "--interval", "0.2"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    stop = threading.Event()
    try:
        said = _until(worker, "waiting for it")  # it says so once it has waited WAIT_REPORT_S, past its patience
        assert worker.poll() is None and "unreachable" in said, said
        listener = socket.create_server(("127.0.0.1", port))
        threading.Thread(target=_forward, args=(listener, pg_server.port, stop), daemon=True).start()
        _until(worker, "takes units offered in")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
    finally:
        stop.set()
        if worker.poll() is None:
            worker.kill()
        worker.communicate(timeout=10)
