"""Which queue a workload goes to.

Resolution order, first match wins: ``spec.queue`` of a PodGroup KubeRay made for the workload
(Volcano schedules by the PodGroup's queue), label ``volcano.sh/queue-name`` (or Volcano's annotation
``scheduling.volcano.sh/queue-name``), label ``kai.scheduler/queue``, label
``quota.scheduling.alibabacloud.com/name``, the ElasticQuotaTree leaf listing the namespace, else
``policy.default_queue``.

A key on the object that muster does not read but its user likely meant as one of those (a slip:
``volcano.sh/queue`` for ``volcano.sh/queue-name``, ``kueue.x-k8s.io/queue-name``, which is Kueue's) is
named by ``queue_key_slips``: the workload goes where the keys muster reads send it, and is warned.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

from services.admission.queues import QueueBook

QUEUE_SOURCES: tuple[tuple[str, str], ...] = (
    ("labels", "volcano.sh/queue-name"),
    ("annotations", "scheduling.volcano.sh/queue-name"),
    ("labels", "kai.scheduler/queue"),
    ("labels", "quota.scheduling.alibabacloud.com/name"),
)

UNREAD_QUEUE_KEYS: dict[tuple[str, str], str] = {
    ("labels", "kueue.x-k8s.io/queue-name"): "Kueue's LocalQueue label",
}
"""Peers' queue keys muster does not read (Kueue's names a LocalQueue, an object muster has no notion of):
a workload that carries one alone would go to the default queue without a word."""

_PLACE = {"labels": "label", "annotations": "annotation"}
_WHOLE = 0.9
"""A key this close to a queue key as a whole is a slip of it (``queue-names``, ``kai-scheduler/queue``)."""
_PREFIX = 0.8
"""A key naming a queue (``queue`` in its name) whose prefix is this close to a queue key's is a slip of
it (``volcano.sh/queue``, ``kueue.x-k8s.io/queue``); ``volcano.sh/job-name`` and other keys of the same
prefix that name no queue are not."""


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


def queue_key_slips(labels: Iterable[str], annotations: Iterable[str]) -> list[str]:
    """One phrase per label or annotation key muster reads nothing from though it was likely meant to name
    the queue, by place and key: a peer's key muster does not read (``UNREAD_QUEUE_KEYS``), or a key
    spelled nearly as one of either (``_near``), a queue key in the other place (``annotation
    volcano.sh/queue-name``) included. Keys muster reads are never slips; nor is anything else, so a label of the user's own
    is left alone. Keys only: what a slip's value says is never read."""
    slips: list[str] = []
    for where, keys in (("labels", labels), ("annotations", annotations)):
        for key in sorted(keys):
            if (where, key) in QUEUE_SOURCES:
                continue
            slip = _slip(where, key)
            if slip:
                slips.append(slip)
    return slips


def _slip(where: str, key: str) -> str:
    here = f"{_PLACE[where]} {key}"
    unread = UNREAD_QUEUE_KEYS.get((where, key))
    if unread is not None:
        return f"{here} is {unread}, which muster does not read (it reads {_read_keys()})"
    best: tuple[float, tuple[str, str]] | None = None
    for target in (*QUEUE_SOURCES, *UNREAD_QUEUE_KEYS):
        score = _near(key, target[1])
        if score and (best is None or score > best[0]):
            best = (score, target)
    if best is None:
        return ""
    place, meant = best[1]
    if best[1] in UNREAD_QUEUE_KEYS:
        return (f"{here} is not read by muster (it comes close to {UNREAD_QUEUE_KEYS[best[1]]} {meant}, which "
                f"muster does not read either; it reads {_read_keys()})")
    return f"{here} is not read by muster (did you mean {_PLACE[place]} {meant}?)"


def _near(key: str, target: str) -> float:
    """How close ``key`` is to the queue key ``target`` when it is a slip of it (0.0 when it is not)."""
    whole = difflib.SequenceMatcher(None, key, target).ratio()
    if whole >= _WHOLE:
        return whole
    prefix, _, name = key.rpartition("/")
    target_prefix = target.rpartition("/")[0]
    if prefix and "queue" in name.lower() and difflib.SequenceMatcher(None, prefix, target_prefix).ratio() >= _PREFIX:
        return whole
    return 0.0


def _read_keys() -> str:
    return ", ".join(f"{_PLACE[place]} {key}" for place, key in QUEUE_SOURCES)

