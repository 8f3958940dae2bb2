"""Builders for the audit tests: each scenario's run once, its log as an exported file, and a file's
lines to tamper with (every tamper keeps the end line's count honest, so only the tamper shows)."""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING
from pathlib import Path

from shared.audit.header import LogHeader
from shared.audit.logfile import write_log
from shared.kernel.events import to_json
from shared.runtime.simulate import Run, simulate
from shared.sim.scenario import load_scenario
from tests.builders.shared import SCENARIOS

SCENARIO_FILES = sorted(SCENARIOS.glob("*.yaml"))


@lru_cache(maxsize=None)
def scenario_run(name: str) -> Run:
    """``tests/scenarios/NAME.yaml`` simulated once per session (runs are deterministic)."""
    return simulate(load_scenario(SCENARIOS / f"{name}.yaml"))


def header_of(run: Run) -> LogHeader:
    return LogHeader.made_now(run.policy, origin="simulate", scenario=run.scenario.name, until=run.scenario.until)


def exported(run: Run, path: Path) -> Path:
    """``run``'s log as ``muster log export`` writes it."""
    write_log(path, header_of(run), (to_json(e) for e in run.runtime.log))
    return path


EPOCH = 1_796_532_000.0
"""2026-12-06T04:40:00Z: where ``deployed`` puts a run's time 0."""


def deployed(run: Run, path: Path, epoch: float = EPOCH) -> Path:
    """``run``'s log as a deployment's export would hold it: origin ``kafka``, no ``until``, every event
    time moved to the wall clock (``epoch`` + scenario seconds). Times inside payloads (a backoff's
    ``requeue_at``) stay scenario seconds: tests of a deployment's views read event times only."""
    header = header_of(run).model_copy(update={"origin": "kafka", "until": None})
    write_log(path, header, (to_json(e.model_copy(update={"occurred_at": epoch + e.occurred_at}))
                             for e in run.runtime.log))
    return path


def lines_of(path: Path) -> list[bytes]:
    """The envelope lines (header and end line apart)."""
    return path.read_bytes().splitlines(keepends=True)[1:-1]


def rewritten(path: Path, lines: list[bytes], out: Path) -> Path:
    """``path``'s header, then ``lines``, then an end line counting them."""
    header = path.read_bytes().splitlines(keepends=True)[0]
    out.write_bytes(header + b"".join(lines) + b'{"muster_log_end":{"events":%d}}\n' % len(lines))
    return out


def decision_lines(lines: list[bytes], source: bytes = b"queue") -> list[int]:
    """Indexes of the lines that are decisions of ``source`` with a reason."""
    return [i for i, line in enumerate(lines) if b'"source":"%s"' % source in line and b'"reason":"' in line]


def chained(run: Run, path: Path, *, signer: "Signer | None" = None, every: int | None = None) -> Path:
    """``run``'s log as ``muster simulate --store`` then ``muster log export`` write it: chained and signed
    (by ``signer``, else a key made for the run), a checkpoint every ``every`` envelopes when given."""
    import tempfile

    from shared.audit.export import export
    from shared.audit.logfile import StoreLog

    with tempfile.TemporaryDirectory() as tmp:
        url = chained_store(run, f"sqlite:///{tmp}/store.db", signer=signer, every=every)
        export(StoreLog(url), path)
    return path


def chained_store(run: Run, url: str, *, signer: "Signer | None" = None, every: int | None = None) -> str:
    """A store holding ``run``'s log as ``muster simulate --store`` writes it (see ``chained``)."""
    from shared.history import schema
    from shared.history.header import write_header
    from shared.history.integrity import Signer
    from shared.history.writer import ProjectionWriter, write_log as store_log

    schema.ensure(url)
    header = header_of(run).for_store()
    with ProjectionWriter(url, signer=signer or Signer.generate(), checkpoint_every=every) as writer:
        writer.sign_header(header)
        store_log(writer, run.runtime.log, batch_size=50)
        writer.seal()
    write_header(url, header)
    return url


if TYPE_CHECKING:
    from shared.history.integrity import Signer
