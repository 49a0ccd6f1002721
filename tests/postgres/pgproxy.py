"""A real TCP proxy in front of PostgreSQL that cuts a connection around a COMMIT, for the tests.

It reads the client's side of the wire protocol (untyped SSL/GSS requests and the startup message,
then typed messages: one type byte, an int32 length) and relays everything else byte for byte. Armed
with `cut("after")`, it forwards the next query that ends in `COMMIT` and then closes both sides before the
server's answer reaches the client: the server commits, the client never hears. With `cut("before")` it closes
without forwarding: the server never sees the COMMIT and aborts. `strikes` counts the cuts made.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time


class PgProxy:
    def __init__(self, server_port: int) -> None:
        self.server_port = server_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.strikes = 0
        self._armed = ""
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self, when: str) -> None:
        assert when in ("before", "after")
        with self._lock:
            self._armed = when

    def close(self) -> None:
        self._closed = True
        self.listener.close()

    def _take(self) -> str:
        with self._lock:
            when, self._armed = self._armed, ""
            return when

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.server_port))
            threading.Thread(target=relay, args=(server, client), daemon=True).start()
            threading.Thread(target=self._client_side, args=(client, server), daemon=True).start()

    def _client_side(self, client: socket.socket, server: socket.socket) -> None:
        try:
            while True:  # untyped: SSLRequest / GSSENCRequest (answered by one byte), then StartupMessage
                head = _exactly(client, 8)
                length, code = struct.unpack("!ii", head)
                server.sendall(head + _exactly(client, length - 8))
                if code not in (80877103, 80877104):
                    break
            while True:
                kind = _exactly(client, 1)
                (length,) = struct.unpack("!i", _exactly(client, 4))
                body = _exactly(client, length - 4)
                message = kind + struct.pack("!i", length) + body
                if kind == b"Q" and _ends_in_commit(body):
                    when = self._take()
                    if when:
                        self.strikes += 1
                        client.shutdown(socket.SHUT_RDWR)  # the client hears nothing more, ever
                        if when == "after":
                            server.sendall(message)
                            time.sleep(0.3)  # the server commits; its answer goes nowhere
                        server.shutdown(socket.SHUT_RDWR)
                        return
                server.sendall(message)
        except (OSError, ConnectionError):
            pass
        finally:
            for sock in (client, server):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


def _ends_in_commit(query: bytes) -> bool:
    """A simple query whose last statement is COMMIT (keel sends its NOTIFY with it: `NOTIFY …; COMMIT`)."""
    return query.rstrip(b"\0").strip().upper().rsplit(b";", 1)[-1].strip() == b"COMMIT"


def _exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def relay(src: socket.socket, dst: socket.socket) -> None:
    """Copy what `src` sends to `dst` until either side ends; then end both."""
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
