"""The event log's hash chain and the signed records that anchor it (issue 33).

**The chain.** Every envelope written into the log of record gets a link, per log partition::

    link(n) = SHA-256(link(n-1) || bytes(n))        link(-1) = GENESIS (32 zero bytes)

where ``bytes(n)`` are the envelope's canonical bytes (the JSON the bus carried, which the store gives
back byte for byte) and ``n`` its offset in the chain (0, 1, 2, ... per partition: envelopes only, so a
dead-lettered record of the Kafka log takes no place in it). Any edit, insertion, deletion or
reordering changes every link from that point on.

**Signed records.** A link proves nothing by itself (anyone can chain a forged log): a *signer*, the
writer of the log of record, signs records with Ed25519 (RFC 8032) —

    key         a signing key's public half; the first is self-signed, a rotation is signed by the old key
    header      what the log was made under (``log_header``'s fields)
    checkpoint  partition, offset, the link at that offset, wall-clock time, muster's version; every
                ``every`` envelopes and every ``seconds`` seconds, and ``final`` when a run ends

— after CloudTrail's signed digest files and Certificate Transparency's signed tree heads: whoever
holds the public key (``muster log key``) can tell the log is the one the signer wrote, up to its
last checkpoint; a witness keeping checkpoints elsewhere (``muster log checkpoints``) can tell even
a history re-signed with a stolen key from the one it saw.

A record is a JSON object; its signature covers its canonical JSON (sorted keys, no spaces) without
the ``signature`` field. Pure: no store, no clock but the one given.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, TypeVar, cast

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

GENESIS = bytes(32)
"""The link before a partition's first envelope."""

CHECKPOINT_EVERY = 10_000
"""Envelopes between checkpoints by default: a busy projector writes about this many every second or
two, so a checkpoint costs one signature (~50 us) per ten thousand envelopes."""
CHECKPOINT_SECONDS = 60.0
"""And at least one this often while envelopes come (an idle log needs none: its chain does not move)."""

KEY_ENV = "MUSTER_SIGNING_KEY"
"""The path of the signing key file (a Kubernetes Secret mounted as a file in production)."""


def package_version() -> str:
    """This muster's version, as a checkpoint names it (``shared.runtime.build`` is a layer above)."""
    from importlib import metadata

    try:
        return metadata.version("muster")
    except metadata.PackageNotFoundError:  # pragma: no cover - a source tree without install
        return "unknown"


def link(prev: bytes, raw: bytes) -> bytes:
    """The chain link of an envelope whose canonical bytes are ``raw``, after ``prev``."""
    h = hashlib.sha256(prev)
    h.update(raw)
    return h.digest()


def canonical(record: Mapping[str, Any]) -> bytes:
    """The bytes a signature covers: the record without its signature, keys sorted, no spaces."""
    return json.dumps({k: v for k, v in record.items() if k != "signature"}, sort_keys=True,
                      separators=(",", ":"), ensure_ascii=False).encode()


