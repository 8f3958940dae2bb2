"""shared/bus/topics.py: topic names, partition counts, destinations and partition keys."""

from __future__ import annotations

import pytest

from shared.bus.topics import Topics, key
from shared.events import WorkloadDeleted
from shared.topology import SERVICES
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


def test_eight_topics_of_one_partition_each():
    partitions = TOPICS.partitions()
    assert len(partitions) == 8
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
