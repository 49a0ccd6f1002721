"""keel.storage — the store (LMDB, or PostgreSQL): sealed records, keys, schema and migrations, verify.

Depends on keel.protocol, lmdb and (for a PostgreSQL store only) psycopg. Knows nothing of LSP, processes
or the engine: it stores typed records, checks every byte it reads, and keeps what was committed intact
when the disk fills up.
"""

from keel.storage.base import Store
from keel.storage.errors import CorruptRecordError, StoreDamagedError, StoreError, StoreFullError, StoreTooNewError
from keel.storage.keys import DB
from keel.storage.txn import Txn

__all__ = [
    "DB",
    "CorruptRecordError",
    "Store",
    "StoreDamagedError",
    "StoreError",
    "StoreFullError",
    "StoreTooNewError",
    "Txn",
]
