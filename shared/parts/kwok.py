"""KWOK's configuration for the dev cluster, and the nodes it manages.

KWOK plays the kubelets: it manages the nodes annotated ``kwok.x-k8s.io/node: fake`` and moves
nodes and pods through *stages*. Run standalone it has none of its own (kwokctl supplies them), so
these are the dev cluster's, written after KWOK's ``kustomize/stage`` sets ``node/fast``,
``node/heartbeat-with-lease`` and ``pod/fast``:

- ``node-initialize``: a node that is not Ready becomes Ready, its capacity and allocatable kept;
- ``node-heartbeat-with-lease``: the node's status is refreshed every 10 minutes (its Lease, which
  KWOK renews on its own, is the heartbeat the node lifecycle controller reads);
- ``pod-ready``: a bound pod turns Running and Ready at once, unless it carries ``HOLD`` (a
  scenario's run holds it for ``pod_startup`` of scenario time, ``shared.kubernetes.realcluster``);
- no stage ends a running pod: a RayJob's submitter (a Job's pod) runs until its RayJob goes, as the
  submitter of a Ray job that never ends would. Real KubeRay, which cannot reach a Ray dashboard on
  KWOK, keeps such a RayJob Running; a submitter that ended would make it Failed 30 s of wall time
  later (``DefaultSubmitterFinishedTimeout``, ray-operator/controllers/ray/rayjob_controller.go);
- ``pod-delete``: a pod being deleted goes (its grace period is the kubelet's, and there is none);
- ``gpu-reservation``: a GPU reservation pod of KAI's binder (namespace and ``app`` label
  ``kai-resource-reservation``) is annotated with the GPU index it holds, ``0``, as the program it
  runs on a real GPU node annotates itself with the device it was given (``shared.parts.kai``).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

ANNOTATION = "kwok.x-k8s.io/node"

HOLD = "muster.dev/kubelet-hold"
"""A bound pod with this annotation stays Pending (``pod-ready`` waits): ``muster simulate --cluster``
binds with it and takes it away ``pod_startup`` seconds of scenario time later, as the simulated
kubelet starts a pod; without it a bound pod runs at once."""

_CONDITIONS = """\
      conditions:
      {{ range NodeConditions }}
      - lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $lastTransitionTime | Quote }}
        message: {{ .message | Quote }}
        reason: {{ .reason | Quote }}
        status: {{ .status | Quote }}
        type: {{ .type | Quote }}
      {{ end }}
