"""KubeRay, simulated: RayClusters get pods, RayJobs get a cluster, a submitter, a run time and an end.

Both controllers are level-triggered like the real operator: ``sync_cluster``/``sync_job`` look
at the object as it is now, create or delete what is missing or extra, and write status only when
it changes, so running them again changes nothing. Pod-name suffixes are hashes of the slot and
how often it was filled (``kube.short_hash``), never random.
"""

from __future__ import annotations

import copy
from datetime import datetime, timedelta, timezone
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping, NamedTuple

from shared.kernel import kube
from shared.kernel import quantity as q
from shared.kernel.duration import parse_duration
from shared.sim.batchscheduler import BatchScheduler

if TYPE_CHECKING:
    from shared.sim.cluster import ApiServer

DURATION = "muster.dev/sim-duration"
OUTCOME = "muster.dev/sim-outcome"
HEAD_GROUP = "headgroup"
SUBMITTER = kube.SUBMITTER
SUBMITTER_CONTAINER = "ray-job-submitter"
SUBMITTER_REQUESTS = {"cpu": "500m", "memory": "200Mi"}
SUBMITTER_LIMITS = {"cpu": "1", "memory": "1Gi"}
FINISH_TIMER = "sim/rayjob-finish|"
TTL_TIMER = "sim/rayjob-ttl|"
MAX_REPLICAS = 2**31 - 1
"""KubeRay's default maxReplicas."""

_FINISHED = ("Complete", "Failed")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


@lru_cache(maxsize=64)  # everything that happens at one instant is stamped with it: strftime once
def timestamp(now: float) -> str:
    """Scenario time as an RFC 3339 timestamp counted from the epoch (deterministic, no wall clock)."""
    return (_EPOCH + timedelta(seconds=now)).strftime("%Y-%m-%dT%H:%M:%SZ")


# --------------------------------------------------------------------------- manifest knobs
def sim_duration(job: Mapping[str, Any]) -> float | None:
    """How long the RayJob's entrypoint runs; None (until deleted) without the annotation."""
    raw = kube.annotations(job).get(DURATION)
    if raw is None:
        return None
    return parse_duration(raw, where=f"annotation {DURATION}")


def sim_outcome(job: Mapping[str, Any]) -> Literal["Succeeded", "Failed"]:
    """How the RayJob ends (annotation ``muster.dev/sim-outcome``, default Succeeded)."""
    raw = kube.annotations(job).get(OUTCOME, "Succeeded")
    for outcome in ("Succeeded", "Failed"):
        if str(raw).lower() == outcome.lower():
            return outcome  # type: ignore[return-value]
    raise ValueError(f"annotation {OUTCOME}: {raw!r} must be Succeeded or Failed")


# --------------------------------------------------------------------------- desired pods
class PodSlot(NamedTuple):
    """One pod a RayCluster wants: head, or worker ``index`` of ``group``. A tuple: every sync of a
    cluster lists its slots again, and a frozen dataclass cost several times as much to make."""

    node_type: Literal["head", "worker"]
    group: str
    index: int
    template: Mapping[str, Any]


