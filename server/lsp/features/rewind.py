"""Rewinding and moving missions from the editor: `keel.fork`, `keel.apply`, `keel.export`, `keel.import`
commands, and the `keel/pointChanges` and `keel/pointFile` requests that feed a diff view.

Commands that write (fork, apply, export, import) run the CLI verb in a child process (enginecall.cli_json):
they open the store by path and run git, which must not happen on the server's loop nor in its process.
The two requests only read: a restore point's file snapshot from the server's open store, or the
sandbox's files as they are now (point "sandbox"). Payloads are built in convert.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from keel.server.engine.restore import SANDBOX, point_files
from keel.server.lsp import convert, enginecall
from keel.server.lsp.errors import arg_dict, arg_str, describe, invalid, no_more_args
from keel.server.lsp.features.control import MISSION_ID, summary_after
from keel.server.lsp.server import KeelServer, handler
from keel.server.lsp.snapshot import resolve

FORK, APPLY, EXPORT, IMPORT = "keel.fork", "keel.apply", "keel.export", "keel.import"
POINT_CHANGES, POINT_FILE = "keel/pointChanges", "keel/pointFile"
POINT = "a restore point id (like p3)"


def register(server: KeelServer) -> None:
    @server.command(FORK)
    @handler(server, FORK)
    async def fork(ls: KeelServer, *args: Any) -> Any:
        text, point = arg_str(FORK, args, 0, MISSION_ID), arg_str(FORK, args, 1, POINT)
        options = arg_dict(FORK, args, 2, 'an options ({"name": string})')
        no_more_args(FORK, args, 3)
        assert text is not None and point is not None
        name = options.get("name") or ""
        if not isinstance(name, str):
            raise invalid(f"{FORK}: name must be a string")
        mid = await ls.blocking(resolve, ls.require_store(), text)
        named = ("--name", name) if name else ()
        out = await ls.blocking(enginecall.cli_json, ls.store_path, "fork", mid, point, *named)
        return await summary_after(ls, out["mission"])

    @server.command(APPLY)
    @handler(server, APPLY)
    async def apply(ls: KeelServer, *args: Any) -> Any:
        text = arg_str(APPLY, args, 0, MISSION_ID)
        options = arg_dict(APPLY, args, 1, 'an options ({"branch": string})')
        no_more_args(APPLY, args, 2)
        branch = options.get("branch") or ""
        if not isinstance(branch, str):
            raise invalid(f'{APPLY} expects "branch" to be a string in argument 2, got {describe(branch)}')
        assert text is not None
        mid = await ls.blocking(resolve, ls.require_store(), text)
        extra = ["--branch", branch] if branch else []
        return await ls.blocking(enginecall.cli_json, ls.store_path, "apply", mid, *extra)

    @server.command(EXPORT)
    @handler(server, EXPORT)
    async def export(ls: KeelServer, *args: Any) -> Any:
        text, file = arg_str(EXPORT, args, 0, MISSION_ID), arg_str(EXPORT, args, 1, "a bundle file path")
        no_more_args(EXPORT, args, 2)
        assert text is not None and file is not None
        mid = await ls.blocking(resolve, ls.require_store(), text)
        return await ls.blocking(enginecall.cli_json, ls.store_path, "export", mid, "-o", str(_absolute(ls, file)))

    @server.command(IMPORT)
    @handler(server, IMPORT)
    async def import_(ls: KeelServer, *args: Any) -> Any:
        file = arg_str(IMPORT, args, 0, "a bundle file path")
        options = arg_dict(IMPORT, args, 1, 'an options ({"workspace": string, "allowUnsigned": boolean})')
        no_more_args(IMPORT, args, 2)
        assert file is not None
        workspace, unsigned = options.get("workspace") or str(ls.workspace_root), options.get("allowUnsigned", False)
        if not isinstance(workspace, str) or not isinstance(unsigned, bool):
            raise invalid(f'{IMPORT} expects "workspace" a string and "allowUnsigned" a boolean in argument 2')
        extra = ["--allow-unsigned"] if unsigned else []
        out = await ls.blocking(
            enginecall.cli_json,
            ls.store_path,
            "import",
            str(_absolute(ls, file)),
            "--workspace",
            str(_absolute(ls, workspace)),
            *extra,
        )
        return await summary_after(ls, out["mission"])

    @server.feature(POINT_CHANGES)
    @handler(server, POINT_CHANGES)
    async def point_changes(ls: KeelServer, params: Any = None) -> Any:
        mid, point, other = _params(POINT_CHANGES, params, ("id", "point", "point2"))
        return await ls.blocking(_changes, ls, mid, point, other or SANDBOX)

    @server.feature(POINT_FILE)
    @handler(server, POINT_FILE)
    async def point_file(ls: KeelServer, params: Any = None) -> Any:
        mid, point, path = _params(POINT_FILE, params, ("id", "point", "path"))
        if not path:
            raise invalid(f'{POINT_FILE} expects params {{"id", "point", "path"}} with a non-empty "path"')
        return await ls.blocking(_file, ls, mid, point, path)


def _absolute(ls: KeelServer, text: str) -> Path:
    path = Path(text).expanduser()
    return path if path.is_absolute() else ls.workspace_root / path


def _params(method: str, params: Any, names: tuple[str, str, str]) -> tuple[str, str, str]:
    values = params._asdict() if hasattr(params, "_asdict") else params if isinstance(params, dict) else {}
    first, second, third = (values.get(name) for name in names)
    if not (isinstance(first, str) and first and isinstance(second, str) and second) or not isinstance(
        third, str | None
    ):
        raise invalid(f"{method} expects params {{{', '.join(json.dumps(n) for n in names)}}} as strings")
    return first, second, third or ""


def _changes(ls: KeelServer, text: str, point: str, other: str) -> Any:
    store = ls.require_store()
    mid = resolve(store, text)
    old, _, _ = point_files(store, ls.store_path, mid, point)
    new, _, _ = point_files(store, ls.store_path, mid, other)
    return [
        convert.to_json(convert.file_change(p, old.get(p), new.get(p)))
        for p in sorted(set(old) | set(new))
        if old.get(p) != new.get(p)
    ]


def _file(ls: KeelServer, text: str, point: str, path: str) -> Any:
    store = ls.require_store()
    mid = resolve(store, text)
    files, read, _ = point_files(store, ls.store_path, mid, point)
    entry = files.get(path)
    return convert.to_json(convert.point_file(mid, point, path, None if entry is None else read(entry[1])))
