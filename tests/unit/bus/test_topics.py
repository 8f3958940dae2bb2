"""shared/runtime/bus/topics.py: topic names, partition counts, destinations and partition keys."""

from __future__ import annotations

import pytest

from shared.kernel.events import WorkloadDeleted
from shared.kernel.topology import SERVICES
from shared.runtime.bus.topics import Topics, key, lost_records, retention_problem
from tests.builders.shared import at

TOPICS = Topics("t1.")
ENV = at(WorkloadDeleted(key="default/w"), 1.0)


def test_every_name_is_under_the_prefix():
    assert [TOPICS.inbox(s) for s in SERVICES] == ["t1.admission", "t1.queue", "t1.placement", "t1.reconciler"]
    assert (TOPICS.effects, TOPICS.log, TOPICS.deadletter, TOPICS.control) == (
        "t1.effects", "t1.events", "t1.deadletter", "t1.control")


def test_there_is_no_inbox_for_an_unknown_service():
    with pytest.raises(ValueError, match="clock"):
        TOPICS.inbox("clock")
    with pytest.raises(ValueError, match="clock"):
        TOPICS.snapshots("clock")


def test_thirteen_topics_of_one_partition_each():
    partitions = TOPICS.partitions()
    assert len(partitions) == 13  # 4 inboxes, effects, log, dead letters, control, checkpoints, 4 snapshot topics
    assert set(partitions.values()) == {1}
    assert all(name.startswith("t1.") for name in partitions)


def test_the_cluster_destination_is_the_effects_topic():
    assert TOPICS.destination("cluster") == TOPICS.effects
    assert TOPICS.destination("placement") == TOPICS.inbox("placement")


def test_the_queue_inbox_is_keyed_by_the_quota_tree():
    assert key(TOPICS.inbox("queue"), ENV, TOPICS) == b"cluster"


def test_the_placement_inbox_has_one_key():
    assert key(TOPICS.inbox("placement"), ENV, TOPICS) == b"placement"


@pytest.mark.parametrize("topic", [TOPICS.inbox("admission"), TOPICS.inbox("reconciler"), TOPICS.effects, TOPICS.log])
def test_other_topics_are_keyed_by_the_subject(topic):
    assert key(topic, ENV, TOPICS) == b"default/w"


# --------------------------------------------------------------------------- durability
def test_every_topic_but_control_and_snapshots_keeps_every_record():
    specs = {spec.name: spec for spec in TOPICS.specs(replication=3, min_insync=2)}
    assert set(specs) == set(TOPICS.partitions())
    for name, spec in specs.items():
        assert (spec.replication, spec.configs["min.insync.replicas"]) == (3, "2")
        assert spec.configs["cleanup.policy"] == "delete"
        if name == TOPICS.control:
            assert not spec.keeps_all and spec.configs["retention.ms"] == str(24 * 3600 * 1000)
        elif name.startswith("t1.snapshots."):
            assert not spec.keeps_all and spec.configs["retention.ms"] == str(7 * 24 * 3600 * 1000)
            assert spec.configs["retention.bytes"] == str(1 << 30) and spec.configs["segment.bytes"] == str(64 << 20)
        else:
            assert spec.keeps_all and (spec.configs["retention.ms"], spec.configs["retention.bytes"]) == ("-1", "-1")


QUEUE_SPEC = next(s for s in TOPICS.specs() if s.name == "t1.queue")
CONTROL_SPEC = next(s for s in TOPICS.specs() if s.name == "t1.control")


def test_an_inbox_as_muster_creates_it_passes():
    assert retention_problem(QUEUE_SPEC, dict(QUEUE_SPEC.configs), "the queue service") is None
    assert retention_problem(QUEUE_SPEC, {"retention.ms": "-1"}, "the queue service") is None


@pytest.mark.parametrize("described, why", [
    ({}, "reports no retention.ms"),
    ({"retention.ms": "604800000"}, "retention.ms=604800000 deletes records after 7 days"),
    ({"retention.ms": "-1", "retention.bytes": "1073741824"}, "retention.bytes=1073741824"),
    ({"retention.ms": "-1", "cleanup.policy": "compact"}, "cleanup.policy=compact drops older records of a key"),
    ({"retention.ms": "-1", "cleanup.policy": "compact,delete"}, "cleanup.policy=compact,delete"),
])
def test_an_inbox_that_would_lose_records_is_refused_saying_why_and_what_to_do(described, why):
    problem = retention_problem(QUEUE_SPEC, described, "the queue service")
    assert problem is not None and why in problem and "\n" not in problem
    assert problem.startswith("topic t1.queue would lose records the queue service needs")
    assert "--entity-name t1.queue --add-config retention.ms=-1,retention.bytes=-1" in problem


def test_the_control_topic_may_expire():
    assert retention_problem(CONTROL_SPEC, {"retention.ms": "1000"}, "the driver") is None


def test_records_are_all_there_from_the_start_to_where_the_reader_resumes():
    assert lost_records("q", "the queue service", start=0, end=100, resume=40) is None
    assert lost_records("q", "the queue service", start=0, end=0, resume=None) is None  # fresh
    assert lost_records("q", "the queue service", start=0, end=40, resume=40) is None  # all handled
    assert lost_records("e", "the cluster link", start=30, end=100, resume=40, needed_from=40) is None


def test_a_topic_that_ends_before_the_reader_resumes_was_emptied():
    problem = lost_records("q", "the queue service", start=0, end=0, resume=40)
    assert problem is not None and problem.startswith(
        "q ends at offset 0 but the queue service has handled it up to offset 40: the topic was emptied")


@pytest.mark.parametrize("resume", [None, 40, 100])
def test_a_topic_truncated_before_what_the_reader_needs_is_refused(resume):
    problem = lost_records("q", "the queue service", start=30, end=100, resume=resume)
    assert problem is not None and "records 0 to 29 were deleted" in problem


def test_a_reader_that_keeps_no_state_needs_only_what_it_has_not_read():
    problem = lost_records("e", "the cluster link", start=50, end=100, resume=40, needed_from=40)
    assert problem is not None and "records 40 to 49 were deleted" in problem


def test_a_service_needs_its_inbox_only_from_its_snapshot_and_says_why_none_covers_a_cut():
    assert lost_records("q", "the queue service", start=30, end=100, resume=60, needed_from=30) is None
    problem = lost_records("q", "the queue service", start=30, end=100, resume=60,
                           snapshot="there is no snapshot")
    assert problem is not None and "\n" not in problem
    assert ("records 0 to 29 were deleted (retention or delete-records) and no usable snapshot covers them "
            "(there is no snapshot); refusing to rebuild without them") in problem
