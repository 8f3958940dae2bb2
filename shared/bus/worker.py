"""A service's inbox loop, without the framework that feeds it (``app.py`` wires it into Faust).

Per batch of records (``InboxWorker.process_batch``), record by record:

    1. decode; a record that is no envelope goes to the dead-letter topic, counted, and is skipped
    2. ordering: arrival (now), or held until the driver's ``Release`` (``sequencing.py``)
    3. ``Service.handle``: dedupe by id, the pure core, outputs enveloped with derived ids
    4. once the batch is handled: its outputs to the log topic, acknowledged, *then* to their
       inboxes (the log never holds an effect before its cause); ``TimerSet`` to the clock
    5. for each ``Release`` in the batch: ``Finished`` to the control topic, naming the highest
       log offset written (a repeated ``Release`` is answered again, handling nothing twice)

Restart: ``replay`` folds the inbox from its start up to the committed offset without sending
anything (its outputs were sent before), which rebuilds the core, the dedupe window, the held
envelopes and the pending timers; consumption then resumes at the committed offset. Whatever was
handled after the last commit is handled again and sent again with the same ids, and every
consumer drops the copies: at-least-once delivery, exactly-once effect, no Kafka transactions.
"""

from __future__ import annotations

import asyncio
import heapq
from dataclasses import dataclass
from typing import Protocol, Sequence

from shared.bus import codec
from shared.bus.codec import BadRecord, Finished, Release
from shared.bus.sequencing import Ordering
from shared.bus.topics import Topics, key
from shared.events import Envelope, TimerFired, wrap
from shared.service import Service
from shared.topology import destinations


@dataclass(frozen=True)
class Record:
    topic: str
    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]


@dataclass(frozen=True)
class Incoming:
    """A record read from the inbox, as much of it as the worker needs."""

    value: bytes | None
    headers: codec.Headers | None
    partition: int
    offset: int


def envelope_record(topics: Topics, topic: str, env: Envelope) -> Record:
    """``env`` as a record on ``topic``, keyed as ``topics.key`` says."""
    return Record(topic, key(topic, env, topics), codec.encode(env), codec.envelope_headers(env))


def dead_letter_record(topics: Topics, incoming: Incoming, *, topic: str, consumer: str, error: str) -> Record:
    """The dead-letter record for a bad record read from ``topic`` by ``consumer``."""
    return Record(topics.deadletter, topic.encode(), codec.dead_letter(
        incoming.value, incoming.headers, topic=topic, partition=incoming.partition, offset=incoming.offset,
        consumer=consumer, error=error), [])


class Producer(Protocol):
    async def send_all(self, records: Sequence[Record]) -> list[int]:
        """Send in order and wait until the broker has every one; their offsets."""
        ...


