"""shared/history/integrity.py and the writer's chain: links, signatures, checkpoints, and a chain
that goes on unbroken across writers (a projector restarted, a store written in several sittings)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from sqlalchemy import select

from shared.audit.export import export
from shared.audit.integrity import Tampered, check
from shared.audit.logfile import LogFile, StoreLog
from shared.history import schema
from shared.history.integrity import (GENESIS, BadKey, Chainer, Signer, key_id, link, load_public, public_pem,
                                      signature_ok)
from shared.history.models import EventLog
from shared.history.writer import ProjectionWriter
from tests.builders.audit import header_of, scenario_run


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def test_a_link_covers_the_one_before_and_the_bytes() -> None:
    a = link(GENESIS, b"x")
    assert a != link(GENESIS, b"y") and link(a, b"z") != link(link(GENESIS, b"y"), b"z")
    assert len(a) == 32


def test_a_signature_covers_every_field_but_itself() -> None:
    signer = Signer.generate()
    record = signer.checkpoint(0, 5, bytes(32), version="1")
    assert signature_ok(record, signer.public)
    assert not signature_ok({**record, "offset": 6}, signer.public)
    assert not signature_ok(record, Signer.generate().public)


def test_checkpoints_every_n_envelopes_and_every_t_seconds() -> None:
    clock = Clock()
    signer = Signer.generate()
    signer.clock = clock
    chainer = Chainer(signer, "1", every=3, seconds=10.0)
    for i in range(7):
        chainer.add(0, b"%d" % i)
    assert [r["offset"] for r in chainer.due()] == [2, 5]  # the 3rd and 6th
    chainer.add(0, b"7")
    assert chainer.due() == []  # two unsigned, not yet ten seconds
    clock.now += 10
    due = chainer.due()
    assert [(r["offset"], r["number"]) for r in due] == [(7, 2)]
    assert chainer.seal()[0]["final"] is True


def _write(url: str, log: list, signer: Signer, every: int) -> None:
    with ProjectionWriter(url, signer=signer, checkpoint_every=every) as writer:
        for i in range(0, len(log), 20):
            writer.write(log[i:i + 20])


def test_the_chain_goes_on_across_writers(tmp_path: Path) -> None:
    """Two writers one after the other (a projector restarted) make one unbroken, verifying chain."""
    run = scenario_run("kai-priority-preemption")
    url = f"sqlite:///{tmp_path / 'h.db'}"
    schema.ensure(url)
    signer = Signer.generate()
    log = run.runtime.log
    with ProjectionWriter(url, signer=signer, checkpoint_every=25) as writer:
        writer.sign_header(header_of(run).for_store())
    _write(url, log[:60], signer, 25)
    _write(url, log[60:], signer, 25)
    with ProjectionWriter(url, signer=signer) as writer:
        writer.seal()
    from shared.history.header import write_header

    write_header(url, header_of(run).for_store())
    out = tmp_path / "log.jsonl"
    export(StoreLog(url), out)
    verdict = check(LogFile(out), [signer.public])
    assert verdict.envelopes == len(log) and verdict.checkpoints == len(log) // 25 + 1 and verdict.authentic
    with ProjectionWriter(url) as writer, writer.engine.connect() as conn:
        offsets = list(conn.execute(select(EventLog.__table__.c.chain_offset).order_by(EventLog.__table__.c.seq)).scalars())
    assert offsets == list(range(len(log)))


def test_a_rotated_key_is_followed_from_the_old_one(tmp_path: Path) -> None:
    run = scenario_run("kai-priority-preemption")
    url = f"sqlite:///{tmp_path / 'h.db'}"
    schema.ensure(url)
    old, new = Signer.generate(), Signer.generate()
    log = run.runtime.log
    with ProjectionWriter(url, signer=old, checkpoint_every=25) as writer:
        writer.sign_header(header_of(run).for_store())
    _write(url, log[:60], old, 25)
    with ProjectionWriter(url, signer=new, rotated_from=old, checkpoint_every=25) as writer:
        writer.write(log[60:])
        writer.seal()
    from shared.history.header import write_header

    write_header(url, header_of(run).for_store())
    out = tmp_path / "log.jsonl"
    export(StoreLog(url), out)
    verdict = check(LogFile(out), [old.public])
    assert verdict.keys == [old.id, new.id] and verdict.authentic
    with pytest.raises(Tampered, match="does not endorse"):
        check(LogFile(out), [new.public])  # the new key alone does not vouch for what the old one signed
    lines = out.read_bytes().splitlines(keepends=True)
    rotation = next(i for i, line in enumerate(lines) if b'"previous"' in line)
    record = json.loads(lines[rotation])["muster_signed"]
    forged = Signer.generate()
    lines[rotation] = b'{"muster_signed":' + json.dumps(forged.key_record(), separators=(",", ":")).encode() + b"}\n"
    assert record["key_id"] == new.id
    out.write_bytes(b"".join(lines))
    with pytest.raises(Tampered):
        check(LogFile(out), [old.public])


def _replay_ordered(tmp_path: Path, signer: Signer) -> list[bytes]:
    """A chained log laid out as a Kafka export lays it out (``LogHeader.replay_order``): the header
    marked, every signed record first, the envelope lines after (here still in chain order)."""
    from shared.audit.header import LogHeader
    from tests.builders.audit import chained

    lines = chained(scenario_run("kai-priority-preemption"), tmp_path / "chain.jsonl", signer=signer, every=40) \
        .read_bytes().splitlines(keepends=True)
    header = LogHeader.parse(lines[0], "line 1").model_copy(update={"replay_order": True}).line()
    signed = [line for line in lines[1:-1] if line.startswith(b'{"muster_signed"')]
    envelopes = [line for line in lines[1:-1] if line.startswith(b'{"chain"')]
    return [header, *signed, *envelopes, lines[-1]]


def _source(line: bytes) -> str:
    return str(json.loads(line)["envelope"]["source"])


def _file(lines: list[bytes], path: Path) -> LogFile:
    path.write_bytes(b"".join(lines))
    return LogFile(path)


def test_a_log_in_replay_order_is_checked_in_the_order_of_its_places(tmp_path: Path) -> None:
    signer = Signer.generate()
    lines = _replay_ordered(tmp_path, signer)
    verdict = check(_file(lines, tmp_path / "ordered.jsonl"), [signer.public])
    assert verdict.authentic and verdict.envelopes == sum(1 for line in lines if line.startswith(b'{"chain"'))
    first = next(i for i, line in enumerate(lines) if line.startswith(b'{"chain"'))
    # two producers' envelopes the other way round: the chain holds (how they interleave is the replay's to check)
    i = next(i for i in range(first, len(lines) - 2) if _source(lines[i]) != _source(lines[i + 1]))
    swapped = [*lines[:i], lines[i + 1], lines[i], *lines[i + 2:]]
    assert check(_file(swapped, tmp_path / "interleaved.jsonl"), [signer.public]).envelopes == verdict.envelopes
    # one producer's two envelopes the other way round: named
    j = next(j for j in range(first, len(lines) - 2) if _source(lines[j]) == _source(lines[j + 1]) == "queue")
    swapped = [*lines[:j], lines[j + 1], lines[j], *lines[j + 2:]]
    with pytest.raises(Tampered, match=f"line {j + 2}: queue's envelope at offset .* lines were reordered"):
        check(_file(swapped, tmp_path / "reordered.jsonl"), [signer.public])
    # a signed record among the envelopes: named
    moved = [*lines[:first - 1], *lines[first:first + 3], lines[first - 1], *lines[first + 3:]]
    with pytest.raises(Tampered, match=f"line {first + 3}: a signed record after the log's first envelope"):
        check(_file(moved, tmp_path / "moved.jsonl"), [signer.public])
    # an envelope dropped, the end line made again: the line after it in the chain is named
    k = first + 10
    place = json.loads(lines[k])["at"]
    dropped = [*lines[:k], *lines[k + 1:-1], b'{"muster_log_end":{"events":%d}}\n' % (verdict.envelopes - 1)]
    with pytest.raises(Tampered, match=f"offset {place[1]} of partition 0, the one before this line's, is not in the "
                                       "log: a line was deleted"):
        check(_file(dropped, tmp_path / "dropped.jsonl"), [signer.public])


def test_a_log_in_replay_order_imports_in_chain_order(tmp_path: Path) -> None:
    """The writer chains what it imports in the order of the places, so the store's links are the ones
    signed, whatever order the file's lines stand in."""
    from shared.audit.export import import_log

    signer = Signer.generate()
    lines = _replay_ordered(tmp_path, signer)
    first = next(i for i, line in enumerate(lines) if line.startswith(b'{"chain"'))
    i = next(i for i in range(first, len(lines) - 2) if _source(lines[i]) != _source(lines[i + 1]))
    lines = [*lines[:i], lines[i + 1], lines[i], *lines[i + 2:]]
    url = f"sqlite:///{tmp_path / 'imported.db'}"
    import_log(_file(lines, tmp_path / "ordered.jsonl"), url)
    out = tmp_path / "store.jsonl"
    export(StoreLog(url), out)
    assert check(LogFile(out), [signer.public]).authentic


