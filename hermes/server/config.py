"""Where a server keeps its store and its users' areas, and how it runs: apart from the application, so that the
account commands (`hermes server add-user`, `tokens`, ...) need not import FastAPI and the pool to find the store."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hermes.experiment.spec import ResourcesSpec

MAX_BODY = 1 << 20  # bytes of a request body: a spec with a thousand listed configs fits many times over
MAX_ACTIVE = 50  # unfinished experiments per user: more than a person queues, fewer than a runaway script


@dataclass(frozen=True, slots=True)
class ServerConfig:
    root: Path  # holds hermes.db (by default) and the users' areas
    database: str | None = None  # an SQLAlchemy URL; default: SQLite in root
    max_body: int = MAX_BODY
    max_active: int = MAX_ACTIVE  # experiments a user may have queued, running or interrupted at once
    run_experiments: bool = True  # False: an API over the store only (nothing is started)
    resources: ResourcesSpec | None = None  # the pool's GPUs or CPU slots; default: this machine's GPUs, else 1 slot
    poll: float = 0.5  # seconds between the pool's looks at the store (submissions, cancellations, weights)
    ray_address: str | None = None  # run the pool on every node of this Ray cluster; None: on this machine
    storage_uri: str | None = None  # on Ray, where durable checkpoints go (default: ROOT/pool/checkpoints)

    @property
    def database_url(self) -> str:
        """The database's URL. A SQLite database not made yet is made here, empty, readable by the server's account
        alone (0600), before SQLite or the first module to open it makes it readable by every local account (644):
        it holds every user's experiments and the tokens' digests. SQLite gives its -wal and -shm the same mode."""
        url = self.database or f"sqlite:///{self.root.resolve() / 'hermes.db'}"
        _make_private(url)
        return url

    def area(self, user: str) -> Path:
        """The user's area, made if missing: the folder that every file their specs name must lie in."""
        path = self.root.resolve() / "users" / user
        path.mkdir(parents=True, exist_ok=True)
        return path


def _make_private(url: str) -> None:
    """Make the SQLite file of ``url`` with mode 0600 if there is none; one that exists keeps its mode. A folder that
    cannot be made, or a file that cannot be, is left to whoever opens the database, which names it."""
    from sqlalchemy import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:") or parsed.query.get("uri"):
        return
    path = Path(parsed.database)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError:  # there already (FileExistsError), or not to be made here
        pass
