"""KAI Scheduler (``github.com/NVIDIA/KAI-scheduler`` v0.12.0) on a dev cluster, run as its operator runs it.

``start(cluster)`` starts KAI's programs (built by ``make tools``, part ``kai``) as parts of a running
``DevCluster`` (``DevCluster.start_part``, as every peer's programs are: a later ``down`` stops them),
each with its own client certificate (user ``kai-<program>``, so the API server's audit log tells
their requests apart), and returns a ``Kai`` handle whose ``stop()`` stops them and takes away what
would outlive them (the admission webhooks). What each program is given is
what KAI's operator gives it by default (``pkg/operator/operands/*/resources*.go`` of the module, the
``Config`` and ``SchedulingShard`` defaults of ``pkg/apis/kai/v1``); the operator itself is not run:

- scheduler: the default shard's configuration (``scheduler_config``: actions allocate, consolidation,
  reclaim, preempt, stalegangeviction; binpack placement for GPUs and CPUs), ``--scheduler-name
  kai-scheduler``, its namespace ``kai-scheduler``;
- binder: the reservation pods' namespace, service account and app label ``kai-resource-reservation``;
- podgrouper: the queue label ``kai.scheduler/queue``, the node-pool label ``kai.scheduler/node-pool``;
  it makes each workload's PodGroup (KubeRay with ``--batch-scheduler=kai-scheduler`` only labels
  the pods with the queue and the scheduler name);
- queuecontroller, podgroupcontroller: the queues' and PodGroups' status;
- admission: the pod mutating and validating webhooks, on a port of our own, with a serving
  certificate the cluster's CA signs, registered by URL (``https://127.0.0.1:PORT``) rather than
  through a Service, with the operator's selectors (every namespace but ``kube-system`` and
  ``kai-scheduler``; only pods whose scheduler is ``kai-scheduler`` are touched).

What differs from an operator install, and why:

- the Queue and PodGroup validating webhooks of queuecontroller and podgroupcontroller are off
  (``--enable-webhook=false``, ``--enable-podgroup-webhook=false``): both serve on controller-runtime's
  fixed port 9443, which no flag moves, so two of them (or another program's) cannot share a host. A
  Queue without ``spec.resources`` is therefore accepted, and a PodGroup's sub-groups are not checked
  for duplicates, cycles or missing parents;
- GPU sharing is on (``--gpu-sharing-enabled=true``, the chart's ``global.gpuSharing``, off by
  default): without it admission rejects every ``gpu-fraction`` pod;
- podgroupcontroller's main is ours (``shared.parts.build.PODGROUPCONTROLLER_MAIN``), KAI's but for
  passing its ``--metrics-bind-address`` on: KAI's gives its manager none, so it took ``:8080`` whatever
  the flag said, and a second KAI (or anything on 8080) made it exit;
- a GPU reservation pod (the binder's, for a fraction's GPU group) runs no program under KWOK: the
  dev cluster's ``gpu-reservation`` KWOK stage (``shared.parts.kwok``) writes the device index the
  real one would read from its GPU and annotate itself with (always ``0``: a node's fraction groups
  are told apart by their group label, which is what the scheduler reads; the index only goes into
  the fraction pods' environment);
- the chart's defaults are applied by ``install_defaults``: its PriorityClasses (train 50,
  build-preemptible 75, build 100, inference 125), its ``default-parent-queue`` / ``default-queue``,
  and the ``nvidia`` RuntimeClass the GPU operator makes (admission sets it on every GPU pod).
"""

from __future__ import annotations

import base64
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import yaml

from shared.parts import catalog
from shared.parts.pki import Authority
from shared.parts.process import Part, PartFailed, free_port, tail

CRDS = ("queues.scheduling.run.ai", "podgroups.scheduling.run.ai", "bindrequests.scheduling.run.ai",
        "topologies.kai.scheduler")
"""The CRDs KAI's programs watch (the dev cluster applies them from the ``crds`` part)."""

if TYPE_CHECKING:
    from shared.parts.devcluster import DevCluster

SCHEDULER_NAME = "kai-scheduler"
NAMESPACE = "kai-scheduler"
QUEUE_LABEL = "kai.scheduler/queue"
NODE_POOL_LABEL = "kai.scheduler/node-pool"
RESERVATION = "kai-resource-reservation"
"""The binder's reservation pods: their namespace, service account and ``app`` label."""
GPU_INDEX_ANNOTATION = "run.ai/reserve_for_gpu_index"
WEBHOOK = "kai-admission"
"""The name of the Mutating- and ValidatingWebhookConfiguration admission serves."""
PROGRAMS = ("queuecontroller", "podgroupcontroller", "podgrouper", "binder", "scheduler", "admission")