def iso(at: float) -> str:
    """A wall-clock time as a checkpoint shows it: ISO 8601, UTC, to the millisecond."""
    return datetime.fromtimestamp(at, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def key_id(public: Ed25519PublicKey) -> str:
    """A key's short name: the first 16 hex digits of SHA-256 of its raw 32 bytes."""
    return hashlib.sha256(_raw_public(public)).hexdigest()[:16]


def _raw_public(public: Ed25519PublicKey) -> bytes:
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def public_pem(public: Ed25519PublicKey) -> str:
    """The public key as PEM (SubjectPublicKeyInfo: what ``openssl pkey -pubout`` prints)."""
    return public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def public_from_b64(text: str) -> Ed25519PublicKey:
    return Ed25519PublicKey.from_public_bytes(base64.b64decode(text, validate=True))


class BadKey(ValueError):
    """A key file that is not an Ed25519 key."""


_Key = TypeVar("_Key", Ed25519PublicKey, Ed25519PrivateKey)


def _read_key(path: Path, kind: type, name: str, pem: Callable[[bytes], object],
              raw: Callable[[bytes], _Key]) -> _Key:
    """The key of type ``kind`` (``_Key``'s public or private half) in ``path``: PEM (read by ``pem``), or
    the raw key bytes in base64 (read by ``raw``); a missing, unreadable or malformed file is a ``BadKey``
    of one line, for the CLI to print."""
    half = "public" if kind is Ed25519PublicKey else "private"
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise BadKey(f"cannot read the {name} {path}: {exc.strerror or exc}") from None
    try:
        key = pem(data) if b"-----BEGIN" in data else raw(base64.b64decode(data.decode().strip(), validate=True))
    except (ValueError, UnicodeDecodeError, TypeError) as exc:
        raise BadKey(f"{path}: not an Ed25519 {half} key ({exc})") from None
    if not isinstance(key, kind):
        raise BadKey(f"{path}: a {type(key).__name__.removeprefix('_')}, not an Ed25519 {half} key")
    return cast(_Key, key)


def load_public(path: Path) -> Ed25519PublicKey:
    """A public key from a file: PEM (``muster log key`` prints one), or the raw key in base64."""
    return _read_key(path, Ed25519PublicKey, "public key", serialization.load_pem_public_key,
                     Ed25519PublicKey.from_public_bytes)


@dataclass
class Signer:
    """An Ed25519 private key and the records it signs."""

    private: Ed25519PrivateKey
    generated: bool = False
    """Made for this run (a simulated one, or a projector given no key file): said where it matters."""
    clock: Callable[[], float] = time.time

    @classmethod
    def generate(cls) -> "Signer":
        return cls(Ed25519PrivateKey.generate(), generated=True)

    @classmethod
    def from_file(cls, path: Path) -> "Signer":
        """The key in ``path``: PEM (PKCS#8, ``openssl genpkey -algorithm ed25519`` or ``muster log
        keygen``), or the raw 32-byte seed in base64."""
        return cls(_read_key(path, Ed25519PrivateKey, "signing key",
                             lambda data: serialization.load_pem_private_key(data, password=None),
                             Ed25519PrivateKey.from_private_bytes))

    def pem(self) -> bytes:
        """The private key as unencrypted PKCS#8 PEM (for ``muster log keygen``)."""
        return self.private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption())

    @property
    def public(self) -> Ed25519PublicKey:
        return self.private.public_key()

    @property
    def id(self) -> str:
        return key_id(self.public)

    def sign(self, record: dict[str, Any]) -> dict[str, Any]:
        """``record`` with this key's id and its signature."""
        body = {**record, "key": self.id}
        body["signature"] = base64.b64encode(self.private.sign(canonical(body))).decode()
        return body

    def key_record(self, previous: "Signer | None" = None) -> dict[str, Any]:
        """The record that introduces this key: self-signed, or signed by ``previous`` (a rotation)."""
        record = {"kind": "key", "public_key": base64.b64encode(_raw_public(self.public)).decode(),
                  "key_id": self.id, "time": iso(self.clock())}
        if previous is None:
            return self.sign(record)
        return previous.sign({**record, "previous": previous.id})

    def header_record(self, header: Mapping[str, Any]) -> dict[str, Any]:
        return self.sign({"kind": "header", "header": dict(header), "time": iso(self.clock())})

    def checkpoint(self, partition: int, offset: int, chain: bytes, *, version: str, number: int = 0,
                   header: str | None = None, final: bool = False) -> dict[str, Any]:
        """A checkpoint: ``chain`` is the link at ``offset``; ``number`` counts the partition's checkpoints
        before it, so a deleted or repeated one is missed; ``header`` the digest of the header record in
        force (``digest``), so a removed or replaced header is."""
        record: dict[str, Any] = {"kind": "checkpoint", "partition": partition, "offset": offset,
                                  "chain": chain.hex(), "time": iso(self.clock()), "muster_version": version,
                                  "number": number, "header": header}
        if final:
            record["final"] = True
        return self.sign(record)