def test_a_key_file_is_read_as_pem_or_base64_and_either_half_of_the_pair(tmp_path: Path) -> None:
    signer = Signer.generate()
    seed = signer.private.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                        serialization.NoEncryption())
    raw_public = signer.public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    files = {"key.pem": signer.pem(), "key.b64": base64.b64encode(seed) + b"\n",
             "pub.pem": public_pem(signer.public).encode(), "pub.b64": base64.b64encode(raw_public) + b"\n"}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    assert Signer.from_file(tmp_path / "key.pem").id == Signer.from_file(tmp_path / "key.b64").id == signer.id
    assert key_id(load_public(tmp_path / "pub.pem")) == key_id(load_public(tmp_path / "pub.b64")) == signer.id


@pytest.mark.parametrize(("content", "private", "said"), [
    (None, True, "cannot read the signing key {path}: No such file or directory"),
    (None, False, "cannot read the public key {path}: No such file or directory"),
    (b"not base64!", True, "{path}: not an Ed25519 private key ("),
    (b"not base64!", False, "{path}: not an Ed25519 public key ("),
    (base64.b64encode(bytes(7)), True, "{path}: not an Ed25519 private key ("),
    ("public pem", True, "{path}: not an Ed25519 private key ("),
    ("private pem", False, "{path}: not an Ed25519 public key ("),
    ("rsa private pem", True, "{path}: a RSAPrivateKey, not an Ed25519 private key"),
    ("rsa public pem", False, "{path}: a RSAPublicKey, not an Ed25519 public key"),
])
def test_a_key_file_that_cannot_serve_is_one_line_that_names_it(tmp_path: Path, content: bytes | str | None,
                                                                private: bool, said: str) -> None:
    path = tmp_path / "key"
    if content is not None:
        path.write_bytes(_key_file(content) if isinstance(content, str) else content)
    with pytest.raises(BadKey) as caught:
        Signer.from_file(path) if private else load_public(path)
    message = str(caught.value)
    assert message.startswith(said.format(path=path)) and "\n" not in message


def _key_file(kind: str) -> bytes:
    """A PEM file of the kind named: either half of an Ed25519 key, or of an RSA key (not Ed25519)."""
    from cryptography.hazmat.primitives.asymmetric import rsa

    if kind.startswith("rsa"):
        private = rsa.generate_private_key(public_exponent=65537, key_size=1024)
        if kind == "rsa private pem":
            return private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                         serialization.NoEncryption())
        return private.public_key().public_bytes(serialization.Encoding.PEM,
                                                 serialization.PublicFormat.SubjectPublicKeyInfo)
    signer = Signer.generate()
    return signer.pem() if kind == "private pem" else public_pem(signer.public).encode()
