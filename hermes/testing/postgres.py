"""A throwaway PostgreSQL server for tests: ``initdb`` in a temporary folder, ``pg_ctl`` on a free port.

Uses the PostgreSQL binaries on the machine (Debian's ``postgresql`` package puts them in
/usr/lib/postgresql/<version>/bin; ``.ci/setup-services`` installs it). ``initdb`` refuses to run
as root, so as root the server runs as the ``postgres`` user the package creates. fsync is off:
the data is thrown away. Usage::

    with PostgresServer(tmp_dir) as server:
        store = SqlStore(server.new_database())
"""

from __future__ import annotations

import glob
import itertools
import os
import shutil
import socket
import subprocess
from pathlib import Path
from types import TracebackType

from hermes.errors import HermesError


def find_binaries() -> Path | None:
    """The folder holding initdb and pg_ctl, newest version first, or None."""
    found = shutil.which("pg_ctl")
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name), reverse=True)
    for folder in [*candidates, *([str(Path(found).parent)] if found else [])]:
        if (Path(folder) / "initdb").exists() and (Path(folder) / "pg_ctl").exists():
            return Path(folder)
    return None


class PostgresServer:
    def __init__(self, directory: Path) -> None:
        self.bin = find_binaries()
        if self.bin is None:
            raise HermesError("no PostgreSQL binaries (initdb, pg_ctl): apt-get install -y postgresql")
        self.directory = Path(directory)
        self.port = _free_port()
        self._names = itertools.count()
        self._as: list[str] = []
        if os.geteuid() == 0:
            self._as = ["runuser", "-u", "postgres", "--"]

    def __enter__(self) -> PostgresServer:
        data = self.directory / "data"
        self.directory.mkdir(parents=True, exist_ok=True)
        if self._as:
            shutil.chown(self.directory, "postgres")
        self._run(str(self.bin / "initdb"), "-D", str(data), "-U", "hermes", "--auth=trust", "-E", "UTF8")
        self.start()
        return self

    def __exit__(self, *exc: tuple[type[BaseException] | None, BaseException | None, TracebackType | None]) -> None:
        self.stop()

    def start(self) -> None:
        options = f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.directory / "data"), "-o", options, "-l",
                  str(self.directory / "log"), "-w", "start")

    def stop(self) -> None:
        """As a crash would: every connection is cut (a test of an outage starts it again)."""
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.directory / "data"), "-m", "immediate", "-w", "stop")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://hermes@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """The URL of a fresh, empty database on this server."""
        import sqlalchemy as sa

        name = f"test_{next(self._names)}"
        engine = sa.create_engine(self.url(), isolation_level="AUTOCOMMIT")
        with engine.connect() as connection:
            connection.exec_driver_sql(f"CREATE DATABASE {name}")
        engine.dispose()
        return self.url(name)

    def _run(self, *command: str) -> None:
        result = subprocess.run([*self._as, *command], capture_output=True, text=True, cwd="/")
        if result.returncode:
            raise HermesError(f"{' '.join(command)} failed ({result.returncode}): {result.stderr or result.stdout}")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
