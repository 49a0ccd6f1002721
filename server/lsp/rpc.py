"""pygls' JSON-RPC protocol as keel serve needs it: integer ids for the requests it sends, an unknown
command named as such, and client errors logged as what they are.

Requests the server sends to the editor (`window/showMessageRequest`, `window/workDoneProgress/create`) are
numbered 1, 2, 3…, and their futures kept apart from the requests the editor sends.

pygls numbers them with UUID strings, which JSON-RPC allows but Vim 9's LSP channel does not: it cannot
answer a string id (`E475: Invalid value for argument id`, vim/vim#14091), so a Vim user would get no
progress and no questions. Editors number their own requests 1, 2, 3… too, and pygls keeps the futures of
the requests it serves and of those it sends in one dict keyed by id; so the ones keel sends are kept in a
dict of their own, where an editor's request 3 and keel's request 3 cannot overwrite each other.

A request answered with an error the client caused (bad params, an unknown mission: errors.py) is logged
at INFO, one line, no traceback; pygls would log each at ERROR with its traceback. Unexpected errors are
logged with their traceback where they happen (server.handler). Depends on pygls and lsprotocol only.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Callable, Generator
from concurrent.futures import Future
from typing import Any

from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInternalError, JsonRpcInvalidParams
from pygls.protocol import LanguageServerProtocol
from pygls.protocol.json_rpc import JsonRPCRequestMessage, JsonRPCResponseMessage
from pygls.protocol.language_server import lsp_method

log = logging.getLogger(__name__)


class KeelProtocol(LanguageServerProtocol):
    """pygls' protocol, with integer ids for the requests keel sends."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._next_id = itertools.count(1)
        self._sent: dict[int, tuple[Future[Any], Any]] = {}  # id → (future, result type)

    def send_request(
        self,
        method: str,
        params: Any | None = None,
        callback: Callable[[Any], None] | None = None,
        msg_id: Any = None,
    ) -> Future[Any]:
        if msg_id is not None:  # a caller that picks its own id keeps pygls' bookkeeping
            return super().send_request(method, params, callback, msg_id)
        number = next(self._next_id)
        future: Future[Any] = Future()
        if callback is not None:
            future.add_done_callback(lambda done: callback(done.result()))
        self._sent[number] = (future, self.get_result_type(method))
        request_type = self.get_message_type(method) or JsonRPCRequestMessage
        log.debug("sending request %d: %s", number, method)
        self._send_data(request_type(id=number, method=method, params=params, jsonrpc=self.VERSION))
        return future

    def structure_message(self, data: dict[str, Any]) -> Any:
        number = _ours(data.get("id")) if "method" not in data and "error" not in data else None
        if number is not None and number in self._sent:
            result_type = self._sent[number][1] or JsonRPCResponseMessage
            return self._converter.structure(data, result_type)
        return super().structure_message(data)

    def _handle_response(self, msg_id: Any, result: Any | None = None, error: Any | None = None) -> None:
        number = _ours(msg_id)
        entry = self._sent.pop(number, None) if number is not None else None
        if entry is None:
            super()._handle_response(msg_id, result, error)
            return
        future = entry[0]
        if future.done():
            return
        if error is not None:
            log.debug("request %d answered with an error: %s", number, error)
            future.set_exception(JsonRpcException.from_error(error))
        else:
            future.set_result(result)

    @lsp_method(types.WORKSPACE_EXECUTE_COMMAND)
    def lsp_workspace__execute_command(self, params: types.ExecuteCommandParams) -> Generator[Any, Any, Any]:
        if params.command not in self.fm.commands:
            known = ", ".join(sorted(self.fm.commands))
            raise JsonRpcInvalidParams(message=f"unknown command {json.dumps(params.command)}; keel serve has {known}")
        return (yield from super().lsp_workspace__execute_command(params))

    def _send_handler_result(self, future: Future[Any], *, msg_id: Any) -> None:
        error = None if future.cancelled() else future.exception()
        if not isinstance(error, JsonRpcException):
            super()._send_handler_result(future, msg_id=msg_id)
            return
        self._request_futures.pop(msg_id, None)
        level = logging.WARNING if isinstance(error, JsonRpcInternalError) else logging.INFO
        log.log(level, "request %s answered with error %d: %s", msg_id, error.code, error.message)
        self._send_response(msg_id, error=error.to_response_error())


def _ours(msg_id: Any) -> int | None:
    """An id keel could have minted: an int, not a bool (JSON `true` would equal 1)."""
    return msg_id if type(msg_id) is int else None
