"""The Kafka bus: topics, codec, service workers, the distributed runtime.

The cluster link's bridge lives in ``shared.kubernetes``; the loopback broker in ``shared.parts.localbroker``.

    topics.py      every topic's name, partition count and key, in one place
    config.py      where the broker is and how to reach it (MUSTER_KAFKA, TLS, SASL)
    codec.py       envelopes and control messages as Kafka records; the dead-letter record
    sequencing.py  the order a worker hands its inbox to the core (arrival, or the driver's rounds)
    worker.py      a service's inbox loop without the framework: dedupe, handle, log, route, reply
    app.py         the Faust wiring: ``muster run SERVICE``; creating topics; replaying an inbox
    projector.py   the log topic into the history store (``muster run projector``)
    driver.py      ``muster simulate --bus``: the simulated cluster and the clock, over Kafka
"""
