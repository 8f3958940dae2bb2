"""KubeRay's ``--batch-scheduler`` plugins, simulated: what each does to the objects KubeRay makes.

Real KubeRay (``ray-operator/controllers/ray/batchscheduler/``) calls one plugin, chosen at start
for every RayCluster and RayJob, at three points; the simulated KubeRay (``kuberay.py``) calls
``BatchScheduler`` at the same points:

- ``submission(obj)``: ``DoBatchSchedulingOnSubmission``, on a RayCluster whose pods are being
  reconciled and on a RayJob while it initializes. It may create or resize a PodGroup, or refuse
  (the RayJob then stays Initializing and gets no cluster, as KubeRay's reconcile returns the
  error and requeues).
- ``decorate(parent, child, group)``: ``AddMetadataToChildResource``, on every pod KubeRay creates
  (parent: its RayCluster), on the RayCluster a RayJob creates in K8sJobMode and on the submitter
  pod (parent: the RayJob): ``schedulerName``, queue labels, group annotations.
- ``completion(job, cluster)``: ``CleanupOnCompletion``, when a RayJob finishes (Volcano resizes
  the job's PodGroup to what is left of its cluster).

The plugins, as of KubeRay v1.6 (cited in docs/design/simulator.md):

=====================  ===================================  =========================================
setting                pods get                             also
=====================  ===================================  =========================================
none (default)         nothing: the template's              -
                       ``schedulerName``, else the API
                       server's ``default-scheduler``
volcano                ``schedulerName: volcano``,          a ``scheduling.volcano.sh/v1beta1``
                       ``scheduling.k8s.io/group-name:      PodGroup ``ray-<name>-pg`` per RayCluster
                       ray-<name>-pg``, ``volcano.sh/       (not one a RayJob made) and per RayJob:
                       task-spec: <group>``, the parent's   minMember (head + workers, the submitter
                       ``volcano.sh/queue-name`` and        not counted), minResources (the
                       ``ray.io/priority-class-name``       submitter counted), queue,
                       labels                               priorityClassName; refuses a RayJob with
                                                            a clusterSelector
kai-scheduler          ``schedulerName: kai-scheduler``,    refuses a RayJob in K8sJobMode (KAI
                       the parent's ``kai.scheduler/queue`` cannot gang a submitter made after the
                       label                                cluster)
scheduler-plugins      ``schedulerName: scheduler-plugins-  with label ``ray.io/gang-scheduling-
                       scheduler``; with the gang label,    enabled`` a ``scheduling.x-k8s.io``
                       ``scheduling.x-k8s.io/pod-group:     PodGroup named after the RayCluster;
                       <cluster>``                          refuses every RayJob
=====================  ===================================  =========================================
"""

from __future__ import annotations

from typing import Any, Literal, Mapping

from shared.kernel import kube
from shared.kernel import quantity as q

Setting = Literal["none", "volcano", "kai-scheduler", "scheduler-plugins"]
SETTINGS: tuple[Setting, ...] = ("none", "volcano", "kai-scheduler", "scheduler-plugins")

VOLCANO_QUEUE = "volcano.sh/queue-name"
VOLCANO_GROUP, VOLCANO_TASK = kube.VOLCANO_GROUP, kube.VOLCANO_TASK  # the pod annotations admission reads
KAI_QUEUE = "kai.scheduler/queue"
PRIORITY_CLASS = "ray.io/priority-class-name"
GANG_ENABLED = "ray.io/gang-scheduling-enabled"
LEGACY_SCHEDULER = "ray.io/scheduler-name"
"""The RayCluster label older KubeRay (``--enable-batch-scheduler``) read; a scenario that sets it
to ``volcano`` asks for Volcano."""


def _meta_map(obj: dict, field: str) -> dict[str, str]:
    """``metadata.labels`` or ``metadata.annotations`` of an object being made, to write into."""
    meta = obj.setdefault("metadata", {})
    values = meta.get(field)
    if not isinstance(values, dict):
        values = meta[field] = {}
    return values


def _labels(obj: dict) -> dict[str, str]:
    return _meta_map(obj, "labels")


def _annotations(obj: dict) -> dict[str, str]:
    return _meta_map(obj, "annotations")


