"""shared/runtime/bus/app.py ``cancelled``: a reader's helpers end when it stops, even one that swallowed a cancellation."""

from __future__ import annotations

import asyncio

from shared.runtime.bus.app import cancelled


def test_a_task_that_swallows_its_first_cancellation_is_cancelled_again() -> None:
    ends: list[str] = []

    async def stubborn() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass  # as a 3.11 wait_for whose inner future finished at the same moment: it goes on
        try:
            await asyncio.sleep(3600)
        finally:
            ends.append("stubborn")

    async def plain() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            ends.append("plain")

    async def main() -> None:
        tasks = [asyncio.ensure_future(stubborn()), asyncio.ensure_future(plain())]
        await asyncio.sleep(0)
        await asyncio.wait_for(cancelled(tasks, every=0.01), timeout=5)
        assert all(t.done() for t in tasks)

    asyncio.run(main())
    assert sorted(ends) == ["plain", "stubborn"]


def test_nothing_to_cancel_returns_at_once() -> None:
    async def main() -> None:
        done = asyncio.ensure_future(asyncio.sleep(0))
        await done
        await asyncio.wait_for(cancelled([done]), timeout=1)
        await asyncio.wait_for(cancelled([]), timeout=1)

    asyncio.run(main())
