"""A real PostgreSQL server for the tests, started from Debian's ``postgresql`` binaries.

``initdb`` and ``postgres`` refuse to run as root, so as root they run as the ``postgres`` user
(which the Debian package creates) through ``setpriv``. The server listens on 127.0.0.1 at a free
port with a Unix socket in its own directory, and a password-protected role ``flextrain`` owns a
database ``flextrain``; :meth:`PgServer.stop` shuts it down. Where the binaries are missing,
:func:`unavailable` says why (the tests that need the server skip with that reason).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
from pathlib import Path

from ft_helpers import free_port

PASSWORD = "s3cr3t-Pg-pass"  # the tests assert it is printed nowhere
USER = "flextrain"
DATABASE = "flextrain"
INSTALL_HINT = "install PostgreSQL's server (Debian: apt-get install postgresql) so that initdb and pg_ctl are found"


def _bindir() -> Path | None:
    found = shutil.which("pg_ctl")
    if found:
        return Path(os.path.realpath(found)).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(versions[-1]).parent if versions else None


def unavailable() -> str | None:
    """Why no server can be started here, or None."""
    if _bindir() is None:
        return f"no PostgreSQL server binaries: {INSTALL_HINT}"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no 'postgres' user to run the server as"
    return None


class PgServer:
    def __init__(self, root: Path) -> None:
        self.bindir = _bindir()
        self.root = root
        self.data = root / "data"
        self.sockets = root / "run"
        self.port = free_port()
        self._as_postgres: list[str] = []
        if os.geteuid() == 0:
            self._as_postgres = ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups"]

    def _run(self, *cmd: str, input: str | None = None) -> str:
        out = subprocess.run([*self._as_postgres, *cmd], input=input, capture_output=True, text=True, timeout=120,
                             cwd=self.root)
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr or out.stdout}")
        return out.stdout

    def start(self) -> PgServer:
        self.root.mkdir(parents=True, exist_ok=True)
        self.sockets.mkdir(exist_ok=True)
        if self._as_postgres:
            for path in (self.root, self.sockets):
                shutil.chown(path, "postgres", "postgres")
            os.chmod(self.root, 0o755)
        self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust",
                  "--auth-host=scram-sha-256", "-E", "UTF8")
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "server.log"), "-w",
                  "-o", f"-p {self.port} -k {self.sockets} -h 127.0.0.1 -c fsync=off", "start")
        try:
            self.psql(f"CREATE ROLE {USER} LOGIN PASSWORD '{PASSWORD}'")
            self.psql(f"CREATE DATABASE {DATABASE} OWNER {USER}")
        except BaseException:
            self.stop()
            raise
        return self

    def psql(self, sql: str, *, database: str = "postgres") -> str:
        """Run SQL as the superuser over the Unix socket (trusted)."""
        return self._run(str(self.bindir / "psql"), "-h", str(self.sockets), "-p", str(self.port), "-U", "postgres",
                         "-d", database, "-v", "ON_ERROR_STOP=1", "-q", "-f", "-", input=sql)

    def url(self, *, table: str, key: str | None = None, password: bool = False) -> str:
        """A TCP URL for the ``flextrain`` role (with its password only where asked)."""
        auth = f"{USER}:{PASSWORD}" if password else USER
        return (f"postgresql+psycopg://{auth}@127.0.0.1:{self.port}/{DATABASE}?table={table}"
                + (f"&key={key}" if key else ""))

    def stop(self) -> None:
        subprocess.run([*self._as_postgres, str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate",
                        "-w", "stop"], capture_output=True, timeout=60, cwd=self.root)
