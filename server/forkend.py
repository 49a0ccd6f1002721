"""How a forked child of keel's ends (a detached host, a host starter's command run, a unit's worker, keel's own
agent): it runs its part and leaves the process with the exit code an interpreter would give, its standard streams
flushed, never returning into the code it was forked from (nor running that code's exit handlers)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from typing import NoReturn


def run_and_exit(part: Callable[[], int | None], last: Callable[[int], None] | None = None) -> NoReturn:
    """`part()`'s code (None: 0), a SystemExit's as an interpreter takes it, 1 after any other error (its traceback
    on stderr); `last` hears the code before the process ends."""
    code = 1
    try:
        code = part() or 0
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        if last is not None:
            with contextlib.suppress(OSError):
                last(code)
        os._exit(code)


def _exit_code(code: object) -> int:
    """What an interpreter exits with for `sys.exit(code)`: None is 0, a number itself, anything else printed and 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    with contextlib.suppress(OSError, ValueError):
        print(code, file=sys.stderr)
    return 1
