"""``muster run projector``: the log topic into the history store.

The agent takes the log in batches (up to ``batch`` records, or what arrived within ``within``
seconds) and hands each to ``ProjectionWriter.write``, which stores the rows and the consumed
offset in one transaction and skips envelopes already stored — so a batch Faust redelivers after a
crash (its offset was not committed yet) changes nothing. The writer is synchronous SQLAlchemy:
it runs on a thread so the consumer keeps fetching meanwhile. Records that are not envelopes go
to the dead-letter topic, counted, and the batch goes on without them.
"""

from __future__ import annotations

import asyncio
import logging

import faust

from shared.bus import codec
from shared.bus.app import FaustProducer, MusterApp, base_app
from shared.bus.codec import BadRecord
from shared.bus.config import BusConfig
from shared.bus.worker import Incoming, Record, dead_letter_record
from shared.events import Envelope
from shared.store import rows
from shared.store.writer import ProjectionWriter

log = logging.getLogger("muster.projector")

CONSUMER = "projector"


def projector_app(config: BusConfig, store: str, *, batch: int = 5_000, within: float = 0.2) -> MusterApp:
    """The app behind ``muster run projector``: group ``<prefix>projector``, one agent on the log."""
    app = base_app(f"{config.prefix}projector", config)
    writer = ProjectionWriter(store, consumer=CONSUMER)
    producer = FaustProducer(app)
    topics = config.topics
    app.muster_writer = writer  # type: ignore[attr-defined]

    @app.agent(app.topic(topics.log, key_type=bytes, value_type=bytes), name="projector-log", concurrency=1)
    async def project(stream: faust.StreamT) -> None:
        async for events in stream.take_events(batch, within=within):
            items: list[rows.Located] = []
            bad: list[Record] = []
            for event in events:
                m = event.message
                try:
                    env = codec.decode(m.value, list(m.headers or ()))
                    if not isinstance(env, Envelope):
                        raise BadRecord("a control message does not belong in the log")
                except BadRecord as exc:
                    bad.append(dead_letter_record(topics, Incoming(m.value, list(m.headers or ()), m.partition,
                                                                   m.offset), topic=m.topic, consumer=CONSUMER,
                                                  error=str(exc)))
                    continue
                items.append(rows.Located(env, m.topic, m.partition, m.offset))
            if bad:
                await producer.send_all(bad)
                log.warning("projector: %d record(s) of the log were not envelopes: dead-lettered", len(bad))
            if items:
                await asyncio.to_thread(writer.write, items)

    return app