def _count(group: Mapping[str, Any], field: str, default: int) -> int | None:
    value = group.get(field, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _template(spec: object) -> Mapping[str, Any] | None:
    template = spec.get("template") if isinstance(spec, Mapping) else None
    ok = isinstance(template, Mapping) and isinstance(template.get("spec"), Mapping)
    return template if ok else None


def worker_count(group: Mapping[str, Any]) -> int | None:
    """KubeRay's desired pods of a worker group (``utils.GetWorkerGroupDesiredReplicas``): clamp(replicas,
    minReplicas, maxReplicas) × numOfHosts whether in-tree autoscaling is on or not (the Ray autoscaler
    moves ``replicas``; a scenario edits it to play the autoscaler); None when the group is invalid."""
    replicas, low = _count(group, "replicas", 0), _count(group, "minReplicas", 0)
    high, hosts = _count(group, "maxReplicas", MAX_REPLICAS), _count(group, "numOfHosts", 1)
    if replicas is None or low is None or high is None or hosts is None or low > high:
        return None
    if group.get("suspend") is True:
        return 0
    return min(max(replicas, low), high) * hosts


MAX_SIM_PODS = 20_000
"""The simulator will not create more pods than this for one cluster (``replicas: 3000000`` would
exhaust memory); such a cluster gets no pods, as if KubeRay refused it. Admission rejects it anyway."""


def pod_slots(spec: object) -> list[PodSlot] | None:
    """Every pod the cluster spec asks for, head first; None when KubeRay would refuse the spec."""
    if not isinstance(spec, Mapping):
        return None
    head = _template(spec.get("headGroupSpec"))
    groups = spec.get("workerGroupSpecs") or []
    if head is None or not isinstance(groups, list):
        return None
    slots = [PodSlot("head", HEAD_GROUP, 0, head)]
    for group in groups:
        template = _template(group)
        name = group.get("groupName") if isinstance(group, Mapping) else None
        count = worker_count(group) if template is not None else None
        if not isinstance(name, str) or not name or count is None or template is None:
            return None
        if len(slots) + count > MAX_SIM_PODS:
            return None
        slots.extend(PodSlot("worker", name, i, template) for i in range(count))
    return slots


# --------------------------------------------------------------------------- helpers
def _strings(values: object) -> dict[str, str]:
    return {str(k): str(v) for k, v in values.items()} if isinstance(values, Mapping) else {}


def _status(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    status = obj.get("status")
    return status if isinstance(status, Mapping) else {}


def _phase(pod: Mapping[str, Any] | None) -> str:
    return str(_status(pod).get("phase", "")) if pod is not None else ""


def _owner_ref(owner: Mapping[str, Any]) -> dict[str, Any]:
    m = kube.meta(owner)
    return {"apiVersion": owner.get("apiVersion", "ray.io/v1"), "kind": owner["kind"], "name": m["name"],
            "uid": m["uid"], "controller": True, "blockOwnerDeletion": True}


def _owned(obj: Mapping[str, Any] | None, owner_uid: str) -> bool:
    refs = (kube.meta(obj).get("ownerReferences") or []) if obj is not None else []
    return any(ref.get("uid") == owner_uid for ref in refs)


def submitter_container(image: str) -> dict[str, Any]:
    """KubeRay's default submitter: 500m CPU / 200Mi requested."""
    return {"name": SUBMITTER_CONTAINER, "image": image,
            "resources": {"requests": dict(SUBMITTER_REQUESTS), "limits": dict(SUBMITTER_LIMITS)}}


def _head_image(cluster_spec: object) -> str:
    head = _template(cluster_spec.get("headGroupSpec")) if isinstance(cluster_spec, Mapping) else None
    containers = head["spec"].get("containers") if head is not None else None
    if isinstance(containers, list) and containers and isinstance(containers[0], Mapping):
        return str(containers[0].get("image", "rayproject/ray"))
    return "rayproject/ray"


def _set_status(**values: Any) -> Callable[[dict], None]:
    """A patch that sets status fields (None removes one)."""
    def change(obj: dict) -> None:
        status = dict(_status(obj))
        for name, value in values.items():
            if value is None:
                status.pop(name, None)
            else:
                status[name] = value
        if status or "status" in obj:
            obj["status"] = status
    return change


def desired_gang(cluster_spec: object) -> tuple[int, q.Resources] | None:
    """What KubeRay's Volcano and scheduler-plugins plugins put in a PodGroup for a cluster spec
    (``calculatePodGroupParams``): with in-tree autoscaling head + Σ minReplicas × numOfHosts and
    their requests (``CalculateMinReplicas``, ``CalculateMinResources``), else head + the desired
    workers (``CalculateDesiredReplicas``, clamped) and the requests of ``replicas`` × numOfHosts as
    written (``CalculateDesiredResources`` does not clamp); suspended groups count nothing. None when
    KubeRay would refuse the spec."""
    if pod_slots(cluster_spec) is None:
        return None
    assert isinstance(cluster_spec, Mapping)
    autoscaling = cluster_spec.get("enableInTreeAutoscaling") is True
    try:
        total = kube.pod_requests(_template(cluster_spec.get("headGroupSpec"))["spec"])  # type: ignore[index]
        members = 1
        for group in cluster_spec.get("workerGroupSpecs") or []:
            if group.get("suspend") is True:
                continue
            hosts = _count(group, "numOfHosts", 1) or 0
            if autoscaling:
                count = charged = (_count(group, "minReplicas", 0) or 0) * hosts
            else:
                count, charged = worker_count(group) or 0, (_count(group, "replicas", 0) or 0) * hosts
            members += count
            total = q.add(total, kube.pod_requests(group["template"]["spec"]), charged)
    except (q.QuantityError, AttributeError, TypeError, ValueError, ArithmeticError, KeyError):
        return None
    return members, total


def submitter_requests(job: Mapping[str, Any]) -> q.Resources:
    """The submitter's requests, which a RayJob's PodGroup reserves on top of its cluster
    (``getSubmitterResource``): the submitter template's (K8sJobMode), the default container's
    (SidecarMode), nothing otherwise."""
    spec = kube.mapping(job.get("spec"))
    mode = spec.get("submissionMode") or "K8sJobMode"
    template = _template({"template": spec.get("submitterPodTemplate")})
    try:
        if mode == "K8sJobMode" and template is not None:
            return kube.pod_requests(template["spec"])
        if mode in ("K8sJobMode", "SidecarMode"):
            return kube.pod_requests({"containers": [submitter_container("")]})
    except (q.QuantityError, AttributeError, TypeError, ValueError, ArithmeticError):
        pass
    return {}


class KubeRay:
    """The RayCluster and RayJob controllers, with one ``--batch-scheduler`` plugin (``batchscheduler``)."""

    def __init__(self, api: ApiServer, batch: BatchScheduler) -> None:
        self.api = api
        self.batch = batch
        self._slot_pods: dict[tuple[str, str], dict[tuple[str, int], str]] = {}
        """(namespace, cluster) -> (group, index) -> name of the pod that fills the slot now: by cluster, so
        a deletion drops its cluster's slots without a scan of every cluster's."""
        self._generations: dict[tuple[str, ...], int] = {}
        """How often a slot (or a job's submitter) was filled; survives deletion, so names never repeat."""
        self._submitters: dict[tuple[str, str], str] = {}
        self._runs: dict[str, int] = {}
        """RayJob uid -> how often it started running (a finish timer of an older run is stale)."""
        self._desired_by_uid: dict[str, tuple[int, tuple[int, q.Resources] | None]] = {}
        """RayCluster uid -> (generation, its desired gang): KubeRay's arithmetic once per spec."""

    def forget(self, kind: str, namespace: str, name: str, uid: str) -> None:
        """An object is gone: drop what pointed at it (a slot's or a job's current pod, a job's runs).
        ``_generations`` stays, so a cluster or job made again under the name never repeats a pod name."""
        if kind == "RayCluster":
            self._slot_pods.pop((namespace, name), None)
        elif kind == "RayJob":
            self._submitters.pop((namespace, name), None)
            self._runs.pop(uid, None)

    # ------------------------------------------------------------------ RayCluster
    def sync_cluster(self, namespace: str, name: str, now: float) -> None:
        """Make the cluster's pods match its spec and report ``status.state``."""
        cluster = self.api.obj("RayCluster", namespace, name)
        if cluster is None:
            return  # its pods went with it (owner garbage collection)
        spec = cluster.get("spec")
        suspended = isinstance(spec, Mapping) and spec.get("suspend") is True
        slots = [] if suspended else pod_slots(spec)
        if slots is None:
            return  # KubeRay would refuse this spec: it creates nothing and deletes nothing
        if not suspended and self.batch.makes_pod_groups:
            self._ensure_pod_group(self.batch.submission(cluster, self._desired(cluster)), now)
        wanted = [self._ensure_pod(cluster, slot, now) for slot in slots]
        keep = set(wanted)
        uid = kube.meta(cluster)["uid"]
        for pod in list(self.api.owned_by(uid)):
            if pod["kind"] == "Pod" and kube.meta(pod)["name"] not in keep:
                self.api.remove("Pod", namespace, kube.meta(pod)["name"])
        ready = bool(wanted) and all(_phase(self.api.obj("Pod", namespace, n)) == "Running" for n in wanted)
        state = "suspended" if suspended else ("ready" if ready else None)
        self.api.patch("RayCluster", namespace, name, _set_status(state=state))

    def _desired(self, cluster: Mapping[str, Any]) -> tuple[int, q.Resources] | None:
        """``desired_gang`` of the cluster's spec, computed once per spec generation (a sync runs often)."""
        m = kube.meta(cluster)
        uid, generation = str(m.get("uid")), int(m.get("generation") or 0)
        known = self._desired_by_uid.get(uid)
        if known is None or known[0] != generation:
            known = self._desired_by_uid[uid] = (generation, desired_gang(cluster.get("spec")))
        return known[1]

    def _ensure_pod(self, cluster: Mapping[str, Any], slot: PodSlot, now: float) -> str:
        """The name of the pod filling ``slot``, created (with a fresh name) if it is missing."""
        m = kube.meta(cluster)
        namespace, name, uid = m["namespace"], m["name"], m["uid"]
        slot_key = (namespace, name, slot.group, slot.index)
        slots = self._slot_pods.get((namespace, name))
        current = None if slots is None else slots.get((slot.group, slot.index))
        if current and _owned(self.api.obj("Pod", namespace, current), uid):
            return current
        while True:
            generation = self._generations.get(slot_key, 0)
            self._generations[slot_key] = generation + 1
            suffix = kube.short_hash(name, slot.group, slot.index, generation)
            pod_name = f"{name}-head-{suffix}" if slot.node_type == "head" else f"{name}-{slot.group}-worker-{suffix}"
            if self.api.obj("Pod", namespace, pod_name) is None:
                break
        pod = self._ray_pod(cluster, slot, pod_name)
        if kube.pod_spec_problem(pod["spec"]) is not None or self.api.admit_pod(pod) is not None:
            return pod_name  # the API server refuses it: KubeRay's create fails, and it tries again next sync
        self.api.create(pod, now)
        self._slot_pods.setdefault((namespace, name), {})[(slot.group, slot.index)] = pod_name
        return pod_name

    def _ray_pod(self, cluster: Mapping[str, Any], slot: PodSlot, pod_name: str) -> dict[str, Any]:
        """A pod as KubeRay's ``labelPod`` labels it: its RayCluster, node type and group, never the RayJob
        the cluster was made for (ingest finds that, ``services.reconciler.owners``); a head of a cluster
        with in-tree autoscaling gets KubeRay's autoscaler container (``kube.autoscaler_container``)."""
        m = kube.meta(cluster)
        template_meta = slot.template.get("metadata")
        template_meta = template_meta if isinstance(template_meta, Mapping) else {}
        labels = {**_strings(template_meta.get("labels")),
                  kube.RAY_CLUSTER: m["name"], kube.RAY_NODE_TYPE: slot.node_type, kube.RAY_GROUP: slot.group}
        spec = dict(slot.template["spec"])
        autoscaler = kube.autoscaler_container(cluster.get("spec") or {}) if slot.node_type == "head" else None
        if autoscaler is not None and isinstance(spec.get("containers"), list):
            spec["containers"] = [*spec["containers"], {**autoscaler, "image": _head_image(cluster.get("spec"))}]
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": pod_name, "namespace": m["namespace"], "labels": labels,
                            "annotations": _strings(template_meta.get("annotations")),
                            "ownerReferences": [_owner_ref(cluster)]},
               "spec": spec, "status": {"phase": "Pending"}}
        self.batch.decorate(cluster, pod, slot.group)
        return pod

    def _ensure_pod_group(self, pod_group: dict | None, now: float) -> None:
        """Create the plugin's PodGroup, or bring its minMember and minResources up to date (``syncPodGroup``)."""
        if pod_group is None:
            return
        m = pod_group["metadata"]
        live = self.api.obj("PodGroup", m["namespace"], m["name"])
        if live is None:
            self.api.create(pod_group, now)
        elif pod_group["apiVersion"].startswith("scheduling.volcano.sh/"):
            wanted = {k: pod_group["spec"][k] for k in ("minMember", "minResources")}
            spec = kube.mapping(live.get("spec"))
            if any(spec.get(k) != v for k, v in wanted.items()):
                self.api.patch("PodGroup", m["namespace"], m["name"],
                               lambda obj: obj.setdefault("spec", {}).update(copy.deepcopy(wanted)))

    # ------------------------------------------------------------------ RayJob
    def sync_job(self, namespace: str, name: str, now: float) -> None:
        """Walk the RayJob through Suspended -> Initializing -> Running (the end comes from a timer)."""
        job = self.api.obj("RayJob", namespace, name)
        if job is None or not isinstance(job.get("spec"), Mapping):
            return
        spec = job["spec"]
        deployment = _status(job).get("jobDeploymentStatus", "")
        if deployment in _FINISHED:
            return
        selected = self._selected_cluster(spec)
        cluster_name = selected or kube.rayjob_cluster_name(name)
        if spec.get("suspend") is True:
            self._tear_down(job, None if selected else cluster_name)
            self._patch_job(job, jobDeploymentStatus="Suspended", jobStatus=None, rayClusterName=None,
                            startTime=None)
            return
        if deployment in ("", "New", "Suspended", "Initializing"):
            refusal = self.batch.refusal(job)
            if refusal is not None:  # KubeRay's reconcile errors and requeues: no cluster, ever
                self._patch_job(job, jobDeploymentStatus="Initializing", jobStatus=None, rayClusterName=None,
                                startTime=None)
                return
            if not selected and self.batch.makes_pod_groups:
                desired = desired_gang(spec.get("rayClusterSpec"))
                if desired is not None:
                    desired = (desired[0], q.add(desired[1], submitter_requests(job)))
                self._ensure_pod_group(self.batch.submission(job, desired), now)
        cluster = self.api.obj("RayCluster", namespace, cluster_name)
        if cluster is None and not selected:
            cluster = self._create_cluster(job, cluster_name, now)
        initializing = {"jobDeploymentStatus": "Initializing", "jobStatus": None, "startTime": None,
                        "rayClusterName": cluster_name if cluster is not None else None}
        if cluster is None or _status(cluster).get("state") != "ready":
            self._patch_job(job, **initializing)
            return
        if (spec.get("submissionMode") or "K8sJobMode") == "K8sJobMode":
            if _phase(self._ensure_submitter(job, now)) != "Running":
                self._patch_job(job, **initializing)
                return
        if deployment != "Running":
            self._start(job, cluster_name, now)

    def _start(self, job: Mapping[str, Any], cluster_name: str, now: float) -> None:
        m = kube.meta(job)
        run = self._runs[m["uid"]] = self._runs.get(m["uid"], 0) + 1
        self._patch_job(job, jobDeploymentStatus="Running", jobStatus="RUNNING", rayClusterName=cluster_name,
                        startTime=timestamp(now))
        try:
            duration = sim_duration(job)
        except ValueError:
            duration = None  # refused at apply; a later in-place edit cannot make the sim fail
        if duration is not None:
            self.api.request_timer(now + duration, f"{FINISH_TIMER}{m['namespace']}|{m['name']}|{m['uid']}|{run}")

    def fire(self, key: str, now: float) -> None:
        """A RayJob's entrypoint finished, or its finished cluster's TTL ran out."""
        prefix, _, rest = key.partition("|")
        parts = rest.split("|")
        if prefix + "|" == FINISH_TIMER and len(parts) == 4:
            namespace, name, uid, run = parts
            job = self.api.obj("RayJob", namespace, name)
            if job is not None and kube.meta(job).get("uid") == uid and str(self._runs.get(uid)) == run \
                    and _status(job).get("jobDeploymentStatus") == "Running":
                self._finish(job, now)
        elif prefix + "|" == TTL_TIMER and len(parts) == 3:
            namespace, name, uid = parts
            job = self.api.obj("RayJob", namespace, name)
            if job is not None and kube.meta(job).get("uid") == uid:
                self._delete_cluster(job, kube.rayjob_cluster_name(name))

    def _finish(self, job: Mapping[str, Any], now: float) -> None:
        m = kube.meta(job)
        failed = sim_outcome_or_default(job) == "Failed"
        self._patch_job(job, jobStatus="FAILED" if failed else "SUCCEEDED",
                        jobDeploymentStatus="Failed" if failed else "Complete", endTime=timestamp(now))
        phase = "Failed" if failed else "Succeeded"
        for pod in self._submitter_pods(job):
            self.api.patch("Pod", m["namespace"], kube.meta(pod)["name"], _set_status(phase=phase))
        spec = job["spec"]
        if not self._selected_cluster(spec) and self.batch.makes_pod_groups:
            cluster = self.api.obj("RayCluster", m["namespace"], kube.rayjob_cluster_name(m["name"]))
            left = desired_gang(cluster.get("spec")) if cluster is not None else None
            self._ensure_pod_group(self.batch.completion(job, left or (0, {})), now)
        if spec.get("shutdownAfterJobFinishes") is not True or self._selected_cluster(spec):
            return
        ttl = spec.get("ttlSecondsAfterFinished", 0)
        ttl = ttl if isinstance(ttl, (int, float)) and not isinstance(ttl, bool) and ttl > 0 else 0
        if ttl:
            self.api.request_timer(now + ttl, f"{TTL_TIMER}{m['namespace']}|{m['name']}|{m['uid']}")
        else:
            self._delete_cluster(job, kube.rayjob_cluster_name(m["name"]))

    def _create_cluster(self, job: Mapping[str, Any], cluster_name: str, now: float) -> dict | None:
        """The job's own RayCluster from ``spec.rayClusterSpec`` (plus the sidecar in SidecarMode)."""
        spec = job["spec"]
        cluster_spec = spec.get("rayClusterSpec")
        if not isinstance(cluster_spec, Mapping):
            return None
        cluster_spec = copy.deepcopy(dict(cluster_spec))
        if spec.get("submissionMode") == "SidecarMode":
            head = _template(cluster_spec.get("headGroupSpec"))
            containers = head["spec"].get("containers") if head is not None else None
            if isinstance(containers, list):
                containers.append(submitter_container(_head_image(cluster_spec)))
        m = kube.meta(job)
        labels = {**_strings(m.get("labels")), kube.RAY_ORIGIN_KIND: "RayJob", kube.RAY_ORIGIN_NAME: m["name"]}
        cluster = {
            "apiVersion": job.get("apiVersion", "ray.io/v1"), "kind": "RayCluster",
            "metadata": {"name": cluster_name, "namespace": m["namespace"], "labels": labels,
                         "annotations": _strings(m.get("annotations")), "ownerReferences": [_owner_ref(job)]},
            "spec": cluster_spec,
        }
        if (spec.get("submissionMode") or "K8sJobMode") == "K8sJobMode":
            self.batch.decorate(job, cluster, "")
        return self.api.create(cluster, now)

    def _ensure_submitter(self, job: Mapping[str, Any], now: float) -> dict | None:
        """The job's submitter pod (K8sJobMode), created with a fresh name if it is missing: KubeRay makes
        a batch/v1 Job named as the RayJob (``createNewK8sJob``), whose controller makes the pod; None
        while a Job of that name is someone else's (KubeRay's create fails, and it tries again)."""
        m = kube.meta(job)
        namespace, name, uid = m["namespace"], m["name"], m["uid"]
        submitter = self.api.obj("Job", namespace, name)
        if submitter is None:
            submitter = self.api.create(self._submitter_job(job), now)
        elif not _owned(submitter, uid):
            return None
        job_uid = kube.meta(submitter)["uid"]
        current = self._submitters.get((namespace, name))
        pod = self.api.obj("Pod", namespace, current) if current else None
        if pod is not None and _owned(pod, job_uid):
            return pod
        slot_key = (namespace, name, SUBMITTER)
        while True:
            generation = self._generations.get(slot_key, 0)
            self._generations[slot_key] = generation + 1
            pod_name = f"{name}-{kube.short_hash(name, SUBMITTER, generation)}"
            if self.api.obj("Pod", namespace, pod_name) is None:
                break
        pod = self._submitter_pod(job, submitter, pod_name)
        if self.api.admit_pod(pod) is not None:
            return None  # the API server refuses it: the Job controller tries again next sync
        self._submitters[(namespace, name)] = pod_name
        return self.api.create(pod, now)

    def _submitter_job(self, job: Mapping[str, Any]) -> dict[str, Any]:
        m = kube.meta(job)
        spec = job["spec"]
        template = _template({"template": spec.get("submitterPodTemplate")})
        template_meta = template.get("metadata") if template is not None else None
        template_meta = template_meta if isinstance(template_meta, Mapping) else {}
        pod_spec = (copy.deepcopy(dict(template["spec"])) if template is not None else
                    {"restartPolicy": "Never",
                     "containers": [submitter_container(_head_image(spec.get("rayClusterSpec")))]})
        pod_template = {"metadata": {"labels": _strings(template_meta.get("labels")),
                                     "annotations": _strings(template_meta.get("annotations"))},
                        "spec": pod_spec}
        self.batch.decorate(job, pod_template, SUBMITTER)
        return {"apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": m["name"], "namespace": m["namespace"],
                             "labels": {kube.RAY_ORIGIN_KIND: "RayJob", kube.RAY_ORIGIN_NAME: m["name"],
                                        "app.kubernetes.io/created-by": "kuberay-operator"},
                             "ownerReferences": [_owner_ref(job)]},
                "spec": {"backoffLimit": 2, "template": pod_template}}

    def _submitter_pod(self, job: Mapping[str, Any], submitter: Mapping[str, Any], pod_name: str) -> dict[str, Any]:
        """The pod the Job controller makes from the submitter Job's template, labelled as it labels them."""
        m, sm = kube.meta(job), kube.meta(submitter)
        template = submitter["spec"]["template"]
        labels = {**template["metadata"]["labels"], kube.JOB_NAME: sm["name"], "job-name": sm["name"],
                  "batch.kubernetes.io/controller-uid": sm["uid"], "controller-uid": sm["uid"]}
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod_name, "namespace": m["namespace"], "labels": labels,
                             "annotations": dict(template["metadata"]["annotations"]),
                             "ownerReferences": [_owner_ref(submitter)]},
                "spec": copy.deepcopy(template["spec"]), "status": {"phase": "Pending"}}

    def _submitter_pods(self, job: Mapping[str, Any]) -> list[dict]:
        m = kube.meta(job)
        submitter = self.api.obj("Job", m["namespace"], m["name"])
        if submitter is None or not _owned(submitter, m["uid"]):
            return []
        return [p for p in self.api.owned_by(kube.meta(submitter)["uid"]) if p["kind"] == "Pod"]

    def _tear_down(self, job: Mapping[str, Any], cluster_name: str | None) -> None:
        """Suspended: no cluster of its own and no submitter."""
        m = kube.meta(job)
        if cluster_name:
            self._delete_cluster(job, cluster_name)
        submitter = self.api.obj("Job", m["namespace"], m["name"])
        if submitter is not None and _owned(submitter, m["uid"]):
            self.api.remove("Job", m["namespace"], m["name"])  # its pods with it

    def _delete_cluster(self, job: Mapping[str, Any], cluster_name: str) -> None:
        m = kube.meta(job)
        if _owned(self.api.obj("RayCluster", m["namespace"], cluster_name), m["uid"]):
            self.api.remove("RayCluster", m["namespace"], cluster_name)

    def _patch_job(self, job: Mapping[str, Any], **status: Any) -> None:
        m = kube.meta(job)
        self.api.patch("RayJob", m["namespace"], m["name"], _set_status(**status))

    @staticmethod
    def _selected_cluster(spec: Mapping[str, Any]) -> str | None:
        """``spec.clusterSelector: {ray.io/cluster: NAME}`` runs the job on an existing cluster."""
        selector = spec.get("clusterSelector")
        name = selector.get(kube.RAY_CLUSTER) if isinstance(selector, Mapping) else None
        return name if isinstance(name, str) and name else None


def sim_outcome_or_default(job: Mapping[str, Any]) -> Literal["Succeeded", "Failed"]:
    """The outcome, Succeeded when the annotation was edited into something unreadable after apply."""
    try:
        return sim_outcome(job)
    except ValueError:
        return "Succeeded"
