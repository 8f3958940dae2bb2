"""Per-stage timestamps of a running process, for finding where a workload's wait goes
(``bench.e2e_stages``). Off, and free but for one ``None`` check per batch, unless
``MUSTER_STAGE_TRACE`` names a folder: then each process appends one JSON line per event to
``<folder>/<process>-<pid>.jsonl``, times in wall seconds (``time.time()``, the clock of the
Kafka records' timestamps, so the lines line up with the log across processes).

What is noted, each a ``[what, ...]`` line:
- ``fetch``: ``[t, reader, ages]``: a fetch returned; for each record, seconds since its producer
  stamped it (its ``timestamp``): the produce round trip, the broker, the fetch's wait and the
  reader's own delay before it looked (the previous batch, a capture, a collection)
- ``batch``: ``[t0, t1, reader, records]``: a batch handled, its outputs sent and acknowledged
- ``send``: ``[t0, t1, process, records]``: one ``send_all``, from the call to the broker's
  acknowledgement of every record
- ``gc``: ``[t0, t1, process, generation, cpu, collected]``: a collection (``gc.callbacks``), ``cpu``
  the seconds of CPU it took (``time.thread_time``: on a loaded machine a collection's wall time is
  mostly the waits for a core, which ``t1 - t0`` cannot tell from its own work), ``collected`` the
  objects it found unreachable (cyclic garbage: freeing it is part of the pause)
- ``lag``: ``[t, process, late]``: a 10 ms timer fired ``late`` seconds after it was due: the event
  loop was held (CPU, a collection, a capture, a long callback)
- ``apply``: ``[t0, t1, op]``: one effect applied over HTTP (``muster run cluster``)
- ``watch``: ``[t, kind, change]``: a watch event handed to the link; ``publish``: ``[t0, t1, n]``: a
  burst of them logged and routed
- ``capture``: ``[t0, t1, process]``: a snapshot's capture held the inbox
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import time
from typing import Any

VARIABLE = "MUSTER_STAGE_TRACE"

LAG_PERIOD = 0.01
"""Seconds between two ticks of the loop-lag probe."""


class StageTrace:
    """One process's trace file; ``note`` buffers, ``flush`` appends (every second, and at exit)."""

    def __init__(self, folder: str, process: str) -> None:
        self.path = os.path.join(folder, f"{process}-{os.getpid()}.jsonl")
        self.process = process
        self.rows: list[list[Any]] = []
        self._gc_started = 0.0
        self._gc_cpu = 0.0
        self._flushed = time.time()

    def note(self, *row: Any) -> None:
        self.rows.append(list(row))
        if time.time() - self._flushed > 1.0:  # whatever the row: a process noting only fetches flushes too
            self.flush()

    def flush(self) -> None:
        rows, self.rows, self._flushed = self.rows, [], time.time()
        if rows:
            with open(self.path, "a") as f:
                f.write("".join(json.dumps(row) + "\n" for row in rows))

    def _gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started, self._gc_cpu = time.time(), time.thread_time()
        else:
            self.rows.append(["gc", self._gc_started, time.time(), self.process, info.get("generation"),
                              round(time.thread_time() - self._gc_cpu, 6), info.get("collected")])

    async def lag_probe(self) -> None:
        """Note how late a short sleep wakes, for as long as the loop runs (cancelled with it)."""
        while True:
            due = time.time() + LAG_PERIOD
            await asyncio.sleep(LAG_PERIOD)
            late = time.time() - due
            if late > 0.002:
                self.note("lag", time.time(), self.process, round(late, 4))


_trace: StageTrace | None = None


def start(process: str) -> StageTrace | None:
    """This process's trace (``process`` names it), made on the first call when ``MUSTER_STAGE_TRACE``
    is set; None (nothing noted) otherwise."""
    global _trace
    folder = os.environ.get(VARIABLE)
    if not folder:
        return None
    if _trace is None:
        import atexit

        _trace = StageTrace(folder, process)
        gc.callbacks.append(_trace._gc)
        atexit.register(_trace.flush)
    return _trace


def current() -> StageTrace | None:
    """The trace ``start`` made, if any."""
    return _trace
