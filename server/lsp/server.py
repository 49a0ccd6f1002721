"""The keel language server: one store, one hub, the feature modules, and the rules every handler follows.

`KeelServer` owns the store (opened once per process; LMDB allows no second copy), the store watcher and
the mission hub. Handlers go through `handler()`: blocking work runs in a thread, keel errors become
JSON-RPC errors (errors.py), anything unexpected is logged with its traceback, shown once as a short
message and answered as InternalError; the server never dies on bad input. Background coroutines go
through `spawn()`, which holds them and logs their errors.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sys
import threading
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, BinaryIO, ParamSpec, TypeVar

import anyio.to_thread
from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInternalError
from pygls.io_ import StdoutWriter
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path

from keel.protocol import __version__
from keel.protocol.errors import KeelError
from keel.server.engine import control
from keel.server.lsp import errors, wire
from keel.server.lsp.rpc import KeelProtocol
from keel.server.lsp.watch import MissionHub, StoreWatcher
from keel.storage import Store
from keel.storage.location import prepare_keel_dir, resolve_store, store_exists

log = logging.getLogger(__name__)
P = ParamSpec("P")
T = TypeVar("T")


class KeelServer(LanguageServer):
    def __init__(self, store_arg: str | None = None) -> None:
        super().__init__("keel", __version__, protocol_cls=KeelProtocol)
        self.store_arg = store_arg
        self.store_path = resolve_store(store_arg)
        self.workspace_root = Path.cwd()
        self.options: dict[str, Any] = {}
        self.hub = MissionHub()
        self.watcher: StoreWatcher | None = None
        self._store: Store | None = None
        self._store_lock = threading.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()
        self.on_ready: list[Callable[[], Coroutine[Any, Any, Any]]] = []  # started after `initialized`
        self.start_host: control.Starter = control.spawn_host  # `serve` sets its host starter's (hoststarter.py)

    def _start_io_async(self, stdin: BinaryIO | None = None, stdout: BinaryIO | None = None) -> None:
        """pygls' stdio server with keel's reading loop (wire.py): bad input never crashes or stalls it."""
        self._stop_event = threading.Event()
        self.protocol.set_writer(StdoutWriter(stdout or sys.stdout.buffer))
        try:
            asyncio.run(wire.serve(self._stop_event, stdin or sys.stdin.buffer, self.protocol, self.thread_pool))
        except BrokenPipeError:
            log.error("the connection to the client is lost; shutting down")
        except (KeyboardInterrupt, SystemExit):
            pass
        finally:
            self.shutdown()  # type: ignore[no-untyped-call]

    # -- the store --------------------------------------------------------------------------------
    def configure(self, params: types.InitializeParams) -> None:
        """Pick the store (docs/lsp.md: --store, initializationOptions.store, $KEEL_STORE, workspace)."""
        opts = params.initialization_options
        self.options = dict(opts) if isinstance(opts, dict) else {}
        root = _workspace_root(params)
        if root is not None:
            self.workspace_root = root
        if self.store_arg:
            return
        option = self.options.get("store")
        self.store_path = resolve_store(option if isinstance(option, str) and option else None, self.workspace_root)

    def store(self, *, create: bool = False) -> Store | None:
        """The open store; None while it does not exist (unless `create`)."""
        if self._store is not None:
            return self._store
        with self._store_lock:
            if self._store is None and (create or store_exists(self.store_path)):
                prepare_keel_dir(self.store_path)
                self._store = Store.open(self.store_path)
            return self._store

    def require_store(self) -> Store:
        store = self.store(create=True)
        assert store is not None
        return store

    def start_watching(self) -> None:
        poll_ms = self.options.get("pollMs", 50)
        poll_s = max(0.005, float(poll_ms) / 1000) if isinstance(poll_ms, int | float) else 0.05
        self.watcher = StoreWatcher(
            self.store_path, asyncio.get_running_loop(), self.hub, poll_s=poll_s, opener=self.store
        )
        self.watcher.start()

    def changed(self) -> None:
        if self.watcher is not None:
            self.watcher.poke()

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()
        with self._store_lock:
            if self._store is not None:
                self._store.close()
                self._store = None

    # -- running work -------------------------------------------------------------------------------
    async def blocking(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))

    def spawn(self, coro: Coroutine[Any, Any, Any], what: str) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(functools.partial(self._task_done, what))

    def _task_done(self, what: str, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.fail(what, task.exception())

    # -- telling the person ---------------------------------------------------------------------------
    def show(self, message: str, kind: types.MessageType = types.MessageType.Info) -> None:
        self.window_show_message(types.ShowMessageParams(type=kind, message=message))

    def log_line(self, message: str, kind: types.MessageType = types.MessageType.Log) -> None:
        self.window_log_message(types.LogMessageParams(type=kind, message=message))

    def fail(self, what: str, exc: BaseException | None) -> None:
        """An unexpected error: the details to the log, one short line to the person."""
        log.error("%s failed", what, exc_info=exc)
        self.log_line(f"{what} failed: {exc!r}", types.MessageType.Error)
        self.show(f"keel: {what} failed: {_short(exc)}", types.MessageType.Error)

    def report_server_error(self, error: Exception, source: Any) -> None:
        client_error = isinstance(error, JsonRpcException) and not isinstance(error, JsonRpcInternalError)
        level = logging.INFO if client_error else logging.ERROR  # e.g. an unknown method: the client's
        log.log(level, "pygls reported an error (%s): %s", getattr(source, "__name__", source), error)


def handler(server: KeelServer, what: str) -> Callable[[Callable[..., Awaitable[T]]], Callable[..., Awaitable[T]]]:
    """Wrap an async handler: keel errors → JSON-RPC errors, anything unexpected → logged + shown once."""

    def wrap(fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
        @functools.wraps(fn)
        async def run(*args: Any) -> T:
            try:
                return await fn(*args)
            except JsonRpcException:
                raise
            except KeelError as exc:
                log.info("%s: %s", what, exc.message)
                raise errors.rpc_error(exc) from None
            except Exception as exc:
                server.fail(what, exc)
                raise JsonRpcInternalError(message=f"{what} failed: {_short(exc)}") from None

        return run

    return wrap


def _short(exc: BaseException | None) -> str:
    text = (str(exc) or type(exc).__name__).splitlines()[0] if exc is not None else "unknown error"
    return text if len(text) <= 160 else text[:157] + "..."


def _workspace_root(params: types.InitializeParams) -> Path | None:
    if params.workspace_folders:
        return Path(to_fs_path(params.workspace_folders[0].uri) or ".")
    if params.root_uri:
        return Path(to_fs_path(params.root_uri) or ".")
    if params.root_path:
        return Path(params.root_path)
    return None
