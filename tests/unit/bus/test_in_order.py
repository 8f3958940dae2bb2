"""shared/runtime/bus/app.py ``InOrder``: a live reader takes a partition's records in order, none twice, none skipped."""

from __future__ import annotations

from dataclasses import dataclass

from aiokafka import TopicPartition

from shared.runtime.bus.app import InOrder

TP = TopicPartition("muster.queue", 0)


@dataclass
class R:
    offset: int


class FakeConsumer:
    def __init__(self) -> None:
        self.seeks: list[tuple[TopicPartition, int]] = []

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks.append((tp, offset))


def _offsets(records) -> list[int]:
    return [r.offset for r in records]


def test_contiguous_records_are_all_taken():
    reader, consumer = InOrder(TP, 0), FakeConsumer()
    assert _offsets(reader.take(consumer, [R(0), R(1), R(2)])) == [0, 1, 2]
    assert _offsets(reader.take(consumer, [R(3)])) == [3]
    assert consumer.seeks == [] and reader.next == 4


def test_at_a_gap_the_records_before_it_are_taken_and_the_reader_fetches_again_from_it():
    reader, consumer = InOrder(TP, 0), FakeConsumer()
    assert _offsets(reader.take(consumer, [R(0), R(1), R(5), R(6)])) == [0, 1]
    assert consumer.seeks == [(TP, 2)]
    # the batch that was still being appended shows up on the next fetch
    assert _offsets(reader.take(consumer, [R(2), R(3), R(4), R(5), R(6)])) == [2, 3, 4, 5, 6]


def test_records_fetched_again_after_a_rewind_are_not_taken_twice():
    reader, consumer = InOrder(TP, 0), FakeConsumer()
    reader.take(consumer, [R(0), R(1), R(2)])
    assert _offsets(reader.take(consumer, [R(1), R(2), R(3)])) == [3]


def test_without_a_known_start_the_first_record_sets_it():
    reader, consumer = InOrder(TP), FakeConsumer()
    assert _offsets(reader.take(consumer, [R(7), R(8)])) == [7, 8]


def test_a_gap_that_stays_is_taken_as_real_after_the_patience_runs_out():
    reader, consumer = InOrder(TP, 0, patience=0.0), FakeConsumer()
    reader.take(consumer, [R(0)])
    assert reader.take(consumer, [R(3)]) == []  # first sight: fetch again
    assert _offsets(reader.take(consumer, [R(3), R(4)])) == [3, 4]  # still there: go on
    assert consumer.seeks == [(TP, 1)] and reader.next == 5


def test_a_gap_is_not_taken_as_real_before_the_patience_runs_out():
    reader, consumer = InOrder(TP, 0, patience=60.0), FakeConsumer()
    for _ in range(3):
        assert reader.take(consumer, [R(2)]) == []
    assert consumer.seeks == [(TP, 0)] * 3
