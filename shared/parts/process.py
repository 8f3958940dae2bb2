"""Running a real part as a child process: started, waited on until it answers, stopped.

A ``Part`` runs one program with its output in a log file (the first thing to read when it will not
start: ``PartFailed`` quotes its tail). It is started in a session of its own, so stopping it stops
what it started, and so a dev cluster left running (``detach``) outlives the command that made it;
``pidfile`` lets a later command stop it.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Mapping, Self, Sequence


class PartFailed(RuntimeError):
    """A part exited or did not become ready; the message names it and quotes its log."""


_HANDED: set[int] = set()
"""Ports this process handed out: none is handed out twice, though its program may not listen yet."""
_PICK = random.SystemRandom()  # not the ``random`` a test seeds: two processes would pick alike


def _ephemeral_low() -> int:
    """The lowest port the kernel gives outgoing connections (Linux: ip_local_port_range; else IANA's)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 49152


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, for a program started next to listen on.

    Below the kernel's ephemeral range: a port the OS picks (a bind to port 0) comes from the range
    outgoing connections take theirs from, so one of them can take it before the program listens, as
    one did to a service's metrics port beside a real cluster's many connections."""
    low = _ephemeral_low()
    span = range(max(1024, low - 12000), low) if low > 2048 else range(0)
    for _ in range(100):
        if not span:
            break
        port = _PICK.choice(span)
        if port in _HANDED:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED.add(port)
        return port
    with socket.socket() as sock:  # no room below the range: the OS's pick, as before
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def tail(path: Path, lines: int = 8) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(line.strip()[:300] for line in text[-lines:]) or "(empty log)"


class Part:
    """One program of the cluster or the stack, its log in ``log``."""

    def __init__(self, name: str, argv: Sequence[str], log: Path, *, env: Mapping[str, str] | None = None,
                 cwd: Path | None = None, user: str | None = None) -> None:
        self.name = name
        self.user = user
        """Run as this user (PostgreSQL will not run as root)."""
        self.argv = list(argv)
        self.log = log
        self.env = {**os.environ, **(env or {})}
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> "Part":
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=self.env, cwd=self.cwd, start_new_session=True,
                                         user=self.user)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} was not started"
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_until(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll ``ready`` until it holds; ``PartFailed`` if the program exits or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while True:
            if not self.alive():
                code = self.proc.returncode if self.proc else None
                raise PartFailed(f"{self.name} exited (code {code}) before {what}; its log {self.log}: {tail(self.log)}")
            try:
                if ready():
                    return
            except Exception:  # a readiness probe that fails is a probe that says "not yet"
                pass
            if time.monotonic() > deadline:
                raise PartFailed(f"{self.name} did not become ready ({what}) within {timeout:g} s; "
                                 f"its log {self.log}: {tail(self.log)}")
            time.sleep(0.2)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the program's session, SIGKILL it after ``timeout``."""
        if self.proc is None or self.proc.poll() is not None:
            return
        stop_group(self.proc.pid, timeout)
        try:
            self.proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            pass


class Served:
    """A real part a test or command runs for a while in a folder of its own: ``with`` starts it,
    then stops it and removes the folder if it made it (a folder given is left, with the log, to
    whoever gave it). Subclasses set ``part`` in ``start``."""

    def __init__(self, root: Path | None, prefix: str) -> None:
        self.root = root or Path(tempfile.mkdtemp(prefix=prefix))
        self._own_root = root is None
        self.part: Part | None = None

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        if self.part is not None:
            self.part.stop()

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self._own_root:
            self.remove()
        else:
            self.stop()


def stop_group(pid: int, timeout: float = 15.0) -> None:
    """Stop the session led by ``pid`` (a part started by this or an earlier command)."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except (ProcessLookupError, PermissionError):
            return
        try:  # reap it if it is our child (an undetached part); a zombie still answers killpg
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        except ChildProcessError:
            pass
        time.sleep(0.1)
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
