"""What drives the cores: ``Service``, the embedded runtime, the composition root (``cores``),
state snapshots, the code digest, and the Kafka bus (``bus``).
"""