def _set_scheduler(child: dict, name: str) -> None:
    """``schedulerName`` on a Pod or a pod template (``AddSchedulerNameToObject``); a RayCluster has none."""
    if child.get("kind") == "RayCluster":
        return
    spec = child.setdefault("spec", {})
    if isinstance(spec, dict):
        spec["schedulerName"] = name


def _from_job(obj: Mapping[str, Any]) -> bool:
    return kube.labels(obj).get(kube.RAY_ORIGIN_KIND) == "RayJob"


class BatchScheduler:
    """``--batch-scheduler`` unset: KubeRay leaves pods to the scheduler their template names."""

    setting: Setting = "none"
    pod_scheduler: str = kube.DEFAULT_SCHEDULER
    """The ``schedulerName`` KubeRay's pods get (for none: what the API server gives a pod naming none)."""
    makes_pod_groups = False
    """Whether ``submission`` needs the gang KubeRay computes (the simulator skips the arithmetic otherwise)."""

    def refusal(self, job: Mapping[str, Any]) -> str | None:
        """Why the plugin's ``DoBatchSchedulingOnSubmission`` errors for this RayJob, or None."""
        return None

    def submission(self, obj: Mapping[str, Any], desired: tuple[int, q.Resources] | None) -> dict | None:
        """The PodGroup to create or resize for a RayCluster/RayJob, or None. ``desired`` is the gang
        KubeRay computes (minMember, minResources), None when the spec is one KubeRay refuses."""
        return None

    def decorate(self, parent: Mapping[str, Any], child: dict, group: str) -> None:
        """Tie ``child`` (a pod, pod template or RayCluster) to the scheduler."""

    def completion(self, job: Mapping[str, Any], left: tuple[int, q.Resources]) -> dict | None:
        """The PodGroup a finished RayJob's cluster leaves behind, resized, or None."""
        return None


class Volcano(BatchScheduler):
    """``volcano/volcano_scheduler.go``."""

    setting: Setting = "volcano"
    pod_scheduler = "volcano"
    makes_pod_groups = True

    @staticmethod
    def group_name(obj: Mapping[str, Any]) -> str:
        """``getAppPodGroupName``: the RayJob's name for a cluster a RayJob made."""
        labels = kube.labels(obj)
        name = kube.meta(obj).get("name", "")
        if _from_job(obj) and labels.get(kube.RAY_ORIGIN_NAME):
            name = labels[kube.RAY_ORIGIN_NAME]
        return f"ray-{name}-pg"

    def refusal(self, job: Mapping[str, Any]) -> str | None:
        spec = kube.mapping(job.get("spec"))
        if not isinstance(spec.get("rayClusterSpec"), Mapping):
            m = kube.meta(job)
            return (f"gang scheduling does not support RayJob {m.get('namespace')}/{m.get('name')} referencing "
                    f"an existing RayCluster")
        return None

    def submission(self, obj: Mapping[str, Any], desired: tuple[int, q.Resources] | None) -> dict | None:
        if obj.get("kind") == "RayCluster" and _from_job(obj):
            return None  # the RayJob's PodGroup covers it
        if desired is None:
            return None
        return self._pod_group(obj, *desired)

    def completion(self, job: Mapping[str, Any], left: tuple[int, q.Resources]) -> dict | None:
        return self._pod_group(job, *left)

    def _pod_group(self, owner: Mapping[str, Any], min_member: int, resources: q.Resources) -> dict:
        m, labels = kube.meta(owner), kube.labels(owner)
        spec: dict[str, Any] = {"minMember": min_member, "minResources": q.format_resources(resources)}
        if labels.get(VOLCANO_QUEUE):
            spec["queue"] = labels[VOLCANO_QUEUE]
        if labels.get(PRIORITY_CLASS):
            spec["priorityClassName"] = labels[PRIORITY_CLASS]
        return {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
                "metadata": {"name": self.group_name(owner), "namespace": m.get("namespace"),
                             "annotations": dict(kube.annotations(owner)), "ownerReferences": [_controller(owner)]},
                "spec": spec}

    def decorate(self, parent: Mapping[str, Any], child: dict, group: str) -> None:
        parent_labels = kube.labels(parent)
        labels = _labels(child)
        for key in (VOLCANO_QUEUE, PRIORITY_CLASS):
            if parent_labels.get(key):
                labels[key] = parent_labels[key]
        annotations = _annotations(child)
        annotations[VOLCANO_GROUP] = self.group_name(parent)
        annotations[VOLCANO_TASK] = group
        _set_scheduler(child, self.pod_scheduler)


