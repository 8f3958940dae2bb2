"""Tracing (OpenTelemetry spans from the event log) and Prometheus metrics."""
