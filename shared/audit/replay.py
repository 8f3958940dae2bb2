"""Re-deriving a log's decisions: every service's inbox rebuilt from the log, the cores run again.

Why the log is enough: each service's state and outputs are a fold over its one inbox
(ARCHITECTURE.md, principle 2), and the inbox of a service is the log's envelopes routed to it
(``shared.kernel.topology.destinations``; a ``TimerFired`` goes to the service whose ``TimerSet`` it
answers) in log order — the embedded runtime publishes every envelope to the log and to its
inboxes in one step, breadth first, and a log read from Kafka is first put in an order that keeps
every inbox's own (``shared.audit.kafka``). So a replay reads the log once, front to back, and hands
each envelope to the services it was routed to *as soon as it is read*: a decision is always
written after its cause, so by the time the log shows a service's decision, the replay has derived
it already, and only has to compare the two.

``replay`` is that loop as a generator of ``Step`` (an envelope of the log and what each service
derived from it), so other readers can walk a replay too (``muster replay --trace`` builds spans
from it); ``verify`` drives it to the end and sums it up. A decision is compared as bytes: the
recorded line against ``shared.kernel.events.to_json`` of the derived envelope — ids, times, reasons,
everything. Services' outputs come out in the order they handled their inputs (one producer per
service), so each service's pending derivations form a queue, and the first recorded decision that
is not the head of its service's queue is where the log and the cores part:

    differs      the same id, other bytes (a decision altered)
    missing      the service derived another decision first (one dropped, or moved later)
    unexpected   no service derived it: a duplicate, moved before its cause, or made up
    unfinished   the log ends while derived decisions are still owed (dropped at the end)

The policy comes from the log: a ``PolicyApplied`` says which services decide with which policy from
there on (the embedded runtime writes one for all four first; a Kafka service writes its own when it
starts with a policy its log does not show, laid out right after the last input it had handled,
``shared.audit.kafka``). A log made before that event existed starts with its header's policy. A
service that takes another policy mid-way is rebuilt as the live one is on such a restart (its
snapshot, made under another policy, is refused, ``shared.runtime.bus.snapshot``): a fresh core under the new
policy folds its whole inbox so far, nothing compared, and decides from there. ``--policy``
(``override``) decides under one policy throughout instead, and each recorded one it differs from is
said first (``notes``). A divergence names what it can tell apart (``blame``): when the recorded code
and policy are this replay's, the log was altered; when either differs, that may be all there is to it.
"""

from __future__ import annotations

import gc
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, NamedTuple

from pydantic import ValidationError

from shared.audit.chain import ID_SPAN, recorded_before
from shared.audit.errors import CannotReproduce
from shared.audit.logfile import LogSource, Record, decode
from shared.kernel.dedupe import DEDUPE_WINDOW
from shared.kernel.events import Envelope, PolicyApplied, to_json
from shared.kernel.policy import Policy
from shared.kernel.topology import ROUTES, SERVICES, destinations
from shared.kernel.validation import first_errors
from shared.runtime.build import code_digest, muster_version
from shared.runtime.clock import Instant, armed_as
from shared.runtime.cores import CORE_CLASSES
from shared.runtime.service import Service

_DECIDERS = frozenset(SERVICES)
COLLECT_EVERY = 1 << 20
"""Envelopes between the young collections a replay makes while the collector waits (``Replayer.run``)."""


