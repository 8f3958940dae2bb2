"""The Kafka projector chains the log topic's records into the store and signs checkpoints: across a
restart and a dead-lettered record, the store's export verifies with the projector's public key, the
checkpoints also go to the checkpoints topic, and an edit of the export is caught (issue 33)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared.audit.export import export
from shared.audit.integrity import Tampered, check
from shared.audit.logfile import LogFile, StoreLog
from shared.history.integrity import Signer
from shared.runtime.bus.config import BusConfig
from shared.runtime.bus.projector import projector_app
from shared.runtime.bus.worker import Record
from tests.integration.conftest import scenario_run
from tests.integration.test_bus_service import read_until, running
from tests.integration.test_projector import FAIR_SHARE, caught_up, log_records, produce


def test_the_projector_chains_and_signs_what_it_reads(kafka_bootstrap: str, topic_prefix: str, pg_store: str,
                                                      tmp_path: Path) -> None:
    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    log = scenario_run(FAIR_SHARE).runtime.log
    half = len(log) // 2
    signer = Signer.generate()

    def app() -> object:
        return projector_app(config, pg_store, within=0.05, signer=signer, checkpoint_every=25)

    with running(config, app):
        produce(config, log_records(config, log[:half]))
        caught_up(config, pg_store, half)
    bad = log_records(config, log[:1])[0]
    with running(config, app):  # restarted: the chain goes on from the store, the bad record takes no place
        produce(config, [Record(bad.topic, bad.key, b'{"id": "truncated', bad.headers)]
                + log_records(config, log[half:]))
        caught_up(config, pg_store, len(log) + 1)
    out = tmp_path / "store.jsonl"
    export(StoreLog(pg_store), out)
    verdict = check(LogFile(out), [signer.public])
    assert (verdict.envelopes, verdict.authentic) == (len(log), True)
    signed = len(log) // 25  # one every 25 envelopes; the rest waits for the next (or 60 s)
    assert (verdict.checkpoints, verdict.unsigned) == (signed, len(log) - 25 * signed)
    published = read_until(config, config.topics.checkpoints, lambda rs: any(
        json.loads(r.value).get("kind") == "checkpoint" for r in rs))
    kinds = [json.loads(r.value)["kind"] for r in published]
    assert kinds[0] == "key" and "checkpoint" in kinds
    lines = out.read_bytes().splitlines(keepends=True)
    i = next(i for i, line in enumerate(lines) if line.startswith(b'{"chain"') and b'"source":"queue"' in line)
    lines[i] = lines[i].replace(b'"source":"queue"', b'"source":"placement"', 1)
    out.write_bytes(b"".join(lines))
    with pytest.raises(Tampered, match=f"line {i + 1}: .*edited or inserted"):
        check(LogFile(out), [signer.public])
