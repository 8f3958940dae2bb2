"""A run's event log written to the store while it is made (``muster simulate --store``).

``record`` writes a log held whole in memory; a long simulated run's log is most of its memory (every
watch object it published, kept until the end: 1.2 GB for 5,000 RayClusters against 203 MB without
``--store``). ``LogStream`` is a listener of the run's runtime instead: it takes each envelope as it
is published and writes a batch of them every ``batch_size``, so what the run holds for the store is
one batch (docs/benchmarks.md, "simulate --store").

It chains and signs as ``record`` does: by a ``signer``, or by a key made for this run (its public
half is in the store); the header is signed before the first envelope, and ``finish`` seals the run
with a final checkpoint.

The store's rule is ``record``'s: a store holds one history. An empty store gets the run; a store
holding this very run already (the same scenario recorded again) gets nothing and counts it skipped;
a store holding another history is refused (``OtherHistory``) — found at the first batch that is not
there, and said when the run ends (``finish``), not in the middle of the simulation.
"""

from __future__ import annotations

from typing import Any

from shared.history.engine import OtherHistory, StoreError, display
from shared.history.integrity import Signer
from shared.history.writer import Pipeline, ProjectionWriter, WriteCounts
from shared.kernel.events import Envelope

BATCH = 5_000
"""Envelopes per transaction, as ``record`` writes them."""


class LogStream:
    """Call it with each envelope of the run in order (``EmbeddedRuntime.subscribe``), then ``finish``."""

    def __init__(self, url: str, *, header: dict[str, Any] | None = None, batch_size: int = BATCH,
                 signer: Signer | None = None) -> None:
        from sqlalchemy import func, select

        from shared.history import schema
        from shared.history.engine import errors_explained
        from shared.history.models import EventLog

        schema.ensure(url)
        self.url, self.batch_size = url, batch_size
        self.header = header
        """The ``log_header`` row the run is made under (``shared.history.header``), written by ``finish``."""
        self.writer = ProjectionWriter(url, signer=signer or Signer.generate())
        try:
            with errors_explained(self.writer.engine), self.writer.engine.connect() as conn:
                # events the store held before the run: none, or this run's (else ``OtherHistory``)
                self.held = conn.execute(select(func.count()).select_from(EventLog.__table__)).scalar_one()
            if not self.held and header is not None:
                self.writer.sign_header(header)  # first, as ``record`` signs it
        except BaseException:
            self.writer.close()
            raise
        self.pipeline = Pipeline(self.writer)
        self.batch: list[Envelope] = []
        self.seen = 0
        self.counts = WriteCounts()
        self.error: StoreError | None = None
        """The first failure; nothing is written after it, and ``finish`` raises it."""

    def __call__(self, env: Envelope) -> None:
        if self.error is not None:
            return
        self.batch.append(env)
        self.seen += 1
        if len(self.batch) >= self.batch_size:
            self._put()

    def _put(self) -> None:
        batch, self.batch = self.batch, []
        if not batch or self.error is not None:
            return
        try:
            if self.held:
                self._same(batch)
            else:
                self.counts = self.counts + self.pipeline.put(batch)
        except StoreError as exc:
            self.error = exc

    def _same(self, batch: list[Envelope]) -> None:
        """The store holds this run already: each batch must be there, and is skipped."""
        from shared.history.engine import errors_explained

        ids = {env.id for env in batch}
        with errors_explained(self.writer.engine), self.writer.engine.connect() as conn:
            present = len(self.writer.stored_ids(conn, sorted(ids)))
        if present != len(ids):
            raise self._other()
        self.counts = self.counts + WriteCounts(skipped=len(batch))

    def _other(self) -> OtherHistory:
        return OtherHistory(f"the store at {display(self.url)} already holds another history ({self.held} events); "
                            "give each run a store of its own (e.g. a new sqlite:/// file)")

    def close(self) -> None:
        """Stop writing (the batches written stay: a run that failed part way leaves a partial history)."""
        self.pipeline.close()
        self.writer.close()

    def finish(self) -> WriteCounts:
        """Write what is left and the run's header; what was written. Raises the ``StoreError`` that
        stopped the writing, if one did."""
        from shared.history.header import write_header

        try:
            self._put()
            if self.error is None:
                try:
                    self.counts = self.counts + self.pipeline.flush()
                    if not self.held:
                        self.writer.seal()  # the run has ended: a final checkpoint signs all of it
                except StoreError as exc:
                    self.error = exc
        finally:
            self.close()
        if self.error is not None:
            raise self.error
        if self.held and self.held != self.seen:
            raise self._other()
        if self.header is not None:
            write_header(self.url, self.header)
        return self.counts
