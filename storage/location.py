"""Where a store lives: `--store`, else $KEEL_STORE, else `<workspace>/.keel/store`.

A store is named by a folder, or by a PostgreSQL URL (`postgresql://user@host:port/db`, options such as
`?options=-csearch_path%3Dteam` allowed). A URL gets a local folder `<workspace>/.keel/pg-<hash>` holding
only `store.url`: logs, host locks and sandboxes live beside it, as beside an LMDB store, and every
process keel starts is handed that folder. A URL with a password is refused: libpq reads passwords from
~/.pgpass or $PGPASSWORD, and keel never writes one to disk.

The workspace's `.keel/` folder gets its own `.gitignore` (`*`) so that nothing of keel is ever
committed by accident.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

from keel.protocol.environblock import STORE_ENV_VAR
from keel.storage.errors import StoreError

STORE_ENV_PREFIX = "PG"  # libpq's settings: PGPASSWORD, PGPASSFILE, PGSERVICE, PGSSLMODE, PGHOST, …
URL_FILE = "store.url"  # a folder holding this names a PostgreSQL store
DATA_FILE = "data.mdb"  # a folder holding this is an LMDB store
_SCHEMES = ("postgresql://", "postgres://")


def default_store_path(workspace: str | os.PathLike[str] | None = None) -> Path:
    return resolve_store(None, workspace)


def resolve_store(spec: str | os.PathLike[str] | None, workspace: str | os.PathLike[str] | None = None) -> Path:
    """The store's local folder, absolute, for `--store SPEC` (a folder or a URL), else $KEEL_STORE,
    else the workspace's `.keel/store`."""
    spec = spec or os.environ.get("KEEL_STORE") or None
    root = Path(workspace or Path.cwd())
    if spec is None:
        return (root / ".keel" / "store").absolute()
    text = os.fspath(spec)
    if is_store_url(text):
        return url_folder(text, root)
    return (root / Path(text).expanduser()).absolute()


def store_exists(path: Path) -> bool:
    """Whether the folder holds a store (LMDB's data file, or a PostgreSQL store's URL)."""
    return (path / DATA_FILE).exists() or (path / URL_FILE).exists()


def is_store_url(text: str) -> bool:
    return text.startswith(_SCHEMES)


def url_folder(url: str, workspace: Path) -> Path:
    """The local folder that names the PostgreSQL store at `url` (made, with its `store.url`, if new)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - a malformed port raises here
    except ValueError as exc:
        raise StoreError(f"not a usable PostgreSQL URL: {exc}") from None
    if parts.password is not None:
        raise StoreError(
            "a PostgreSQL URL for --store/KEEL_STORE must not hold a password; keel never writes one to disk: "
            "put it in ~/.pgpass or $PGPASSWORD"
        )
    import hashlib  # only here: loading it (OpenSSL) costs every command that opens a store a few ms

    folder = (workspace / ".keel" / f"pg-{hashlib.blake2b(url.encode(), digest_size=6).hexdigest()}").absolute()
    marker = folder / URL_FILE
    if not marker.exists() or marker.read_text().strip() != url:
        prepare_keel_dir(folder)
        tmp = folder / f".{URL_FILE}.tmp"
        tmp.write_text(url + "\n")
        os.replace(tmp, marker)
    return folder


def store_env(environ: dict[str, str] | os._Environ[str] | None = None) -> dict[str, str]:
    """What a process of keel needs from the environment to open the store: libpq's `PG*` settings (a
    password in $PGPASSWORD, a ~/.pgpass elsewhere in $PGPASSFILE, a service file, TLS files). keel's
    processes that open the store (a unit's subagent, a worker) get these even where their agents and
    commands get a filtered environment; those never do."""
    source = os.environ if environ is None else environ
    return {k: v for k, v in source.items() if k.startswith(STORE_ENV_PREFIX) and k[2:3].isupper()}


def with_store_env(env: dict[str, str]) -> dict[str, str]:
    """`env` (an agent's filtered environment) plus the store's settings, for a process of keel that opens
    the store and starts that agent: STORE_ENV_VAR names what `without_store_env` takes away again."""
    own = store_env()
    return {**env, **own, STORE_ENV_VAR: ",".join(sorted(own))}


def prepare_keel_dir(store_path: Path) -> None:
    """Create the store's folder; if it is inside a `.keel` folder, give that folder a .gitignore."""
    store_path.mkdir(parents=True, exist_ok=True)
    keel_dir = store_path.parent
    if keel_dir.name == ".keel":
        ignore = keel_dir / ".gitignore"
        if not ignore.exists():
            ignore.write_text("# keel's durable state; never commit it\n*\n")