class Router:
    """Which services' inboxes an envelope of the log was in: ``shared.kernel.topology.destinations``, and a
    ``TimerFired`` to the service whose ``TimerSet`` it answers (the log holds both, in that order).

    What it remembers is bounded by the timers pending, not by the log's length: a ``TimerSet`` is
    kept until a ``TimerFired`` answers it, then among the last ``window`` settled ones (a copy of
    a ``TimerFired`` — a restarted clock fires again, under the same id — still goes to its service,
    whose dedupe window drops it). A clock arms one timer per service, key and instant
    (``shared.runtime.clock.armed_as``), so a second ``TimerSet`` of a pending one's instant never
    fires: it settles with the one that does."""

    def __init__(self, window: int = DEDUPE_WINDOW) -> None:
        self.window = window
        self._pending: dict[str, tuple[str, Instant]] = {}
        """``TimerSet`` id -> (its source, its instant: source, key, when it fires), until answered."""
        self._instants: dict[Instant, list[str]] = {}
        """Instant -> the ids of the pending ``TimerSet``s for it (one fires; the others are copies)."""
        self._settled: dict[str, str] = {}
        """Answered ``TimerSet`` id -> its source, the last ``window`` (``_settled_order``, oldest first)."""
        self._settled_order: deque[str] = deque()

    def targets(self, env: Envelope) -> tuple[str, ...] | None:
        """The services (and ``cluster``) ``env`` was delivered to; None for a timer no service set.
        A ``TimerSet`` (for the clock) is remembered, and delivered to no service: ``()``."""
        targets = destinations(env)
        if targets:
            if targets is _CLOCK:
                self.timer_set(env)
                return ()
            return targets
        if env.type != "TimerFired":
            return targets
        timer = env.causation_id or ""
        pending = self._pending.pop(timer, None)
        if pending is None:
            owner = self._settled.get(timer)
            return None if owner is None else (owner,)
        owner, instant = pending
        self._settle(instant)
        return (owner,)

    def timer_set(self, env: Envelope) -> None:
        """``env`` (a ``TimerSet``) is its source's: the ``TimerFired`` that answers it goes there."""
        instant = armed_as(env)
        self._pending[env.id] = (env.source, instant)
        ids = self._instants.get(instant)
        if ids is None:
            self._instants[instant] = [env.id]
        else:
            ids.append(env.id)

    def _settle(self, instant: Instant) -> None:
        """The timer of ``instant`` fired: its ``TimerSet``s (the one answered and any copies) settle."""
        pending, settled, order = self._pending, self._settled, self._settled_order
        for timer in self._instants.pop(instant, ()):
            pending.pop(timer, None)
            settled[timer] = instant[0]
            order.append(timer)
        while len(order) > self.window:
            settled.pop(order.popleft(), None)

    def __len__(self) -> int:
        """Timers remembered, pending and settled (bounded: see the class docstring)."""
        return len(self._pending) + len(self._settled)


_CLOCK = ROUTES["TimerSet"]


def inbox(envelopes: Iterable[Envelope], service: str) -> Iterator[Envelope]:
    """The envelopes of a log that were in ``service``'s inbox, in its order."""
    router = Router()
    for env in envelopes:
        if service in (router.targets(env) or ()):
            yield env


class Derived(NamedTuple):
    """A decision a service derived and the log still owes (a tuple: one is made per decision, and a
    dataclass's ``__init__`` cost more than the comparison it waits for)."""

    service: str
    envelope: Envelope
    data: bytes
    cause: Envelope
    cause_where: str
    seq: int
    """Order of derivation (the earliest owed decision is named when the log ends)."""


_derived = _step = tuple.__new__


class Step(NamedTuple):
    """One envelope of the log, where it was, and what each service it was delivered to derived from it
    (a tuple made without a Python frame: one per envelope, most dropped at once by ``verify``)."""

    where: str
    envelope: Envelope
    outputs: list[tuple[str, list[Envelope]]]


@dataclass
class Divergence(Exception):
    """Where the log and the re-derived decisions part (see the module docstring for ``kind``)."""

    kind: str
    where: str
    """Where in the log: the recorded decision's place, or the end of the log."""
    message: str
    recorded: Envelope | None = None
    recorded_raw: bytes | None = None
    derived: Derived | None = None
    cause: Envelope | None = None
    """The input the decision answers (the derived one's, else the recorded one's if in the log)."""
    cause_where: str = ""
    blame: str = ""
    """What the replay can tell about why (``Replayer.blame``): an altered log, or other code or policy."""

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


