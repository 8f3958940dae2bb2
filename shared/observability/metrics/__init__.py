"""Prometheus metrics and health endpoints of ``muster run SERVICE``.

``scheduling``: the queue service's scheduling metrics (Kueue's names); ``stack``: every service's
own (events handled, batch latency, inbox lag, dead letters, restarts; the projector's rows and
lag); ``server``: ``/metrics``, ``/healthz`` and ``/readyz`` on ``--metrics-port``. All are adapters:
they read what the services do, and no core knows of them.
"""
