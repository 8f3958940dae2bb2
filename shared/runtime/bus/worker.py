"""A service's inbox loop, without the framework that feeds it (``app.py`` wires it into Faust).

Per batch of records (``InboxWorker.process_batch``), record by record:

    1. decode; a record that is no envelope goes to the dead-letter topic, counted, and is skipped
    2. ordering: arrival (now), or held until the driver's ``Release`` (``sequencing.py``)
    3. ``Service.handle``: dedupe by id, the pure core, outputs enveloped with derived ids; a core
       that raises rejects what the envelope concerns (``shared.kernel.faults``) and the record goes to
       the dead-letter topic with the error, counted (``failed``), and the worker goes on
    4. once the batch is handled: its outputs to the log topic, acknowledged, *then* to their
       inboxes (the log never holds an effect before its cause); ``TimerSet`` to the clock, and
       a timer already due (a queue cycle "now") fires with the batch: its ``TimerFired`` is logged
       right after its ``TimerSet``, its copy for the service's own inbox in the same request, and
       when that copy lands right after the batch (the next record the worker would read) it is
       handled at once rather than fetched back
    5. for each ``Release`` in the batch: ``Finished`` to the control topic, naming the highest
       log offset written (a repeated ``Release`` is answered again, handling nothing twice)

Restart: ``replay`` folds the inbox from the latest snapshot's offset (``snapshot.py``; from its
start without one) up to the committed offset without sending anything (its outputs were sent
before), which rebuilds the core, the dedupe window, the held envelopes and the pending timers (a
timer whose ``TimerFired`` is read back is disarmed); consumption then resumes at the committed offset. Whatever was
handled after the last commit is handled again and sent again with the same ids, and every
consumer drops the copies: at-least-once delivery, exactly-once effect, no Kafka transactions.
A record the core failed on is folded again too, in its place (the state it left is part of the
state that followed), raises again and is rejected again, but nothing is sent: its dead letter
went out before its offset could be committed, so it is dead-lettered once.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

from shared.kernel.events import Envelope, TimerFired, wrap
from shared.kernel.topology import destinations
from shared.runtime.bus import codec
from shared.runtime.bus.codec import BadRecord, Finished, Release
from shared.runtime.bus.sequencing import Ordering
from shared.runtime.bus.topics import Topics, key
from shared.runtime.clock import Timers
from shared.runtime.service import Service

if TYPE_CHECKING:
    from shared.observability.tracing.live import HopTracer

log = logging.getLogger("muster.bus")


def chain(digest: bytes, value: bytes) -> bytes:
    """The next link of an output digest (``InboxWorker.digest``): ``value`` is one output as encoded."""
    return hashlib.blake2b(digest + value, digest_size=16).digest()


Watcher = Callable[[Envelope, list[Envelope]], None]
"""Sees each envelope the service handles with its outputs, live and in a replay (a metrics fold)."""


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


def envelope_records(topics: Topics, env: Envelope, targets: Sequence[str]) -> list[Record]:
    """``env`` as a record on each of ``targets``, encoded once."""
    value, headers = codec.encode(env), codec.envelope_headers(env)
    return [Record(topic, key(topic, env, topics), value, headers) for topic in targets]


def logged_and_routed(topics: Topics, env: Envelope) -> tuple[Record, list[Record], bool]:
    """``env`` as its log record, its records for the inboxes it is routed to (encoded once), and
    whether it is also for the clock (a ``TimerSet``, which no topic carries: ``Clock``). Send the
    log records first: the log never holds an effect before its cause."""
    targets, timed = [topics.log], False
    for dest in destinations(env):
        if dest == "clock":
            timed = True
        else:
            targets.append(topics.destination(dest))
    first, *rest = envelope_records(topics, env, targets)
    return first, rest, timed


def dead_letter_record(topics: Topics, incoming: Incoming, *, topic: str, consumer: str, error: str) -> Record:
    """The dead-letter record for a bad record read from ``topic`` by ``consumer``."""
    return Record(topics.deadletter, topic.encode(), codec.dead_letter(
        incoming.value, incoming.headers, topic=topic, partition=incoming.partition, offset=incoming.offset,
        consumer=consumer, error=error), [])


class Producer(Protocol):
    async def send_all(self, records: Sequence[Record]) -> list[int]:
        """Send in order and wait until the broker has every one; their offsets."""
        ...


_OWN = ""
"""The target of every timer of a worker's ``Clock``: its service's (a ``TimerFired`` names no service)."""


class Clock:
    """Pending timers of one service: ``TimerSet`` in, ``TimerFired`` out once due.

    Event time is wall time in the deployment, so a timer is due when the wall clock passes its
    ``at``; its ``TimerFired`` is stamped when it fired (``now``, never before ``at``) and names the
    instant it was set for, which is how the core knows it. The envelope's id derives from the ``TimerSet``'s, so firing it twice (after a
    restart re-armed it) delivers one timer: the copy is a duplicate to the service.
    """

    def __init__(self, now: Callable[[], float] = time.time) -> None:
        self.now = now
        """The wall clock (a fixed one in tests)."""
        self._timers = Timers()
        """One service's timers (``shared.runtime.clock``): their target is that service, unnamed (``_OWN``)."""
        self._unsettled: dict[tuple[str, float], Envelope] = {}
        """Timers fired whose ``TimerFired`` was not read back from the inbox yet: a snapshot keeps
        them, so a crash before the copy landed fires them again (``shared.runtime.bus.snapshot``)."""

    def arm(self, timer_set: Envelope) -> None:
        """Arm the timer of ``timer_set``, set at its ``occurred_at`` (``shared.runtime.clock``)."""
        self._timers.arm(_OWN, timer_set.payload.key, timer_set.payload.at, timer_set.occurred_at, cause=timer_set)

    def disarm(self, fired: Envelope) -> None:
        """A timer whose ``TimerFired`` the inbox holds (read live or in a replay): it fired, and
        must not fire again after a restart, long after the dedupe window forgot its id."""
        key, at = fired.payload.key, fired.payload.due(fired.occurred_at)
        self._timers.disarm(_OWN, key, at)
        self._unsettled.pop((key, at), None)

    def state(self) -> list[Envelope]:
        """The ``TimerSet``s still to fire or fired unsettled, in arming order: all a snapshot needs."""
        return [timer.cause for timer in self._timers.pending()] + list(self._unsettled.values())

    def load(self, timer_sets: list[Envelope]) -> None:
        """Arm what ``state`` returned (on a fresh clock)."""
        self._timers, self._unsettled = Timers(), {}
        for timer_set in timer_sets:
            self.arm(timer_set)

    def next_at(self) -> float | None:
        return self._timers.next_at()

    def due(self, now: float) -> list[Envelope]:
        out: list[Envelope] = []
        while (timer := self._timers.pop(now)) is not None:
            self._unsettled[(timer.key, timer.at)] = timer.cause
            out.append(wrap(TimerFired(key=timer.key, at=timer.at), source="clock", cause=timer.cause, index=0,
                            at=max(timer.at, now)))
        return out

    def __len__(self) -> int:
        return len(self._timers)


