"""Assembling and running the server: lifecycle handlers, the feature modules, stdio.

`build()` is the one place features are attached (their list is features/__init__.py); `serve()` runs the
server on stdin/stdout and logs to stderr or a file — never to stdout, which is the JSON-RPC pipe. Before anything
else it forks its host starter (hoststarter.py), which restarts hosts as forks.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from lsprotocol import types

from keel.server.hoststarter import HostStarter
from keel.server.lsp import enginecall
from keel.server.lsp.features import FEATURES
from keel.server.lsp.server import KeelServer

log = logging.getLogger(__name__)


def build(store: str | None = None) -> KeelServer:
    server = KeelServer(store)

    @server.feature(types.INITIALIZE)
    def initialize(ls: KeelServer, params: types.InitializeParams) -> None:
        ls.configure(params)
        log.info("keel serve: store %s, workspace %s", ls.store_path, ls.workspace_root)

    @server.feature(types.INITIALIZED)
    def initialized(ls: KeelServer, params: types.InitializedParams) -> None:
        ls.start_watching()
        for start in ls.on_ready:
            ls.spawn(start(), start.__qualname__)

    @server.feature(types.SHUTDOWN)
    def shutdown(ls: KeelServer, params: Any = None) -> None:
        ls.close()

    for feature in FEATURES:
        feature.register(server)
    return server


def serve(store: str | None = None, log_file: str | None = None, verbose: bool = False) -> int:
    starter = HostStarter.launch()  # first: while this process has one thread and no store open
    handler: logging.Handler = logging.FileHandler(log_file) if log_file else logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    logging.getLogger("pygls").setLevel(logging.DEBUG if verbose else logging.WARNING)
    server = build(store)
    if starter is not None:
        server.start_host = starter.start
        enginecall.forker = starter.run
    try:
        server.start_io(sys.stdin.buffer, sys.stdout.buffer)
    finally:
        server.close()
        if starter is not None:
            starter.close()
    return 0
