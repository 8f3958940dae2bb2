"""``muster log export --from kafka://...`` of a stack run whose projector signs: the file is chained
and signed (layout 2, in replay order), verifies with the projector's public key, and an edited, a
dropped (even re-chained) or two swapped lines are named — exit 7 before any decision is replayed, or
exit 1 where the swap leaves every byte authentic and the replay names the decision it moves (issue 33,
docs/design/audit.md "A chained log in replay order").

The stack: ``simulate --bus --keep-topics`` (the four services on the session's Kafka, the log topic
interleaving their outputs), then a projector with a signing key reading that log into a store."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from shared.audit.errors import CANNOT_REPRODUCE, DIVERGED
from shared.audit.integrity import TAMPERED, check
from shared.audit.kafka import read_topic
from shared.audit.logfile import LogFile
from shared.history import schema
from shared.history.integrity import Signer, link, public_pem
from shared.runtime.bus.config import BusConfig
from shared.runtime.bus.projector import projector_app
from tests.builders.cli import clean_exit, flat, invoke, one_line_error
from tests.conftest import signed_to_its_end
from tests.integration.test_bus_service import running
from tests.integration.test_projector import caught_up

SCENARIOS = Path(__file__).parents[1] / "scenarios"
NAME = "kai-priority-preemption"


@pytest.fixture(scope="module")
def signed_export(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """(the Kafka export, the public key's file, a folder): the scenario through the services on Kafka,
    its log read by a signing projector until its last envelope is signed, then exported from Kafka."""
    from tests.conftest import delete_topics
    from tests.integration.test_localbroker import topics

    folder = tmp_path_factory.mktemp("kafka-chain")
    before = topics(kafka_bootstrap)
    clean_exit(invoke("simulate", SCENARIOS / f"{NAME}.yaml", "--bus", f"kafka://{kafka_bootstrap}", "--keep-topics",
                      "-q"), 0)
    [log_topic] = [t for t in topics(kafka_bootstrap) - before if t.endswith(".events")]
    prefix = log_topic[:-len("events")]
    try:
        config = BusConfig(kafka_bootstrap, prefix=prefix)
        store = f"sqlite:///{folder / 'history.db'}"
        schema.ensure(store)
        signer = Signer.generate()
        end = asyncio.run(read_topic(config, config.topics.log))[-1][0] + 1
        with running(config, lambda: projector_app(config, store, within=0.05, signer=signer, checkpoint_every=50,
                                                   checkpoint_seconds=0.2)):
            caught_up(config, store, end)
            deadline = 60
            while not signed_to_its_end(kafka_bootstrap, prefix):
                assert deadline > 0, "the projector did not sign the log's last envelope"
                deadline -= 1
                asyncio.run(asyncio.sleep(1))
        public = folder / "public.pem"
        public.write_text(public_pem(signer.public))
        out = folder / "kafka.jsonl"
        clean_exit(invoke("log", "export", "--from", f"kafka://{kafka_bootstrap}", "--topic-prefix", prefix,
                          "--out", out), 0)
        yield out, public, folder
    finally:
        delete_topics(kafka_bootstrap, prefix)


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def _envelope(line: bytes) -> dict[str, Any]:
    return dict(json.loads(line)["envelope"])


def _envelopes(lines: list[bytes]) -> list[int]:
    return [i for i, line in enumerate(lines) if line.startswith(b'{"chain"')]


def _verify(path: Path, public: Path) -> Any:
    return invoke("replay", path, "--verify", "-q", "--public-key", public)


def _tampered(path: Path, public: Path, *said: str) -> str:
    result = _verify(path, public)
    clean_exit(result, TAMPERED)
    out = flat(result.stdout)
    assert "TAMPERED" in out and "different" not in out, "named before any decision is replayed"
    for text in said:
        assert text in out, (text, out)
    return out


def _end(lines: list[bytes]) -> list[bytes]:
    """The end line made again to count what is left (what a careful forger does)."""
    return [*lines[:-1], b'{"muster_log_end":{"events":%d}}\n' % len(_envelopes(lines))]


def _write(lines: list[bytes], path: Path) -> Path:
    path.write_bytes(b"".join(lines))
    return path


def test_the_kafka_export_is_chained_signed_and_verifies_with_the_public_key(signed_export: Any) -> None:
    out, public, _ = signed_export
    header = LogFile(out).header
    assert (header.muster_log, header.origin, header.replay_order) == (2, "kafka", True)
    result = _verify(out, public)
    clean_exit(result, 0)
    said = flat(result.stdout)
    assert "chain OK" in said and "checked against the given public key" in said and ", 0 different" in said
    assert "not yet signed" not in said, "the projector signed the log to its end"


def test_an_edited_input_line_is_named(signed_export: Any) -> None:
    out, public, folder = signed_export
    lines = _lines(out)
    i = next(i for i in _envelopes(lines) if _envelope(lines[i])["type"] == "ObjectChanged")
    lines[i] = lines[i].replace(b'"change":"Added"', b'"change":"Updated"', 1)
    _tampered(_write(lines, folder / "edited.jsonl"), public, f"line {i + 1}:", "edited")


def test_a_dropped_line_is_named_and_so_is_one_dropped_and_chained_again(signed_export: Any) -> None:
    out, public, folder = signed_export
    lines = _lines(out)
    i = _envelopes(lines)[len(_envelopes(lines)) // 2]
    dropped = _end([*lines[:i], *lines[i + 1:]])
    _tampered(_write(dropped, folder / "dropped.jsonl"), public, "deleted")
    # the forger's next step: every place after it moved down one and the chain made again over the bytes
    gone = json.loads(lines[i])["at"][1]
    links: dict[int, bytes] = {}
    places = {}
    for j in _envelopes(dropped):
        o = json.loads(dropped[j])["at"][1]
        places[j] = o - 1 if o > gone else o
    for j in sorted(places, key=places.__getitem__):
        o, raw = places[j], dropped[j][dropped[j].index(b',"envelope":') + len(b',"envelope":'):-2]
        links[o] = link(links[o - 1] if o else bytes(32), raw)
        dropped[j] = b'{"chain":"%s","at":[0,%d],"envelope":%s}\n' % (links[o].hex().encode(), o, raw)
    _tampered(_write(dropped, folder / "rechained.jsonl"), public, "rewritten and re-chained")


def test_two_swapped_lines_are_named(signed_export: Any) -> None:
    out, public, folder = signed_export
    lines = _lines(out)
    rows = _envelopes(lines)
    # two decisions of one service: its outputs stand in the order it made them, which the places say
    queue = [i for i in rows if _envelope(lines[i])["source"] == "queue"]
    a, b = queue[0], queue[1]
    swapped = list(lines)
    swapped[a], swapped[b] = lines[b], lines[a]
    _tampered(_write(swapped, folder / "one-producer.jsonl"), public, f"line {b + 1}:", "reordered")
    # a decision before the input it answers (two producers): every byte is authentic, so the chain holds,
    # and the replay names the decision no service has derived yet
    ids = {_envelope(lines[i])["id"]: i for i in rows}
    effect = next(i for i in rows if ids.get(_envelope(lines[i])["causation_id"], -1) == i - 1
                  and _envelope(lines[i - 1])["source"] != _envelope(lines[i])["source"])
    swapped = list(lines)
    swapped[effect - 1], swapped[effect] = lines[effect], lines[effect - 1]
    result = _verify(_write(swapped, folder / "two-producers.jsonl"), public)
    clean_exit(result, DIVERGED)
    said = flat(result.stdout)
    assert "chain OK" in said and _envelope(lines[effect])["id"] in said


def test_muster_run_projector_sends_its_key_and_signed_header_to_the_checkpoints_topic(
        kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    """The key and header records are what a Kafka export verifies the checkpoints by: the projector
    ``muster run`` makes (``--signing-key``, ``--policy``) signs them with the app's own writer, which
    publishes them."""
    from shared.cli.run import _projector, _Signing
    from shared.kernel.policy import Policy
    from shared.runtime.bus.app import ensure_topics
    from tests.integration.test_bus_service import read_until

    config = BusConfig(kafka_bootstrap, prefix=topic_prefix)
    asyncio.run(ensure_topics(config))
    signer = Signer.generate()
    key = tmp_path / "audit.key"
    key.write_bytes(signer.pem())
    policy = tmp_path / "policy.json"
    policy.write_text(Policy().model_dump_json())
    worker = _projector(config, Policy(), policy, f"sqlite:///{tmp_path / 'h.db'}", None, lambda: None,
                        signing=_Signing(key, None, 10, 0.2))
    with running(config, lambda: worker.app):
        records = read_until(config, config.topics.checkpoints, lambda rs: len(rs) >= 2)
    signed = [json.loads(r.value) for r in records]
    assert [r["kind"] for r in signed] == ["key", "header"] and signed[0]["key_id"] == signer.id
    assert signed[1]["header"]["policy"] == Policy().model_dump(mode="json")


def test_an_export_whose_inbox_order_is_not_the_topics_is_checked_in_the_order_of_its_places(
        kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    """Two producers' envelopes stand in the log topic the other way round from how a service read them
    (its inbox topic): the export lays them out in the inbox's order, so the file's order is not the
    chain's, and the file verifies with the key all the same, chain and decisions; imported into a store,
    its links are the signed ones (written in the order of the places)."""
    from shared.kernel.topology import SERVICES, destinations
    from tests.builders.audit import scenario_run
    from tests.integration.test_audit import _written

    log = scenario_run(NAME).runtime.log
    def both(i: int) -> list[str]:
        """The services that read log[i] and log[i + 1]."""
        return sorted(set(destinations(log[i])) & set(destinations(log[i + 1])) & set(SERVICES))

    i = next(i for i in range(1, len(log) - 1) if log[i].source != log[i + 1].source
             and log[i + 1].causation_id != log[i].id and both(i))
    a, b = log[i], log[i + 1]
    service = both(i)[0]
    topic = [*log[:i], b, a, *log[i + 2:]]
    config = _written(kafka_bootstrap, topic_prefix, [(f"{topic_prefix}events", env) for env in topic]
                      + [(f"{topic_prefix}{service}", a), (f"{topic_prefix}{service}", b)])
    store = f"sqlite:///{tmp_path / 'history.db'}"
    schema.ensure(store)
    signer = Signer.generate()
    with running(config, lambda: projector_app(config, store, within=0.05, signer=signer, checkpoint_every=25,
                                               checkpoint_seconds=0.2)):
        caught_up(config, store, len(topic))
        for _ in range(60):
            if signed_to_its_end(kafka_bootstrap, topic_prefix):
                break
            asyncio.run(asyncio.sleep(1))
    public = tmp_path / "public.pem"
    public.write_text(public_pem(signer.public))
    out = tmp_path / "kafka.jsonl"
    clean_exit(invoke("log", "export", "--from", f"kafka://{kafka_bootstrap}", "--topic-prefix", topic_prefix,
                      "--out", out), 0)
    lines = _lines(out)
    places = [json.loads(lines[j])["at"][1] for j in _envelopes(lines)]
    assert places[i:i + 2] == [i + 1, i], "the inbox's order, not the topic's"
    result = _verify(out, public)
    clean_exit(result, 0)
    assert "checked against the given public key" in flat(result.stdout) and ", 0 different" in flat(result.stdout)
    # imported, the store holds the chain's order (the topic's): its export's chain and signatures hold,
    # and its decisions are said to need the inbox order, as of the projector's own store
    imported = f"sqlite:///{tmp_path / 'imported.db'}"
    clean_exit(invoke("log", "import", out, "--store", imported), 0)
    again = tmp_path / "store.jsonl"
    clean_exit(invoke("log", "export", "--store", imported, "--out", again), 0)
    assert check(LogFile(again), [signer.public]).envelopes == len(topic)
    one_line_error(invoke("replay", imported, "--verify", "-q"), CANNOT_REPRODUCE, "each service's inbox order")