_HAND_OVER_ROUNDS = 16
"""How many rounds of timers fired and handed over at once one batch may take (see ``_emit``)."""


class InboxWorker:
    """One service behind one inbox: see the module docstring for the steps."""

    def __init__(self, service: Service, topics: Topics, ordering: Ordering, *, clock: Clock | None = None,
                 tracer: "HopTracer | None" = None) -> None:
        self.service = service
        self.topics = topics
        self.ordering = ordering
        self.clock = clock
        """The deployment's wall clock; None under ``simulate --bus``, whose driver is the clock."""
        self.inbox = topics.inbox(service.name)
        self.dead_letters = 0
        self.failed = 0
        """Records the core raised on (dead-lettered, their object rejected: ``shared.kernel.faults``)."""
        self.replayed = 0
        self.log_high = -1
        """The highest log offset this worker has written (-1: none yet)."""
        self.wake = asyncio.Event()
        """Set when a timer was armed, so the clock task re-reads ``clock.next_at``."""
        self.tracer = tracer
        """Sends a span per hop handled live (tracing on; ``shared.observability.tracing.live``)."""
        self.watchers: list[Watcher] = []
        self.last_handled: str | None = None
        """The id of the last inbox envelope handed to the service, live or in a replay: where a
        restart's ``PolicyApplied`` goes in its inbox's order (``shared.runtime.bus.app.InboxReader._announce``)."""
        self.digest: bytes | None = None
        """With snapshots on, a hash chained over every output handled (``snapshot.chain``): what a
        tail replay after loading a snapshot must reproduce. None: not kept."""

    # ------------------------------------------------------------------ restart
    def replay(self, value: bytes | None, headers: codec.Headers | None) -> None:
        """Fold one record of the inbox's past: state only, nothing sent (it was sent before)."""
        self.replayed += 1
        try:
            item = codec.decode(value, headers)
        except BadRecord:
            return  # dead-lettered when it was first read
        for out in self._handle(item, live=False):
            self._arm(out)
            if self.digest is not None:
                self.digest = chain(self.digest, codec.encode(out))
        self.service.take_faults()  # dead-lettered when it was first handled

    # ------------------------------------------------------------------ live
    async def process(self, value: bytes | None, headers: codec.Headers | None, *, partition: int, offset: int,
                      producer: Producer) -> None:
        await self.process_batch([Incoming(value, headers, partition, offset)], producer)

    async def process_batch(self, batch: Sequence["Incoming"], producer: Producer) -> int | None:
        """Handle records in order, then send what they produced together: dead letters, the log,
        the routes, and a ``Finished`` for every round released in the batch. Sending a batch costs
        two round trips to the broker instead of two per record. Returns the highest inbox offset
        now handled: the batch's last, or past it when timers fired into the inbox were handed
        over at once (see ``_emit``); None for an empty batch."""
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
            if self.tracer is not None and isinstance(item, Envelope):
                self.tracer.read(item.id, incoming.partition, incoming.offset)
            outputs.extend(self._handle(item))
            for fault in self.service.take_faults():
                letters.append(self._failed(incoming, fault.envelope if isinstance(item, Release) else None,
                                            fault.error))
            if isinstance(item, Release):
                rounds.append(item.round)
        if letters:
            await producer.send_all(letters)
        _, through = await self._emit(outputs, producer, batch[-1].offset if batch else None)
        if rounds:
            # The highest offset ever written, not this batch's: a Release sent again (the driver
            # got no answer) is answered too, and the round's outputs lie at or below it.
            replies = []
            for number in rounds:
                body, control_headers = codec.encode_control(Finished(number, self.service.name, self.log_high))
                replies.append(Record(self.topics.control, self.service.name.encode(), body, control_headers))
            await producer.send_all(replies)
        return through

    async def emit(self, outputs: list[Envelope], producer: Producer) -> int:
        """Log first, then route; returns the last log offset written (-1 for none). See ``_emit``."""
        return (await self._emit(outputs, producer, None))[0]

    async def _emit(self, outputs: list[Envelope], producer: Producer, after: int | None) -> tuple[int, int | None]:
        """Log first, then route: the last log offset written (-1 for none), and the highest inbox
        offset handled (``after``, the last record handled before, unless timers came after it).

        ``TimerSet`` goes to the clock; the timers due by now fire here rather than in the clock's
        own task: each ``TimerFired`` is logged in the same request as (after) the ``TimerSet``
        that caused it, and its copy for this service's own inbox rides in that request too. That
        copy's effects can only be this service's, logged once it handles the copy, which it does
        after this request is acknowledged: the log stays causal.

        When the copies land right after ``after`` (nothing else came into the inbox meanwhile),
        they are the very next records this service would read: it hands them over at once, in
        that order, instead of fetching them back (the reader then skips them), and logs their
        outputs in turn; the routes of every round go out together once the log has them all. So
        a queue cycle "now" costs one more log write, not two writes and a fetch more; the inbox
        holds the same records in the same order, so a replay folds exactly what was handled."""
        topics = self.topics
        routed: list[Record] = []
        log_last = -1
        for _ in range(_HAND_OVER_ROUNDS):
            if not outputs:
                break
            logged: list[Record] = []
            armed = False
            for env in outputs:
                first, rest, timed = logged_and_routed(topics, env)
                if self.digest is not None:
                    self.digest = chain(self.digest, first.value)
                if timed:
                    self._arm(env)
                    armed = True
                logged.append(first)
                routed.extend(rest)
            fired = self.clock.due(self.clock.now()) if armed and self.clock is not None else []
            own = [envelope_records(topics, env, (topics.log, self.inbox)) for env in fired]
            logged.extend(on_log for on_log, _ in own)
            offsets = await producer.send_all(logged + [to_inbox for _, to_inbox in own])
            log_last = max(log_last, *offsets[:len(logged)])
            landed = offsets[len(logged):]
            outputs = []
            if fired and after is not None and landed == list(range(after + 1, after + 1 + len(landed))):
                after = landed[-1]
                outputs = [out for env in fired for out in self._handle(env)]
        else:
            if outputs:  # a core that keeps setting timers due at once: the rest goes out unhanded
                log_last = max(log_last, await self.emit(outputs, producer))
        if routed:
            await producer.send_all(routed)
        self.log_high = max(self.log_high, log_last)
        return log_last, after

    async def fire_due(self, now: float, producer: Producer) -> int:
        """Send the timers due at ``now`` into the service's own inbox (and the log); how many."""
        if self.clock is None:
            return 0
        fired = self.clock.due(now)
        if fired:
            records = [envelope_records(self.topics, env, (self.topics.log, self.inbox)) for env in fired]
            await producer.send_all([logged for logged, _ in records])
            await producer.send_all([routed for _, routed in records])
        return len(fired)

    def _failed(self, incoming: Incoming, held: Envelope | None, error: str) -> Record:
        """The dead letter of a record the core raised on: the record as read, or, when a round's
        ``Release`` handed over the ``held`` envelope that failed (``simulate --bus``), that
        envelope, located where the ``Release`` was read."""
        self.failed += 1
        self.dead_letters += 1
        log.error("%s: record at %s[%d] offset %d dead-lettered: %s", self.service.name, self.inbox,
                  incoming.partition, incoming.offset, error)
        if held is not None:
            incoming = Incoming(codec.encode(held), codec.envelope_headers(held), incoming.partition, incoming.offset)
        return dead_letter_record(self.topics, incoming, topic=self.inbox, consumer=self.service.name, error=error)

    # ------------------------------------------------------------------ common
    def _handle(self, item: Envelope | Release, *, live: bool = True) -> list[Envelope]:
        if self.clock is not None and isinstance(item, Envelope) and item.type == "TimerFired":
            self.clock.disarm(item)
        if isinstance(item, Release):
            ready = self.ordering.release(item)
        elif self.service.handled_before(item):
            return []  # a copy of one handled already: not even held
        else:
            ready = self.ordering.offer(item)
        if ready:
            self.last_handled = ready[-1].id
        if not self.watchers and (self.tracer is None or not live):
            return [out for env in ready for out in self.service.handle(env)]
        outputs: list[Envelope] = []
        tracer = self.tracer if live else None
        for env in ready:
            started = time.time() if tracer is not None else 0.0
            made = self.service.handle(env)
            for watch in self.watchers:
                try:
                    watch(env, made)
                except Exception:  # noqa: BLE001 - a metric that fails must not stop the service
                    log.exception("%s: a watcher failed on %s %s", self.service.name, env.type, env.id)
            if tracer is not None:
                tracer.handled(env, made, started, time.time())
            outputs.extend(made)
        return outputs

    def _arm(self, env: Envelope) -> None:
        if self.clock is not None and env.type == "TimerSet":
            self.clock.arm(env)
            self.wake.set()
