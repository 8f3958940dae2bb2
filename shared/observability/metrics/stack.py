"""The stack's own metrics: how each service keeps up with its inbox.

Counters the worker keeps anyway (handled, duplicates, dead letters, replayed) are read when
Prometheus scrapes (``ServiceCollector``), so they cost nothing per event; the one thing measured
per batch is how long a batch took, from read to outputs acknowledged (``batch_histogram``).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

BATCH_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def batch_histogram(registry: CollectorRegistry) -> Histogram:
    return Histogram("muster_batch_duration_seconds",
                     "Time a service took for one batch of its inbox: decode, handle, outputs acknowledged",
                     ["service"], buckets=BATCH_BUCKETS, registry=registry)


def _counter(name: str, text: str, service: str, value: float) -> CounterMetricFamily:
    family = CounterMetricFamily(name, text, labels=["service"])
    family.add_metric([service], value)
    return family


def _per(name: str, text: str, label: str, counts: Mapping[str, float]) -> CounterMetricFamily:
    """A counter with one sample per label value (an outcome, a kind), in name order."""
    family = CounterMetricFamily(name, text, labels=[label])
    for value, count in sorted(counts.items()):
        family.add_metric([value], count)
    return family


def _gauge(name: str, text: str, service: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, text, labels=["service"])
    family.add_metric([service], value)
    return family


class ServiceCollector(Collector):
    """A ``muster run`` service's counters, read from its worker and inbox reader at scrape time."""

    def __init__(self, service: str, worker: Any, reader: Any) -> None:
        self.service, self.worker, self.reader = service, worker, reader

    def collect(self) -> Iterator[Any]:
        s, worker, reader = self.service, self.worker, self.reader
        yield _counter("muster_events_handled", "Envelopes the service's core handled (duplicates not counted)",
                       s, worker.service.handled)
        yield _counter("muster_duplicates_dropped", "Envelopes dropped as copies of ones handled already",
                       s, worker.service.duplicates)
        yield _counter("muster_dead_letters", "Records sent to the dead-letter topic", s, worker.dead_letters)
        yield _counter("muster_handling_failures",
                       "Records the service's core raised on (dead-lettered, their object rejected)", s, worker.failed)
        yield _counter("muster_replayed_events", "Inbox records folded again to rebuild the state on start",
                       s, worker.replayed)
        yield _counter("muster_restarts", "Starts that resumed from a committed offset (the service ran before)",
                       s, 1 if reader.resumed else 0)
        yield _gauge("muster_inbox_lag_records", "Records in the inbox not handled yet", s, reader.lag())
        yield _gauge("muster_commit_failures", "Offset commits refused in a row (0 once one succeeds; they back off)",
                     s, getattr(reader, "commit_failures", 0))
        yield _gauge("muster_rebuild_seconds", "Seconds from the inbox's assignment to ready on start "
                     "(snapshot loaded and tail replayed, or the whole inbox folded)", s, reader.rebuild_seconds)
        snapshots = getattr(reader, "snapshots", None)
        if snapshots is not None:
            yield _counter("muster_snapshot_fallbacks", "Starts that could not use the latest snapshot and "
                           "replayed the whole inbox (the log says why)", s, snapshots.keeper.fallbacks)
            yield _counter("muster_snapshots_written", "Snapshots of the service's state written", s,
                           snapshots.keeper.written)
            yield _counter("muster_snapshot_stall_seconds", "Seconds the inbox waited for snapshot captures "
                           "(the forks; whole encodings with MUSTER_SNAPSHOT_FORK=0)", s, snapshots.stalled)
            at = snapshots.keeper.snapshot_offset
            yield _gauge("muster_snapshot_inbox_offset", "Inbox offset of the latest snapshot written or loaded (-1: "
                         "none yet): the inbox records below it are what a start no longer needs", s,
                         -1 if at is None else at)


class ProjectorCollector(Collector):
    """The projector's counters: rows written per table, dead letters, failures, how far behind."""

    def __init__(self, projector: Any, behind: Callable[[], int]) -> None:
        self.projector, self.behind = projector, behind

    def collect(self) -> Iterator[Any]:
        p = self.projector
        rows = CounterMetricFamily("muster_projector_rows_written",
                                   "Rows the projector committed to the history store, per table", labels=["table"])
        for table, count in p.written.as_dict().items():
            if table != "skipped":
                rows.add_metric([table], count)
        yield rows
        yield CounterMetricFamily("muster_projector_skipped_events",
                                  "Envelopes already in the store (a redelivered batch)", value=p.written.skipped)
        yield _counter("muster_dead_letters", "Records sent to the dead-letter topic", "projector", p.dead_letters)
        yield CounterMetricFamily("muster_projector_failures", "Batches the store or broker failed (retried)",
                                  value=p.failures)
        yield GaugeMetricFamily("muster_projector_lag_records", "Records of the log the projector has not read yet",
                                value=self.behind())


class ClusterCollector(Collector):
    """The cluster link's counters: effects applied by outcome, retries, dead letters, watch events."""

    def __init__(self, bridge: Any) -> None:
        self.bridge = bridge

    def collect(self) -> Iterator[Any]:
        b = self.bridge
        yield _per("muster_cluster_effects", "Effects the cluster link performed on the API server, per outcome",
                   "outcome", b.outcomes)
        yield CounterMetricFamily("muster_cluster_retries",
                                  "API calls retried (throttled, server errors, connection failures)", value=b.retries)
        yield CounterMetricFamily("muster_cluster_watch_events", "Watch events written to the inboxes",
                                  value=b.observed)
        yield _counter("muster_dead_letters", "Records sent to the dead-letter topic", "cluster", b.dead_letters)
        yield CounterMetricFamily("muster_cluster_unsent_watch_events",
                                  "Watch events dead-lettered instead of sent (unencodable, too large, refused)",
                                  value=b.unsent)
        yield _per("muster_cluster_refused_watch_events",
                   "Watch events ingest reduced to their identity (out of bounds), per kind", "kind", b.refused)
        down = GaugeMetricFamily("muster_cluster_task_down", "1 while a task of the cluster link is down",
                                 labels=["task"])
        for task in sorted(b.down):
            down.add_metric([task], 1)
        yield down
