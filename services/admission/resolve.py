"""Which queue a workload goes to, and whether its gang could ever fit that queue's limits.

Resolution order, first match wins: ``spec.queue`` of a PodGroup KubeRay made for the workload
(Volcano schedules by the PodGroup's queue), label ``volcano.sh/queue-name`` (or Volcano's annotation
``scheduling.volcano.sh/queue-name``), label ``kai.scheduler/queue``, label
``quota.scheduling.alibabacloud.com/name``, the ElasticQuotaTree leaf listing the namespace, else
``policy.default_queue``.
"""

from __future__ import annotations

from collections.abc import Mapping

from services.admission.queues import QueueBook
from shared.kernel import quantity as q
from shared.kernel.model import UNLIMITED, QueueSpec

QUEUE_SOURCES: tuple[tuple[str, str], ...] = (
    ("labels", "volcano.sh/queue-name"),
    ("annotations", "scheduling.volcano.sh/queue-name"),
    ("labels", "kai.scheduler/queue"),
    ("labels", "quota.scheduling.alibabacloud.com/name"),
)

_RESOURCE_ORDER = (q.CPU, q.MEMORY, q.GPU)


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


def _ordered(demand: Mapping[str, int]) -> list[str]:
    """cpu, memory, GPU first (what people look at), then the rest by name."""
    first = [r for r in _RESOURCE_ORDER if r in demand]
    return first + sorted(r for r in demand if r not in _RESOURCE_ORDER)


def never_fits(demand: Mapping[str, int], chain: list[QueueSpec], preemptible: bool = True) -> str | None:
    """Reason when ``demand`` exceeds the limit of the queue or an ancestor for some resource (leaf first),
    or, for a non-preemptible workload where the dialect caps those by the guarantee (KAI), the guarantee:
    such a workload could wait for ever, so it is told at once which cap and by how much."""
    for depth, spec in enumerate(chain):
        who = f"queue {spec.name}" + (f" (ancestor of {chain[0].name})" if depth else "")
        for resource in _ordered(demand):
            limit = spec.limit_of(resource)
            if limit is not None and demand[resource] > limit:
                return (f"can never fit: {who} {spec.limit_word} {resource} {q.human(resource, limit)}, "
                        f"gang requests {resource} {q.human(resource, demand[resource])}")
        if preemptible or not spec.guarantee_caps_non_preemptible:
            continue
        for resource in _ordered(demand):
            guarantee = spec.guarantee.get(resource)
            if guarantee is not None and guarantee != UNLIMITED and demand[resource] > guarantee:
                return (f"can never fit: {who} {spec.guarantee_word} {resource} {q.human(resource, guarantee)} "
                        f"caps non-preemptible workloads, gang requests {resource} "
                        f"{q.human(resource, demand[resource])} (a preemptible priority or "
                        f"kai.scheduler/preemptibility: preemptible lets it borrow above the {spec.guarantee_word})")
    return None
