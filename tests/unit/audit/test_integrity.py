"""shared/history/integrity.py and the writer's chain: links, signatures, checkpoints, and a chain
that goes on unbroken across writers (a projector restarted, a store written in several sittings)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import select

from shared.audit.export import export
from shared.audit.integrity import Tampered, check
from shared.audit.logfile import LogFile, StoreLog
from shared.history import schema
from shared.history.integrity import GENESIS, Chainer, Signer, link, signature_ok
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