def digest(record: Mapping[str, Any]) -> str:
    """What a checkpoint names a header record by: SHA-256 of its signed bytes, in hex."""
    return hashlib.sha256(canonical(record)).hexdigest()


def signature_ok(record: Mapping[str, Any], public: Ed25519PublicKey) -> bool:
    try:
        public.verify(base64.b64decode(str(record.get("signature", "")), validate=True), canonical(record))
    except (InvalidSignature, ValueError):
        return False
    return True


@dataclass
class Head:
    """Where one partition's chain is: the next offset, the last link, and what the last checkpoint covered."""

    offset: int = 0
    link: bytes = GENESIS
    signed: int = 0
    """Envelopes up to (not including) this offset are covered by a checkpoint."""
    signed_at: float = 0.0
    checkpoints: int = 0
    """How many checkpoints of the partition there are (the next one's ``number``)."""


@dataclass
class Chainer:
    """The chain of every partition a writer writes, and the checkpoints that come due.

    ``add`` each envelope's bytes in log order; ``due`` after a batch for the checkpoints to write with
    it (one at every ``every``-th envelope, one for the rest when ``seconds`` have passed since the
    last); ``seal`` when a run ends. Without a signer the chain is kept and no record is made."""

    signer: Signer | None = None
    version: str = "unknown"
    every: int = CHECKPOINT_EVERY
    seconds: float = CHECKPOINT_SECONDS
    heads: dict[int, Head] = field(default_factory=dict)
    pending: list[dict[str, Any]] = field(default_factory=list)
    header: str | None = None
    """The digest of the signed header in force: every checkpoint names it."""

    def start(self, partition: int, offset: int, last: bytes, signed: int, checkpoints: int) -> None:
        """Go on from a stored chain (the writer's store, read when it starts cold)."""
        clock = self.signer.clock() if self.signer else 0.0
        self.heads[partition] = Head(offset, last, signed, clock, checkpoints)

    def add(self, partition: int, raw: bytes) -> tuple[int, bytes]:
        """Chain the next envelope of ``partition``: its offset and link."""
        head = self.heads.get(partition)
        if head is None:
            head = self.heads[partition] = Head(signed_at=self.signer.clock() if self.signer else 0.0)
        offset = head.offset
        head.link = value = link(head.link, raw)
        head.offset = offset + 1
        if self.signer is not None and head.offset - head.signed >= self.every:
            self._checkpoint(partition, head)
        return offset, value

    def due(self) -> list[dict[str, Any]]:
        """The checkpoints made since the last call, plus one per partition whose unsigned envelopes
        have waited ``seconds``."""
        if self.signer is not None:
            now = self.signer.clock()
            for partition, head in self.heads.items():
                if head.offset > head.signed and now - head.signed_at >= self.seconds:
                    self._checkpoint(partition, head)
        out, self.pending = self.pending, []
        return out

    def seal(self) -> list[dict[str, Any]]:
        """A final checkpoint of every partition (a run that ended): a log cut short lacks it."""
        if self.signer is not None:
            for partition, head in self.heads.items():
                self._checkpoint(partition, head, final=True)
        out, self.pending = self.pending, []
        return out

    def _checkpoint(self, partition: int, head: Head, *, final: bool = False) -> None:
        assert self.signer is not None
        if head.offset == 0:
            return
        self.pending.append(self.signer.checkpoint(partition, head.offset - 1, head.link, version=self.version,
                                                   number=head.checkpoints, header=self.header, final=final))
        head.signed, head.signed_at = head.offset, self.signer.clock()
        head.checkpoints += 1


def record_line(record: Mapping[str, Any]) -> bytes:
    """A signed record as an exported log's line holds it."""
    return b'{"muster_signed":' + json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode() + b"}\n"


def envelope_line(partition: int, offset: int, chain: bytes | str, raw: bytes) -> bytes:
    """An envelope as a chained log's line holds it: its link, place and bytes (unchanged)."""
    text = chain if isinstance(chain, str) else chain.hex()
    return b'{"chain":"%s","at":[%d,%d],"envelope":%s}\n' % (text.encode(), partition, offset, raw)
