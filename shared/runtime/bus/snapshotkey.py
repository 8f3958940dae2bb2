"""The key that authenticates snapshots: held by the services, not by whoever can write a topic.

A snapshot's manifest names its chunks' SHA-256, but a hash has no key: whoever can write the
snapshot topic could write a well-formed state of their choosing with a matching hash, and a
service would load it. So every manifest and checkpoint record carries an HMAC-SHA256 of its bytes
(header ``MAC_HEADER``) under a key read from a file (``MUSTER_SNAPSHOT_KEY_FILE``: a mounted
Kubernetes Secret in production); the MAC also covers the record's kind and topic, so one record
cannot pass for another kind or another service's. The manifest's SHA-256 covers the chunks. A
record without a MAC, or with one that does not match, is refused before its bytes are parsed.

Without a key file, ``muster run`` takes no snapshots (every start replays the whole inbox), and
in-process runs (``simulate --bus``, tests, benchmarks) sign with a key of their own process
(``run_key``): their snapshots are loaded by restarts within that process and by no one else.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

KEY_VARIABLE = "MUSTER_SNAPSHOT_KEY_FILE"
"""The environment variable naming the key file."""

MIN_KEY_BYTES = 32
"""A key shorter than HMAC-SHA256's output would be its weakest part: refused."""

MAC_HEADER = "muster-mac"
"""The record header holding the HMAC-SHA256 of a manifest or checkpoint (32 bytes)."""


class SnapshotKeyError(ValueError):
    """A key file that cannot be used: why, in one line."""


def read_key(path: str | Path) -> bytes:
    """The key in ``path``: its bytes, whitespace at either end dropped (``openssl rand -hex 32 >
    FILE`` ends in a newline), at least ``MIN_KEY_BYTES`` of them."""
    try:
        key = Path(path).read_bytes().strip()
    except OSError as exc:
        raise SnapshotKeyError(f"{KEY_VARIABLE} {str(path)!r}: cannot read it ({exc.strerror or exc})") from None
    if len(key) < MIN_KEY_BYTES:
        raise SnapshotKeyError(f"{KEY_VARIABLE} {str(path)!r}: {len(key)} bytes, a key needs at least "
                               f"{MIN_KEY_BYTES} (make one with: openssl rand -hex 32)")
    return key


_RUN_KEY: bytes | None = None


def run_key() -> bytes:
    """This process's own key (random, made on first use): for runs whose services share a process."""
    global _RUN_KEY
    if _RUN_KEY is None:
        _RUN_KEY = os.urandom(MIN_KEY_BYTES)
    return _RUN_KEY


def mac(key: bytes, kind: str, topic: str, value: bytes) -> bytes:
    """The HMAC-SHA256 of a ``kind`` record's ``value`` on ``topic``."""
    return hmac.new(key, b"%s\0%s\0%s" % (kind.encode(), topic.encode(), value), hashlib.sha256).digest()


def authentic(key: bytes, kind: str, topic: str, value: bytes, given: bytes | None) -> bool:
    """``given`` is the MAC of that record under ``key`` (compared in constant time)."""
    return given is not None and hmac.compare_digest(mac(key, kind, topic, value), given)
