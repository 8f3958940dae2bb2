"""A PostgreSQL server of its own in a directory: ``initdb``, then ``postgres`` on a loopback port.

The tests start one per session (nothing assumes a system service) with the real server binaries
``make tools`` installed (``catalog.built("postgresql")``). Durability is turned off (``fsync``,
``synchronous_commit``, ``full_page_writes``): the data is thrown away at the end, and every
query still runs as it would on a production server.
"""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
from pathlib import Path

from shared.parts import catalog
from shared.parts.process import Part, free_port


def _server_user() -> str | None:
    """The user the server runs as: ours, unless we are root (which PostgreSQL refuses)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise catalog.MissingPart("postgresql", "running as root and no 'postgres' or 'nobody' user to run the server as")


class PostgresServer:
    """``start()`` it; ``url`` is its maintenance database (user ``postgres``, trust on loopback)."""

    def __init__(self, root: Path | None = None, *, port: int | None = None) -> None:
        self.root = root or Path(tempfile.mkdtemp(prefix="muster-postgres-"))
        """Its directory; the default is a new one of its own under the temporary directory, which the
        server's user can reach (a test's own temporary directory is private to root)."""
        self.data = self.root / "data"
        self.port = port or free_port()
        self.bindir = Path(catalog.built("postgresql").manifest["bin"])
        self.user = _server_user()
        self.part: Part | None = None

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _own(self, path: Path) -> None:
        if self.user:
            entry = pwd.getpwnam(self.user)
            shutil.chown(path, entry.pw_uid, entry.pw_gid)

    def start(self, timeout: float = 60.0) -> "PostgresServer":
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)
        self.data.mkdir(exist_ok=True)
        self._own(self.data)
        socket_dir = self.root / "socket"
        socket_dir.mkdir(exist_ok=True)
        self._own(socket_dir)
        if not (self.data / "PG_VERSION").exists():
            init = Part("initdb", [str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres",
                                   "--auth=trust", "--encoding=UTF8", "--no-sync"],
                        self.root / "initdb.log", user=self.user, cwd=self.root).start()
            assert init.proc is not None
            if init.proc.wait(timeout=timeout) != 0:
                from shared.parts.process import PartFailed, tail
                raise PartFailed(f"initdb failed; its log {init.log}: {tail(init.log)}")
        log = self.root / "postgres.log"
        log.touch()
        self._own(log)
        self.part = Part("postgres", [
            str(self.bindir / "postgres"), "-D", str(self.data), "-p", str(self.port), "-k", str(socket_dir),
            "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "synchronous_commit=off",
            "-c", "full_page_writes=off", "-c", "max_connections=200", "-c", "shared_buffers=128MB",
        ], log, user=self.user, cwd=self.root).start()
        self.part.wait_until(self._answers, timeout, f"accepting connections on 127.0.0.1:{self.port}")
        return self

    def _answers(self) -> bool:
        import psycopg

        psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres", connect_timeout=2).close()
        return True

    def stop(self) -> None:
        if self.part is not None:
            self.part.stop()

    def remove(self) -> None:
        """Stop the server and delete its directory."""
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