@dataclass
class Tally:
    """What a replay went through (the summary ``--verify`` prints)."""

    events: int = 0
    derived: int = 0
    identical: int = 0
    different: int = 0
    delivered: int = 0
    """Envelope deliveries to a service (an envelope routed to two services counts twice)."""
    wall_seconds: float = 0.0

    @property
    def events_per_second(self) -> float:
        return self.events / self.wall_seconds if self.wall_seconds else 0.0


class Replayer:
    """The four services, fed a log envelope by envelope, each decision checked as it comes."""

    def __init__(self, policy: Policy | None, *, check: bool = True, override: Policy | None = None,
                 note: Callable[[str], None] | None = None) -> None:
        """``policy``: what the log starts with (its header's; None: the log must name one, in a
        ``PolicyApplied``, before any service is handed an envelope). ``override`` (``--policy``):
        decide under it throughout, whatever the log records. ``note`` hears each policy line."""
        self.override = override
        start = override or policy
        self.policies: dict[str, Policy | None] = {name: start for name in CORE_CLASSES}
        """The policy each service decides with now."""
        self.services = {name: Service(CORE_CLASSES[name](start or Policy())) for name in CORE_CLASSES}
        self._unknown = set() if start is not None else set(CORE_CLASSES)
        """Services with no policy yet: an envelope for one cannot be replayed (``CannotReproduce``)."""
        self.recorded: dict[str, PolicyApplied] = {}
        """The latest ``PolicyApplied`` the log showed for each service (what ``blame`` compares)."""
        self.notes: list[str] = []
        """What was said about the policy, in order (a switch, an override that differs)."""
        self._note = note
        self.check = check
        self.tally = Tally()
        self._owed: dict[str, deque[Derived]] = {name: deque() for name in self.services}
        self._by_id: dict[str, Derived] = {}
        self.router = Router()
        self._source: LogSource | None = None
        """The log ``run`` reads: read again, up to a divergence, to tell a duplicate (``_unexpected``)."""

    def step(self, record: Record) -> Step:
        """Read one record: check it if it is a decision, then deliver it to its services.

        A recorded decision is looked up by the id at the start of its line (muster's encoder writes
        ``id`` first) among those derived and owed; found, it is compared as bytes and the derived
        envelope goes on, so a decision is never decoded. Anything else is decoded."""
        where, raw = record
        tally = self.tally
        tally.events += 1
        check = self.check
        derived = self._by_id.pop(raw[ID_SPAN].decode("ascii", "replace"), None) \
            if check and raw.startswith(b'{"id":"') else None
        if derived is not None:
            owed = self._owed[derived.service]
            if owed[0] is not derived or derived.data != raw:
                raise self._mismatch(derived, record)
            owed.popleft()
            tally.identical += 1
            env = derived.envelope
            targets = self.router.targets(env)
        else:
            env = decode(record)
            if env.type == "PolicyApplied":  # for no inbox: it sets what the cores decide with
                self.applied(env, where)
                return _step(Step, (where, env, []))
            if check:
                if env.causation_id in self._by_id:
                    raise self._before_cause(env, record)
                if env.source in _DECIDERS:
                    raise self._unexpected(env, record)
            targets = self.router.targets(env)
            if targets is None:
                if check:
                    raise Divergence("unexpected", where, f"a timer fired ({env.payload.key}) that no service set "
                                     f"earlier in the log (its TimerSet {env.causation_id} is missing)", recorded=env)
                return _step(Step, (where, env, []))
        outputs: list[tuple[str, list[Envelope]]] = []
        services = self.services
        for target in targets:
            service = services.get(target)
            if service is None:  # "cluster": the Kubernetes side, not a core
                continue
            if self._unknown and target in self._unknown:
                raise CannotReproduce(f"{where}: the log gives {target} an envelope before it records the policy "
                                      f"{target} decided with (no PolicyApplied, and no policy in its header): pass "
                                      "the services' policy with --policy")
            tally.delivered += 1
            outs = service.handle(env)
            if outs:
                outputs.append((target, outs))
                if check:
                    self._owe(target, outs, env, where)
        return _step(Step, (where, env, outputs))

    def applied(self, env: Envelope, where: str) -> None:
        """A ``PolicyApplied``: its services decide with its policy from here (see the module
        docstring); the same policy again changes nothing (a restart that could not tell)."""
        p = env.payload
        try:
            policy = Policy.from_mapping(p.policy)
        except ValidationError as exc:
            raise CannotReproduce(f"{where}: the log's policy is not one this muster reads: "
                                  f"{first_errors(exc, 1)}") from None
        names = [name for name in p.services if name in self.services]
        for name in names:
            self.recorded[name] = p
        who = ", ".join(names)
        if self.override is not None:
            differs = self.override.differences(policy)
            if differs and names:
                self._say(f"policy differs: {who} decided with policy {p.policy_digest} (recorded at {where}); this "
                          f"replay decides under --policy {self.override.digest()}: " + "; ".join(differs))
            return
        changed: list[str] = []
        for name in names:
            current = self.policies[name]
            self._unknown.discard(name)
            if current == policy:
                continue
            if current is not None and self.services[name].handled:
                changed.append(f"{name} ({'; '.join(policy.differences(current))})")
            self._switch(name, policy, where)
        if changed:
            self._say(f"policy changes at {where}: from here with policy {p.policy_digest}: " + ", ".join(changed))

    def _say(self, text: str) -> None:
        self.notes.append(text)
        if self._note is not None:
            self._note(text)

    def _switch(self, name: str, policy: Policy, where: str) -> None:
        """``name`` restarted under ``policy``: a fresh core folds every envelope of its inbox so far
        (as the live service rebuilds when its snapshot's policy is not its own), nothing compared."""
        fresh = Service(CORE_CLASSES[name](policy))
        old = self.services[name]
        self.policies[name] = policy
        self.services[name] = fresh
        if not old.handled:
            return
        source = self._source
        if source is None:
            raise CannotReproduce(f"{where}: {name} takes another policy mid-way; rebuilding it needs the log "
                                  "from its start (replay it with Replayer.run)")
        router, n = Router(self.router.window), self.tally.events - 1  # the records before this one
        for i, record in enumerate(source.records()):
            if i >= n:
                break
            env = decode(record)
            if env.type != "PolicyApplied" and name in (router.targets(env) or ()):
                fresh.handle(env)
        fresh.take_faults()

    def blame(self, service: str | None) -> str:
        """Why a decision of ``service`` may not be reproduced, as far as the log can tell: the code or
        policy differs from the recorded (a new muster, a --policy), or neither does and the log was altered."""
        recorded = self.recorded.get(service or "")
        if recorded is None:
            return ("the log records no PolicyApplied for this service (a log made before muster wrote one): the "
                    "log was altered, or the code or policy differs")
        ours = code_digest()
        if self.override is not None:
            differs = self.override.differences(Policy.from_mapping(recorded.policy))
            if differs:
                return ("the code or policy differs: this replay decides under --policy, not the policy recorded ("
                        + "; ".join(differs) + "), so this need not be an altered log")
        if recorded.code_digest != ours:
            return (f"the code or policy differs: the log was made by muster {recorded.muster_version} (code "
                    f"{recorded.code_digest}), this is muster {muster_version()} (code {ours}), so this need not be "
                    "an altered log")
        return "the log was altered: this is the code and the policy the log records"

    def _owe(self, target: str, outs: list[Envelope], cause: Envelope, where: str) -> None:
        """``target``'s outputs from ``cause``: owed by the log, in order, each as the bytes to compare."""
        owed = self._owed[target]
        by_id = self._by_id
        seq = self.tally.derived
        for out in outs:
            seq += 1
            derived = _derived(Derived, (target, out, to_json(out), cause, where, seq))  # ``Derived(...)`` without its frame
            owed.append(derived)
            by_id[out.id] = derived
        self.tally.derived = seq

    def _mismatch(self, derived: Derived, record: Record) -> Divergence:
        """A recorded decision some service derived, but not next (``missing``) or not byte for byte (``differs``)."""
        owed = self._owed[derived.service]
        recorded = decode(record)
        if owed[0] is not derived:
            first = owed[0]
            return Divergence(
                "missing", record.where,
                f"{first.service} derived {first.envelope.type} {first.envelope.subject} ({first.envelope.id}) "
                f"from {first.cause.type} {first.cause.subject} at {first.cause_where} before this "
                f"{recorded.type} {recorded.subject}, but the log does not have it here: the decision was "
                "dropped, or the log's order is not the order it was decided in",
                recorded=recorded, recorded_raw=record.raw, derived=first, cause=first.cause,
                cause_where=first.cause_where)
        owed.popleft()
        return Divergence(
            "differs", record.where,
            f"{derived.service}'s {derived.envelope.type} {derived.envelope.subject} ({derived.envelope.id}) "
            f"differs from the one recorded", recorded=recorded, recorded_raw=record.raw, derived=derived,
            cause=derived.cause, cause_where=derived.cause_where)

    def _before_cause(self, env: Envelope, record: Record) -> Divergence:
        """``env`` answers a decision a service derived that the log has not shown yet."""
        cause = self._by_id[env.causation_id or ""]
        return Divergence(
            "missing", record.where,
            f"{env.type} {env.subject} ({env.id}) answers {cause.service}'s {cause.envelope.type} "
            f"{cause.envelope.subject} ({cause.envelope.id}), derived from {cause.cause.type} {cause.cause.subject} "
            f"at {cause.cause_where}, which is not in the log before it: the decision was dropped or moved later",
            recorded=env, recorded_raw=record.raw, derived=cause, cause=cause.cause, cause_where=cause.cause_where)

    def _unexpected(self, env: Envelope, record: Record) -> Divergence:
        if self._source is not None and recorded_before(self._source, env.id, record.where):
            why = "a second copy of a decision the log has already (a duplicate)"
        elif env.causation_id and not self._seen_cause(env):
            why = f"its cause {env.causation_id} is not earlier in the log (moved before its cause, or made up)"
        else:
            why = (f"{env.source} did not derive it from its cause {env.causation_id}: its id, cause or position "
                   "is not what was derived, or no service made it")
        owed = self._owed.get(env.source)
        first = owed[0] if owed else None
        return Divergence("unexpected", record.where, f"{env.source}'s {env.type} {env.subject} ({env.id}): {why}",
                          recorded=env, recorded_raw=record.raw, derived=first,
                          cause=first.cause if first else None, cause_where=first.cause_where if first else "")

    def _seen_cause(self, env: Envelope) -> bool:
        """Whether ``env``'s cause was handled already (a cause some service derived outputs from)."""
        for service in self.services.values():
            if env.causation_id in service.seen:
                return True
        return False

    def finish(self, where: str) -> None:
        """The log ended: every derived decision must have been recorded."""
        if not self.check:
            return
        owed = [d for queue in self._owed.values() for d in queue]
        if owed:
            first = min(owed, key=lambda d: d.seq)
            d = Divergence("unfinished", where,
                           f"the log ends, but {len(owed)} decision(s) derived from it are not in it; the first: "
                           f"{first.service}'s {first.envelope.type} {first.envelope.subject} ({first.envelope.id}) "
                           f"from {first.cause.type} {first.cause.subject} at {first.cause_where} (dropped, or "
                           "in flight when the log was taken)", derived=first, cause=first.cause,
                           cause_where=first.cause_where)
            d.blame = ("the log ends before its services wrote what its last inputs call for: it was taken while "
                       "they were at work (export it again once they are idle), or its end was cut off")
            raise d


    def run(self, source: LogSource, tick: Callable[[], None] | None = None, every: int = 4096) -> Iterator[Step]:
        """Every envelope of ``source`` through ``step``, then ``finish``. ``tick`` is called every
        ``every`` envelopes (a progress bar). Cyclic garbage collection waits while the log is read:
        envelopes and the cores' state are freed by reference counting, and the cores make no
        cycles (a whole replay leaves the collector next to nothing). A young collection every
        ``COLLECT_EVERY`` envelopes is the bound should one appear, and far apart: one every few tens of
        thousands cost a visible part of a replay, each one walking all the state built since the last."""
        started = time.perf_counter()
        self._source = source
        where = "the start of the log"
        n = 0
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            for record in source.records():
                where = record[0]
                yield self.step(record)
                n += 1
                if n % every == 0:
                    if tick is not None:
                        tick()
                    if was_enabled and n % COLLECT_EVERY == 0:
                        gc.collect(0)
            self.finish(f"after {where}")
        except Divergence as d:
            self.tally.different = 1  # the replay stops at the first
            if not d.blame:
                d.blame = self.blame(d.derived.service if d.derived is not None else
                                     d.recorded.source if d.recorded is not None else None)
            raise
        finally:
            self._source = None
            if was_enabled:
                gc.enable()
            self.tally.wall_seconds += time.perf_counter() - started


