"""keel.storage — the LMDB store: sealed records, keys, schema and migrations, verify.

Depends on keel.protocol and lmdb only. Knows nothing of LSP, processes or the engine: it stores typed
records, checks every byte it reads, and keeps what was committed intact when the disk fills up.
"""

from keel.storage.errors import CorruptRecordError, StoreDamagedError, StoreError, StoreFullError, StoreTooNewError
from keel.storage.keys import DB
from keel.storage.store import Store
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
