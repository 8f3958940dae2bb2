"""Which queue a workload goes to.

Resolution order, first match wins: ``spec.queue`` of a PodGroup KubeRay made for the workload
(Volcano schedules by the PodGroup's queue), label ``volcano.sh/queue-name`` (or Volcano's annotation
``scheduling.volcano.sh/queue-name``), label ``kai.scheduler/queue``, label
``quota.scheduling.alibabacloud.com/name``, the ElasticQuotaTree leaf listing the namespace, else
``policy.default_queue``.
"""

from __future__ import annotations

from collections.abc import Mapping

from services.admission.queues import QueueBook

QUEUE_SOURCES: tuple[tuple[str, str], ...] = (
    ("labels", "volcano.sh/queue-name"),
    ("annotations", "scheduling.volcano.sh/queue-name"),
    ("labels", "kai.scheduler/queue"),
    ("labels", "quota.scheduling.alibabacloud.com/name"),
)


def queue_for(labels: Mapping[str, str], annotations: Mapping[str, str], namespace: str, book: QueueBook,
              default_queue: str, group_queue: str | None = None) -> tuple[str, str]:
    """(queue name, where it came from) — the source is quoted in 'does not exist' reasons."""
    if group_queue:
        return group_queue, "spec.queue of its PodGroup"
    for where, key in QUEUE_SOURCES:
        value = (labels if where == "labels" else annotations).get(key)
        if value:
            return value, f"metadata.{where}.{key}"
    leaf = namespace_leaf(namespace, book)
    if leaf is not None:
        return leaf, f"ElasticQuotaTree leaf {leaf} lists namespace {namespace}"
    return default_queue, "the default queue"


def namespace_leaf(namespace: str, book: QueueBook) -> str | None:
    """The first leaf (tree order) whose ``namespaces`` lists ``namespace``: only ElasticQuotaTree nodes
    list namespaces, so the data says which dialect routes by namespace, not a test of its name."""
    for spec in book.specs.values():
        if namespace in spec.namespaces and book.is_leaf(spec.name):
            return spec.name
    return None
