"""What opening an LMDB store checks of data.mdb, with plain reads, before LMDB touches what it would trust.

`check_file` runs before LMDB maps the file (the meta pages, the page size, every page in use inside the
file: `lmdbwalk.check_data_file`); `check_trees` after the environment is open and a read transaction is
held, before any tree is walked (every branch and leaf page as LMDB's cursors need it: `lmdbtrees`). Either
refuses a damaged file with StoreDamagedError naming it, so that LMDB never gets to SIGBUS on a truncated
file or abort on a damaged page. A writer may be committing meanwhile: a file that looks damaged is read
again a few times, and damage is what stays.
"""

from __future__ import annotations

import time
from pathlib import Path

from keel.storage.errors import StoreDamagedError, StoreError
from keel.storage.lmdbfile import MAX_PAGE_SIZE, DataFile, FileDamage, newest
from keel.storage.lmdbtrees import tree_damage
from keel.storage.lmdbwalk import check_data_file
from keel.storage.writelock import WriterLock

_DAMAGE_READS = 3  # a data.mdb that looks damaged is read this often before it counts as damaged


def check_file(path: Path, writer: WriterLock, timeout: float) -> None:
    """Refuse a damaged data.mdb before LMDB maps it. A writer may be committing meanwhile (a meta page being
    written, the file growing): a file that looks damaged is read again a few times, and damage is what
    stays. A file still too short to hold its meta pages is judged again under the writer lock: another
    process may be creating the store at this moment."""
    data = path / "data.mdb"
    for attempt in range(_DAMAGE_READS):
        try:
            check_data_file(data)
            return
        except FileDamage as exc:
            if data.stat().st_size < 2 * MAX_PAGE_SIZE:
                break
            if attempt == _DAMAGE_READS - 1:
                raise StoreDamagedError(f"the LMDB file is damaged: {data} {exc}; nothing was changed") from None
            time.sleep(0.02)
        except OSError as exc:
            raise StoreError(f"cannot read {data}: {exc}") from None
    with writer.held(timeout):
        try:
            check_data_file(data)
        except FileDamage as exc:
            raise StoreDamagedError(f"the LMDB file is damaged: {data} {exc}; nothing was changed") from None


def check_trees(data: Path) -> None:
    """Refuse a data.mdb whose trees LMDB's cursors could not walk (`lmdbtrees.tree_damage`). The caller holds
    a read transaction of the store: no page of that snapshot or a newer one is reused meanwhile, so the
    newest meta page read now is safe to walk."""
    for attempt in range(_DAMAGE_READS):
        try:
            with DataFile(data) as f:
                meta = newest(f.metas())
                f.measure()  # after the meta page: a commit writes its pages first
                damage = tree_damage(f, meta)
            break
        except FileDamage as exc:  # a meta page read while a commit wrote it
            if attempt == _DAMAGE_READS - 1:
                raise StoreDamagedError(f"the LMDB file is damaged: {data} {exc}; nothing was changed") from None
            time.sleep(0.02)
        except OSError as exc:
            raise StoreError(f"cannot read {data}: {exc}") from None
    if damage is not None:
        raise StoreDamagedError(
            f"the LMDB file is damaged: {data}: {damage}; nothing was changed (`keel verify` lists every damaged page)"
        )
