"""The Kafka bus: topics, codec, service workers, the distributed runtime."""