def replay(source: LogSource, policy: Policy | None, *, check: bool = True,
           tick: Callable[[], None] | None = None, override: Policy | None = None) -> Iterator[Step]:
    """Replay ``source`` through fresh cores built with ``policy`` (the log's own from its
    ``PolicyApplied`` on; ``override`` throughout): one ``Step`` per envelope, the
    hook for readers that walk a replay (tracing builds its spans from it).

    With ``check`` every recorded decision is compared with the derived one and the first
    difference raises ``Divergence``; without, the log is only fed to the cores."""
    return Replayer(policy, check=check, override=override).run(source, tick)


def verify(source: LogSource, policy: Policy | None, *, tick: Callable[[], None] | None = None,
           replayer: Replayer | None = None) -> Tally:
    """Re-derive every decision of ``source``; the tally when all are identical, else ``Divergence``
    (pass ``replayer`` to read its tally afterwards either way)."""
    replayer = replayer or Replayer(policy, check=True)
    for _ in replayer.run(source, tick):
        pass
    return replayer.tally


def starting_policy(source: LogSource) -> Policy:
    """The policy the log starts with: its first ``PolicyApplied``'s, else its header's (a log made
    before the event existed; ``CannotReproduce`` when neither names one). What-if runs its twin
    under it; a Kafka log's services write theirs before their first decision."""
    for record in source.records():
        if _POLICY_TYPE in record[1]:
            env = decode(record)
            if env.type == "PolicyApplied":
                try:
                    return Policy.from_mapping(env.payload.policy)
                except ValidationError as exc:
                    raise CannotReproduce(f"{record.where}: the log's policy is not one this muster reads: "
                                          f"{first_errors(exc, 1)}") from None
    return source.header.decided_with()


def policy_changes(source: LogSource) -> int:
    """How many times a service of the log took a policy other than the one it had (0: one policy)."""
    held: dict[str, str] = {}
    changes = 0
    for record in source.records():
        if _POLICY_TYPE in record[1]:
            env = decode(record)
            if env.type == "PolicyApplied":
                for name in env.payload.services:
                    if held.get(name, env.payload.policy_digest) != env.payload.policy_digest:
                        changes += 1
                    held[name] = env.payload.policy_digest
    return changes


_POLICY_TYPE = b'"type":"PolicyApplied"'
