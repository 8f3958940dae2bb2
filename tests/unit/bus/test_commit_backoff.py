"""shared/runtime/bus/app.py ``PartitionReader``: commits that keep failing back off, bounded, and one that
succeeds again resets the pace; each failure is one log line, not one a second."""

from __future__ import annotations

import asyncio
import logging

import pytest
from aiokafka.errors import CommitFailedError

from shared.runtime.bus.app import COMMIT_BACKOFF_MAX, PartitionReader, commit_delay
from shared.runtime.bus.config import BusConfig


def test_the_delay_doubles_per_failure_up_to_the_cap():
    assert [commit_delay(1.0, n) for n in range(8)] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert commit_delay(1.0, 10_000) == COMMIT_BACKOFF_MAX  # no overflow after a long outage
    assert commit_delay(60.0, 3) == 60.0  # never more often than the interval


class RefusingConsumer:
    """Refuses the first ``refusals`` commits, as a broker does during a rebalance or an outage."""

    def __init__(self, refusals: int) -> None:
        self.refusals, self.commits = refusals, []

    async def commit(self, offsets: dict) -> None:
        if self.refusals:
            self.refusals -= 1
            raise CommitFailedError("the group rebalanced")
        self.commits.append(offsets)


def test_failed_commits_are_counted_logged_once_each_and_retried(caplog: pytest.LogCaptureFixture):
    reader = PartitionReader(BusConfig("127.0.0.1:9"), "g", "t", "t inbox")
    consumer = RefusingConsumer(refusals=3)
    reader._consumer = consumer  # type: ignore[assignment]
    reader.processed = 42
    with caplog.at_level(logging.INFO, logger="muster.bus"):
        outcomes = [asyncio.run(reader._commit()) for _ in range(4)]
    assert outcomes == [False, False, False, True]
    assert reader.committed == 42 and reader.commit_failures == 0 and len(consumer.commits) == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 3
    assert "3 failures in a row; next try in 8 s" in warnings[-1]
    assert any("committed after 3 failures" in r.getMessage() for r in caplog.records)