class Clock:
    """Pending timers of one service: ``TimerSet`` in, ``TimerFired`` out once due.

    Event time is wall time in the deployment, so a timer is due when the wall clock passes its
    ``at``. The envelope's id derives from the ``TimerSet``'s, so firing it twice (after a
    restart re-armed it) delivers one timer: the copy is a duplicate to the service.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, str, Envelope]] = []
        self._armed: set[tuple[str, float]] = set()
        self._seq = 0

    def arm(self, timer_set: Envelope) -> None:
        at = max(timer_set.payload.at, timer_set.occurred_at)
        marker = (timer_set.payload.key, at)
        if marker in self._armed:
            return
        self._armed.add(marker)
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, timer_set.payload.key, timer_set))

    def next_at(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def due(self, now: float) -> list[Envelope]:
        out: list[Envelope] = []
        while self._heap and self._heap[0][0] <= now:
            at, _, timer_key, cause = heapq.heappop(self._heap)
            self._armed.discard((timer_key, at))
            out.append(wrap(TimerFired(key=timer_key), source="clock", cause=cause, index=0, at=at))
        return out

    def __len__(self) -> int:
        return len(self._heap)


class InboxWorker:
    """One service behind one inbox: see the module docstring for the steps."""

    def __init__(self, service: Service, topics: Topics, ordering: Ordering, *, clock: Clock | None = None) -> None:
        self.service = service
        self.topics = topics
        self.ordering = ordering
        self.clock = clock
        """The deployment's wall clock; None under ``simulate --bus``, whose driver is the clock."""
        self.inbox = topics.inbox(service.name)
        self.dead_letters = 0
        self.replayed = 0
        self.log_high = -1
        """The highest log offset this worker has written (-1: none yet)."""
        self.wake = asyncio.Event()
        """Set when a timer was armed, so the clock task re-reads ``clock.next_at``."""

    # ------------------------------------------------------------------ restart
    def replay(self, value: bytes | None, headers: codec.Headers | None) -> None:
        """Fold one record of the inbox's past: state only, nothing sent (it was sent before)."""
        self.replayed += 1
        try:
            item = codec.decode(value, headers)
        except BadRecord:
            return  # dead-lettered when it was first read
        for out in self._handle(item):
            self._arm(out)

    # ------------------------------------------------------------------ live
    async def process(self, value: bytes | None, headers: codec.Headers | None, *, partition: int, offset: int,
                      producer: Producer) -> None:
        await self.process_batch([Incoming(value, headers, partition, offset)], producer)

    async def process_batch(self, batch: Sequence["Incoming"], producer: Producer) -> None:
        """Handle records in order, then send what they produced together: dead letters, the log,
        the routes, and a ``Finished`` for every round released in the batch. Sending a batch costs
        two round trips to the broker instead of two per record."""
        outputs: list[Envelope] = []
        letters: list[Record] = []
        rounds: list[int] = []
        for incoming in batch:
            try:
                item = codec.decode(incoming.value, incoming.headers)
                if isinstance(item, Finished):
                    raise BadRecord("a Finished reply belongs on the control topic, not in an inbox")
            except BadRecord as exc:
                self.dead_letters += 1
                letters.append(dead_letter_record(self.topics, incoming, topic=self.inbox,
                                                  consumer=self.service.name, error=str(exc)))
                continue
            outputs.extend(self._handle(item))
            if isinstance(item, Release):
                rounds.append(item.round)
        if letters:
            await producer.send_all(letters)
        await self.emit(outputs, producer)
        if rounds:
            # The highest offset ever written, not this batch's: a Release sent again (the driver
            # got no answer) is answered too, and the round's outputs lie at or below it.
            replies = []
            for number in rounds:
                body, control_headers = codec.encode_control(Finished(number, self.service.name, self.log_high))
                replies.append(Record(self.topics.control, self.service.name.encode(), body, control_headers))
            await producer.send_all(replies)

    async def emit(self, outputs: list[Envelope], producer: Producer) -> int:
        """Log first, then route; returns the last log offset written (-1 for none)."""
        if not outputs:
            return -1
        log = self.topics.log
        offsets = await producer.send_all([envelope_record(self.topics, log, env) for env in outputs])
        routed: list[Record] = []
        for env in outputs:
            for dest in destinations(env):
                if dest == "clock":
                    self._arm(env)
                else:
                    routed.append(envelope_record(self.topics, self.topics.destination(dest), env))
        if routed:
            await producer.send_all(routed)
        self.log_high = max(self.log_high, *offsets)
        return max(offsets)

    async def fire_due(self, now: float, producer: Producer) -> int:
        """Send the timers due at ``now`` into the service's own inbox (and the log); how many."""
        if self.clock is None:
            return 0
        fired = self.clock.due(now)
        if fired:
            await producer.send_all([envelope_record(self.topics, self.topics.log, env) for env in fired])
            await producer.send_all([envelope_record(self.topics, self.inbox, env) for env in fired])
        return len(fired)

    # ------------------------------------------------------------------ common
    def _handle(self, item: Envelope | Release) -> list[Envelope]:
        if isinstance(item, Release):
            ready = self.ordering.release(item)
        elif self.service.handled_before(item):
            return []  # a copy of one handled already: not even held
        else:
            ready = self.ordering.offer(item)
        return [out for env in ready for out in self.service.handle(env)]

    def _arm(self, env: Envelope) -> None:
        if self.clock is not None and env.type == "TimerSet":
            self.clock.arm(env)
            self.wake.set()