def scheduler_config() -> dict[str, Any]:
    """The scheduler's configuration the operator writes for a default SchedulingShard (binpack for GPUs
    and CPUs, no kValue, no min-runtime, no usage database): ``configMapForShard``."""
    plugins: list[dict[str, Any]] = [{"name": name} for name in (
        "predicates", "proportion", "priority", "nodeavailability", "resourcetype", "podaffinity", "elastic",
        "kubeflow", "ray", "subgrouporder", "taskorder", "nominatednode", "dynamicresources", "minruntime",
        "topology", "snapshot", "gpupack")]
    plugins.append({"name": "nodeplacement", "arguments": {"gpu": "binpack", "cpu": "binpack"}})
    plugins.append({"name": "gpusharingorder"})
    return {"actions": "allocate, consolidation, reclaim, preempt, stalegangeviction", "tiers": [{"plugins": plugins}]}


def namespaces() -> list[dict[str, Any]]:
    """KAI's namespace and its reservation pods' (with their ServiceAccount), which the programs need."""
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}} for name in (NAMESPACE, RESERVATION)]
    objects.append({"apiVersion": "v1", "kind": "ServiceAccount",
                    "metadata": {"name": RESERVATION, "namespace": RESERVATION}})
    return objects


def default_objects() -> list[dict[str, Any]]:
    """What KAI's Helm chart installs besides the programs and CRDs (``deployments/kai-scheduler/templates``):
    its PriorityClasses and default queues; and the ``nvidia`` RuntimeClass the GPU operator makes."""
    objects = namespaces()
    objects += [{"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
                 "value": value}
                for name, value in (("train", 50), ("build-preemptible", 75), ("build", 100), ("inference", 125))]
    share = {"quota": 0, "limit": -1, "overQuotaWeight": 1}  # the chart's: no quota, no limit, weight 1
    resources = {"cpu": share, "gpu": share, "memory": share}
    objects.append({"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": "default-parent-queue"},
                    "spec": {"resources": resources}})
    objects.append({"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": "default-queue"},
                    "spec": {"parentQueue": "default-parent-queue", "resources": resources}})
    objects.append({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"},
                    "handler": "nvidia"})
    return objects


def apply(cluster: "DevCluster", objects: list[dict[str, Any]]) -> None:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                    input="\n---\n".join(yaml.safe_dump(o) for o in objects))


def install_defaults(cluster: "DevCluster") -> None:
    """Apply ``default_objects`` (again: ``DevCluster.reset`` deletes PriorityClasses and queues)."""
    apply(cluster, default_objects())


def webhook_configurations(port: int, ca: bytes) -> list[dict[str, Any]]:
    """The operator's pod webhooks (``mutatingWCForKAIConfig``, ``validatingWCForKAIConfig``), by URL."""
    selector = {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                                      "values": ["kube-system", NAMESPACE]}]}
    bundle = base64.b64encode(ca).decode()

    def hook(path: str, operations: list[str]) -> dict[str, Any]:
        return {"name": "admission.run.ai", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                "namespaceSelector": selector, "failurePolicy": "Fail",
                "clientConfig": {"url": f"https://127.0.0.1:{port}{path}", "caBundle": bundle},
                "rules": [{"operations": operations, "apiGroups": [""], "apiVersions": ["v1"],
                           "resources": ["pods"], "scope": "Namespaced"}]}

    mutating = {**hook("/mutate--v1-pod", ["CREATE"]), "reinvocationPolicy": "IfNeeded"}
    return [{"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
             "metadata": {"name": WEBHOOK}, "webhooks": [mutating]},
            {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
             "metadata": {"name": WEBHOOK}, "webhooks": [hook("/validate--v1-pod", ["CREATE", "UPDATE"])]}]


def remove_webhooks(cluster: "DevCluster") -> None:
    """Take KAI's admission webhooks away: they fail closed, so once admission is gone no pod that names
    KAI's scheduler could be created."""
    cluster.kubectl("delete", f"mutatingwebhookconfiguration/{WEBHOOK}", f"validatingwebhookconfiguration/{WEBHOOK}",
                    "--ignore-not-found", check=False)


class Kai:
    """KAI's programs running as a dev cluster's parts; ``stop()`` stops them."""

    def __init__(self, cluster: "DevCluster") -> None:
        self.cluster = cluster
        self.parts: dict[str, Part] = {}
        """The cluster's parts that are KAI's, by name (``kai-scheduler``, ``kai-binder``, ...), in start order."""
        self.ports: dict[str, int] = {}

    def problems(self) -> list[str]:
        """The programs that have exited, with the tail of their logs."""
        return [f"{name} exited: {tail(part.log)}" for name, part in self.parts.items() if not part.alive()]

    def stop(self) -> None:
        """Take the webhooks away (pods could not be created once admission is gone: they fail closed),
        then stop the programs."""
        if "kai-admission" in self.parts:
            remove_webhooks(self.cluster)
        for name in reversed(list(self.parts)):
            self.cluster.stop_part(name)
        self.parts.clear()

    def __enter__(self) -> "Kai":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start(cluster: "DevCluster", *, gpu_sharing: bool = True, defaults: bool = True, timeout: float = 90.0) -> Kai:
    """Start KAI's programs against ``cluster`` (running: ``DevCluster.up``), once each answers its probe.

    ``defaults``: apply the chart's PriorityClasses, queues and the ``nvidia`` RuntimeClass first
    (``install_defaults``). On failure what was started is stopped and ``PartFailed`` names the program."""
    found = cluster.kubectl("get", "crd", *CRDS, check=False)
    if found.returncode != 0:
        raise PartFailed(f"KAI needs the CRDs {', '.join(CRDS)}: {found.stderr.strip()} (a crds part older than "
                         f"KAI's: `make tools` again, then a new cluster)")
    kai = Kai(cluster)
    try:
        apply(cluster, default_objects() if defaults else namespaces())
        for program in PROGRAMS:
            _start(kai, program, gpu_sharing=gpu_sharing, timeout=timeout)
        _register_webhooks(kai)
    except BaseException:
        kai.stop()
        raise
    return kai