"""

STAGES = f"""\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {{name: node-initialize}}
spec:
  resourceRef: {{apiGroup: v1, kind: Node}}
  selector:
    matchExpressions:
    - {{key: '.status.conditions.[] | select( .type == "Ready" ) | .status', operator: NotIn, values: ['True']}}
  next:
    statusTemplate: |
      {{{{ $now := Now }}}}
      {{{{ $lastTransitionTime := or .metadata.creationTimestamp $now }}}}
{_CONDITIONS}      addresses:
      - {{address: {{{{ NodeIP | Quote }}}}, type: InternalIP}}
      - {{address: {{{{ NodeName | Quote }}}}, type: Hostname}}
      allocatable:
      {{{{ with .status.allocatable }}}}
      {{{{ YAML . 1 }}}}
      {{{{ else }}}}
        cpu: "1k"
        memory: 1Ti
        pods: "1M"
      {{{{ end }}}}
      capacity:
      {{{{ with .status.capacity }}}}
      {{{{ YAML . 1 }}}}
      {{{{ else }}}}
        cpu: "1k"
        memory: 1Ti
        pods: "1M"
      {{{{ end }}}}
      nodeInfo:
        architecture: amd64
        kubeletVersion: {{{{ printf "kwok-%s" Version | Quote }}}}
        kubeProxyVersion: {{{{ printf "kwok-%s" Version | Quote }}}}
        containerRuntimeVersion: {{{{ printf "kwok-%s" Version | Quote }}}}
        kernelVersion: {{{{ printf "kwok-%s" Version | Quote }}}}
        operatingSystem: linux
      phase: Running
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {{name: node-heartbeat-with-lease}}
spec:
  resourceRef: {{apiGroup: v1, kind: Node}}
  selector:
    matchExpressions:
    - {{key: '.status.phase', operator: In, values: [Running]}}
    - {{key: '.status.conditions.[] | select( .type == "Ready" ) | .status', operator: In, values: ['True']}}
  delay: {{durationMilliseconds: 600000, jitterDurationMilliseconds: 610000}}
  next:
    statusTemplate: |
      {{{{ $now := Now }}}}
      {{{{ $lastTransitionTime := or .metadata.creationTimestamp $now }}}}
{_CONDITIONS}---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {{name: pod-ready}}
spec:
  resourceRef: {{apiGroup: v1, kind: Pod}}
  selector:
    matchExpressions:
    - {{key: '.metadata.deletionTimestamp', operator: DoesNotExist}}
    - {{key: '.metadata.annotations["{HOLD}"]', operator: DoesNotExist}}
    - {{key: '.status.phase', operator: In, values: [Pending]}}
    - {{key: '.status.conditions.[] | select( .type == "Ready" ) | .status', operator: NotIn, values: ['True']}}
  next:
    statusTemplate: |
      {{{{ $now := Now }}}}
      conditions:
      - {{lastTransitionTime: {{{{ $now | Quote }}}}, status: "True", type: Initialized}}
      - {{lastTransitionTime: {{{{ $now | Quote }}}}, status: "True", type: Ready}}
      - {{lastTransitionTime: {{{{ $now | Quote }}}}, status: "True", type: ContainersReady}}
      - {{lastTransitionTime: {{{{ $now | Quote }}}}, status: "True", type: PodScheduled}}
      containerStatuses:
      {{{{ range .spec.containers }}}}
      - image: {{{{ .image | Quote }}}}
        name: {{{{ .name | Quote }}}}
        ready: true
        restartCount: 0
        started: true
        state:
          running:
            startedAt: {{{{ $now | Quote }}}}
      {{{{ end }}}}
      {{{{ with NodeIPsWith .spec.nodeName }}}}
      hostIP: {{{{ index . 0 | Quote }}}}
      {{{{ end }}}}
      {{{{ with PodIPsWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) }}}}
      podIP: {{{{ index . 0 | Quote }}}}
      {{{{ end }}}}
      phase: Running
      startTime: {{{{ $now | Quote }}}}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {{name: pod-delete}}
spec:
  resourceRef: {{apiGroup: v1, kind: Pod}}
  selector:
    matchExpressions:
    - {{key: '.metadata.deletionTimestamp', operator: Exists}}
  next:
    finalizers: {{empty: true}}
    delete: true
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {{name: gpu-reservation}}
spec:
  resourceRef: {{apiGroup: v1, kind: Pod}}
  selector:
    matchLabels: {{app: kai-resource-reservation}}
    matchExpressions:
    - {{key: '.metadata.namespace', operator: In, values: [kai-resource-reservation]}}
    - {{key: '.metadata.deletionTimestamp', operator: DoesNotExist}}
    - {{key: '.metadata.annotations["run.ai/reserve_for_gpu_index"]', operator: DoesNotExist}}
  next:
    patches:
    - type: merge
      template: |
        metadata:
          annotations:
            run.ai/reserve_for_gpu_index: "0"
"""


def node(name: str, capacity: Mapping[str, str], *, labels: Mapping[str, str] | None = None,
         taints: Sequence[Mapping[str, Any]] = (), unschedulable: bool = False) -> dict[str, Any]:
    """A Node KWOK manages: ``capacity`` is also its allocatable (``pods`` defaults to 110)."""
    resources = {"pods": "110", **{k: str(v) for k, v in capacity.items()}}
    spec: dict[str, Any] = {}
    if taints:
        spec["taints"] = [dict(t) for t in taints]
    if unschedulable:
        spec["unschedulable"] = True
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {ANNOTATION: "fake"},
                         "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                    "type": "kwok", **dict(labels or {})}},
            "spec": spec, "status": {"capacity": resources, "allocatable": dict(resources)}}
