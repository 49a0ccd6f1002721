"""Schema versions and forward migrations.

`MIGRATIONS[n]` moves a store from schema n to n+1 inside the single write transaction that opening the
store runs; a failure aborts it and leaves the store as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:
    from keel.storage.txn import Txn

SCHEMA_VERSION = 1


class SchemaInfo(msgspec.Struct, frozen=True):
    version: int
    written_by: str = ""


def _from_0(txn: Txn) -> None:
    """Schema 0 is a store created before versioning; nothing to move."""


MIGRATIONS: dict[int, Callable[[Txn], None]] = {0: _from_0}