class Kai(BatchScheduler):
    """``kai-scheduler/kai_scheduler.go``: KAI's own pod grouper makes the PodGroups."""

    setting: Setting = "kai-scheduler"
    pod_scheduler = "kai-scheduler"

    def refusal(self, job: Mapping[str, Any]) -> str | None:
        mode = kube.mapping(job.get("spec")).get("submissionMode") or "K8sJobMode"
        if mode == "K8sJobMode":
            return ("KAI-Scheduler does not support RayJob with K8sJobMode: the submitter pod is created after "
                    "RayCluster is ready, preventing proper gang scheduling")
        return None

    def decorate(self, parent: Mapping[str, Any], child: dict, group: str) -> None:
        _set_scheduler(child, self.pod_scheduler)
        queue = kube.labels(parent).get(KAI_QUEUE)
        if queue:
            _labels(child)[KAI_QUEUE] = queue


class SchedulerPlugins(BatchScheduler):
    """``scheduler-plugins/scheduler_plugins.go`` (coscheduling as a second scheduler)."""

    setting: Setting = "scheduler-plugins"
    pod_scheduler = "scheduler-plugins-scheduler"
    makes_pod_groups = True

    def refusal(self, job: Mapping[str, Any]) -> str | None:
        return "currently only RayCluster is supported, got *v1.RayJob"

    def submission(self, obj: Mapping[str, Any], desired: tuple[int, q.Resources] | None) -> dict | None:
        if GANG_ENABLED not in kube.labels(obj) or desired is None:
            return None
        m = kube.meta(obj)
        return {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
                "metadata": {"name": m.get("name"), "namespace": m.get("namespace"),
                             "ownerReferences": [{"apiVersion": obj.get("apiVersion", "ray.io/v1"), "kind": obj["kind"],
                                                  "name": m.get("name"), "uid": m.get("uid")}]},
                "spec": {"minMember": desired[0], "minResources": q.format_resources(desired[1])}}

    def decorate(self, parent: Mapping[str, Any], child: dict, group: str) -> None:
        if GANG_ENABLED in kube.labels(parent):
            _labels(child)[kube.POD_GROUP_X] = str(kube.meta(parent).get("name", ""))
        _set_scheduler(child, self.pod_scheduler)


def _controller(owner: Mapping[str, Any]) -> dict[str, Any]:
    m = kube.meta(owner)
    return {"apiVersion": owner.get("apiVersion", "ray.io/v1"), "kind": owner.get("kind"), "name": m.get("name"),
            "uid": m.get("uid"), "controller": True, "blockOwnerDeletion": True}


PLUGINS: dict[str, type[BatchScheduler]] = {
    "none": BatchScheduler, "volcano": Volcano, "kai-scheduler": Kai, "scheduler-plugins": SchedulerPlugins,
}


def plugin(setting: Setting) -> BatchScheduler:
    """The plugin for a ``--batch-scheduler`` setting."""
    return PLUGINS[setting]()


def implied(workloads: list[Mapping[str, Any]]) -> Setting:
    """The setting a scenario's manifests imply, for scenarios that do not say: the dialect label of
    the first RayCluster or RayJob that carries one (``volcano.sh/queue-name`` or ``ray.io/scheduler-name:
    volcano`` -> volcano, ``kai.scheduler/queue`` -> kai-scheduler), unless KubeRay with that setting
    would refuse one of the scenario's RayJobs (KAI and K8sJobMode); else none. So every scenario
    written before the setting existed runs as it did."""
    for obj in workloads:
        labels = kube.labels(obj)
        if labels.get(VOLCANO_QUEUE) or labels.get(LEGACY_SCHEDULER) == "volcano":
            candidate: Setting = "volcano"
        elif labels.get(KAI_QUEUE):
            candidate = "kai-scheduler"
        else:
            continue
        chosen = plugin(candidate)
        if any(chosen.refusal(job) for job in workloads if job.get("kind") == "RayJob"):
            return "none"
        return candidate
    return "none"
