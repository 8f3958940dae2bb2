"""The queue service: ordering, backoff, hierarchical quota, fair share and reclaim (see core.py)."""

from services.queue.core import QueueCore

__all__ = ["QueueCore"]
