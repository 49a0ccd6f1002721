"""The one mapping from keel's typed errors to JSON-RPC errors, and argument checks that name the problem.

keel errors become `-32100 - code` with `data = {"keelCode", "keelError"}`; bad arguments become
InvalidParams (-32602) with a message like "keel.pause expects a mission id string as argument 1, got
true": messages name values as JSON does (`true`, `null`, `"p3"`, `an object`, `an array`), never as Python
would, since the person reading them wrote JSON (or their editor did).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams

from keel.protocol.errors import KeelError

KEEL_ERROR_BASE = -32100


def rpc_error(exc: KeelError) -> JsonRpcException:
    return JsonRpcException(
        message=exc.message,
        code=KEEL_ERROR_BASE - int(exc.code),
        data={"keelCode": int(exc.code), "keelError": exc.code.name},
    )


def invalid(message: str) -> JsonRpcInvalidParams:
    return JsonRpcInvalidParams(message=message)


def arg_str(name: str, args: Sequence[Any], index: int, what: str, *, required: bool = True) -> str | None:
    """Positional command argument `index` (0-based) as a non-empty string, or InvalidParams."""
    if index >= len(args) or args[index] is None:
        if required:
            raise invalid(f"{name} expects {what} string as argument {index + 1}")
        return None
    value = args[index]
    if not isinstance(value, str) or not value.strip():
        raise invalid(f"{name} expects {what} string as argument {index + 1}, got {describe(value)}")
    return value


def arg_dict(name: str, args: Sequence[Any], index: int, what: str) -> dict[str, Any]:
    if index >= len(args) or args[index] is None:
        return {}
    value = args[index]
    if not isinstance(value, dict):
        raise invalid(f"{name} expects {what} object as argument {index + 1}, got {describe(value)}")
    return value


def no_more_args(name: str, args: Sequence[Any], count: int) -> None:
    if len(args) > count:
        raise invalid(f"{name} takes {count} argument{'s' if count != 1 else ''}, got {len(args)}")


def param_id(method: str, params: Any) -> str:
    """The `id` of a request's params, which pygls hands over as a namedtuple, a dict or a list."""
    value: Any = None
    if isinstance(params, dict):
        value = params.get("id")
    elif isinstance(params, list | tuple) and not hasattr(params, "_fields"):
        value = params[0] if params else None
    else:
        value = getattr(params, "id", None)
    if not isinstance(value, str) or not value.strip():
        raise invalid(f'{method} expects params {{"id": <mission id string>}}, got {_show_params(params)}')
    return value


def _show_params(params: Any) -> str:
    fields = params._asdict() if hasattr(params, "_asdict") else params
    if not isinstance(fields, dict):
        return describe(fields)
    return f'"id": {describe(fields["id"])}' if "id" in fields else 'an object without "id"'


def describe(value: Any) -> str:
    """A JSON value as a client would name it: `true`, `null`, `42`, `"p3"`, `an object`, `an array`."""
    if isinstance(value, dict) or hasattr(value, "_asdict"):
        return "an object"
    if isinstance(value, list | tuple):
        return "an array"
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return f"a {type(value).__name__}"
    return text if len(text) <= 60 else text[:56] + '…"'