def _http_ok(url: str) -> Callable[[], bool]:
    def ready() -> bool:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return bool(answer.status == 200)
    return ready


def _start(kai: Kai, program: str, *, gpu_sharing: bool, timeout: float) -> None:
    cluster = kai.cluster
    name = f"kai-{program}"
    ports = {"metrics": free_port(), "probe": free_port()}
    kai.ports.update({f"{program}_{k}": v for k, v in ports.items()})
    metrics, probe = f"127.0.0.1:{ports['metrics']}", f"127.0.0.1:{ports['probe']}"
    env = {"KUBECONFIG": str(cluster.client(name)), "NAMESPACE": NAMESPACE}
    ready_url = f"http://{probe}/readyz"
    if program == "scheduler":
        conf = cluster.root / "kai-scheduler.yaml"
        conf.write_text(yaml.safe_dump(scheduler_config(), sort_keys=False))
        args = [f"--scheduler-conf={conf}", f"--scheduler-name={SCHEDULER_NAME}", f"--namespace={NAMESPACE}",
                f"--nodepool-label-key={NODE_POOL_LABEL}", "--partition-label-value=",
                f"--resource-reservation-app-label={RESERVATION}", f"--listen-address={metrics}",
                f"--plugin-server-port={ports['probe']}", "--metrics-namespace=kai"]
        ready_url = f"http://{metrics}/metrics"
    elif program == "binder":
        args = ["--scheduler-name", SCHEDULER_NAME, "--resource-reservation-namespace", RESERVATION,
                "--resource-reservation-service-account", RESERVATION, "--resource-reservation-app-label", RESERVATION,
                "--scale-adjust-namespace", "kai-scale-adjust", "--health-probe-bind-address", probe,
                "--metrics-bind-address", metrics, "--cdi-enabled=false"]
        ready_url = f"http://{metrics}/metrics"  # the binder adds no health checks: its probe answers 404
    elif program == "podgrouper":
        args = ["--scheduler-name", SCHEDULER_NAME, "--queue-label-key", QUEUE_LABEL,
                "--nodepool-label-key", NODE_POOL_LABEL, "--metrics-bind-address", metrics,
                "--health-probe-bind-address", probe]
    elif program == "queuecontroller":
        args = ["--queue-label-key", QUEUE_LABEL, "--metrics-listen-address", metrics, "--enable-webhook=false"]
        ready_url = f"http://{metrics}/metrics"
    elif program == "podgroupcontroller":
        args = ["--scheduler-name", SCHEDULER_NAME, "--health-probe-bind-address", probe,
                "--metrics-bind-address", metrics, "--enable-podgroup-webhook=false"]
    else:  # admission
        webhook = free_port()
        kai.ports["admission_webhook"] = webhook
        certs = cluster.root / "kai-admission-tmp" / "k8s-webhook-server" / "serving-certs"
        certs.mkdir(parents=True, exist_ok=True)
        crt, key = Authority(cluster.root / "pki").issue("kai-admission", "kai-admission", server=True,
                                                         hosts=("127.0.0.1", "localhost"))
        (certs / "tls.crt").write_bytes(crt.read_bytes())
        (certs / "tls.key").write_bytes(key.read_bytes())
        # controller-runtime's webhook server reads its certificate from $TMPDIR/k8s-webhook-server/serving-certs
        env["TMPDIR"] = str(cluster.root / "kai-admission-tmp")
        args = ["--scheduler-name", SCHEDULER_NAME, "--webhook-addr", str(webhook),
                "--health-probe-bind-address", probe, "--metrics-bind-address", metrics,
                "--gpu-pod-runtime-class-name", "nvidia"]
        if gpu_sharing:
            args.append("--gpu-sharing-enabled=true")
    part = cluster.start_part(name, [catalog.binary("kai", name), *args], env=env)
    kai.parts[name] = part
    part.wait_until(_http_ok(ready_url), timeout, f"ready at {ready_url}")


def _register_webhooks(kai: Kai) -> None:
    """Admission answers its readiness probe once its webhook server serves (``StartedChecker``)."""
    ca = Path(Authority(kai.cluster.root / "pki").ca_file).read_bytes()
    apply(kai.cluster, webhook_configurations(kai.ports["admission_webhook"], ca))

