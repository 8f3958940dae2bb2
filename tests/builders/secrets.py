"""Manifests with a secret in every place muster must not keep (``services.reconciler.ingest``)."""

from __future__ import annotations

from typing import Any

SECRET = "hunter2-s3cr3t"


def _secret_container(name: str) -> dict:
    return {"name": name, "image": "rayproject/ray:2.9", "command": ["sh", "-c", f"run --token {SECRET}"],
            "args": [SECRET], "env": [{"name": "TOKEN", "value": SECRET}],
            "envFrom": [{"secretRef": {"name": SECRET}}], "volumeMounts": [{"name": SECRET, "mountPath": "/s"}],
            "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "2"}}}


def _secret_template(name: str) -> dict:
    return {"metadata": {"labels": {"app": "ray"}, "annotations": {"gpu-fraction": "0.5", "note": SECRET}},
            "spec": {"containers": [_secret_container(name)], "initContainers": [_secret_container("init")],
                     "volumes": [{"name": SECRET, "secret": {"secretName": SECRET}}],
                     "nodeSelector": {"pool": "gpu"}, "schedulerName": "volcano", "priorityClassName": "",
                     "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
                     "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                         "nodeSelectorTerms": [{"matchExpressions": [
                             {"key": "zone", "operator": "In", "values": ["a"]}]}]}}}}}


def secret_rayjob(name: str = "job", namespace: str = "team-a", queue: str = "q") -> dict:
    """A RayJob with a secret in every place muster must not keep."""
    return {
        "apiVersion": "ray.io/v1", "kind": "RayJob",
        "metadata": {"name": name, "namespace": namespace, "uid": "u1", "resourceVersion": "1",
                     "labels": {"volcano.sh/queue-name": queue},
                     "annotations": {"kubectl.kubernetes.io/last-applied-configuration": SECRET,
                                     "team.example.com/owner-token": SECRET, "muster.dev/sim-duration": "60s"},
                     "managedFields": [{"manager": SECRET}]},
        "spec": {"entrypoint": f"python train.py --key {SECRET}", "runtimeEnvYAML": f"env_vars: {{KEY: {SECRET}}}",
                 "metadata": {"k": SECRET}, "jobId": SECRET, "shutdownAfterJobFinishes": True,
                 "submitterPodTemplate": _secret_template("submitter"),
                 "rayClusterSpec": {
                     "rayVersion": "2.9", "enableInTreeAutoscaling": False,
                     "autoscalerOptions": {"env": [{"name": "T", "value": SECRET}]},
                     "headGroupSpec": {"rayStartParams": {"redis-password": SECRET}, "template": _secret_template("head")},
                     "workerGroupSpecs": [{"groupName": "workers", "replicas": 2, "minReplicas": 1, "maxReplicas": 3,
                                           "rayStartParams": {"token": SECRET}, "template": _secret_template("worker")}]}},
        "status": {"jobDeploymentStatus": "Running", "dashboardURL": SECRET},
    }




def secret_node(name: str) -> dict[str, Any]:
    """A node whose status and spec carry what no scheduling decision reads."""
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"zone": "a", "pool": "gpu"},
                         "annotations": {"node.alpha.kubernetes.io/ttl": SECRET}},
            "spec": {"providerID": SECRET},
            "status": {"capacity": {"cpu": "16", "memory": "64Gi", "pods": "110"},
                       "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"},
                       "nodeInfo": {"bootID": SECRET}, "images": [{"names": [SECRET]}]}}
