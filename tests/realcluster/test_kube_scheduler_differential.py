"""muster's placement checked against kube-scheduler itself (issue 31): the same nodes, the same pods, two answers.

muster binds pods itself, so for every pod its static filters and its reading of requests must answer as
kube-scheduler would. From one seed (``MUSTER_DIFFERENTIAL_SEED``, default ``differential.SEED``) the generator
(``tests.builders.differential``) makes KWOK nodes, RuntimeClasses with overhead, a few resident pods and
some hundred single pods ("cases", ``MUSTER_DIFFERENTIAL_CASES``). On the session's dev cluster
kube-scheduler binds the residents, which stay, then places the cases **one at a time**: a case is
created, its answer read (bound: ``spec.nodeName``; or ``PodScheduled`` False with reason
``Unschedulable``), and it is deleted (grace period 0) before the next is created, so no case ever
meets another, only the residents. (One by one is cheap, its time is in docs/parts.md; parallel batches
that cannot meet would each need a node set of their own, and a selector for it on every pod, which
would change the very pods compared.)

muster's answer comes from the same objects as the API server stored them, through its own path:
ingest's ``observe`` (what muster keeps), admission's ``pods.pod_set`` (a single pod is a gang of one),
and a trial ``gang.place_gang`` on the ``NodeTable`` of a ``PlacementCore`` fed the StorageClasses,
volumes and claims, the nodes and the bound residents as watch events. Three comparisons per case:

- verdict: kube-scheduler bound it ⇔ muster places it (muster's ``rejected``, refusing the pod at
  admission, never agrees: kube-scheduler never refuses a pod the API server took);
- node: the node kube-scheduler chose is among those muster finds feasible (scores differ by design);
- reason: where neither places it, kube-scheduler's ``0/N nodes are available: ...`` histogram equals
  muster's (``reasons.fit_error``), which says per node why.

The dev cluster runs no PV controller and no provisioner: a bound claim is written as the PV controller
leaves it (``set_up``), and a pod whose ``WaitForFirstConsumer`` claim would be provisioned answers with
the node kube-scheduler names on the claim (``schedule``, ``release``).

A disagreement is run once more on kube-scheduler's side, alone, after a pause (its cache learns a
deletion on another informer handler than its queue learns a creation, so a case right after a bound
one could still meet it), and the second answer stands. Every disagreement left fails the test, unless
``ALLOWED`` names it (a trait of the case and the kind of disagreement, with the reason; the same
list is in docs/design/placement.md, "Checked against kube-scheduler"); the failure prints a table.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import ssl
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence
from urllib.parse import urlparse

import numpy as np
import yaml

from services.admission.fields import Invalid
from services.admission.pods import pod_set
from services.placement import PlacementCore, interpod
from services.placement.gang import place_gang, pod_demand
from services.placement.statement import Statement
from services.reconciler.ingest import observe, watch_envelope
from shared.kernel import kube
from shared.kernel.model import Gang
from shared.kernel.policy import Policy
from shared.parts.devcluster import DevCluster
from tests.builders import differential
from tests.builders.differential import Case, World

PODS = f"/api/v1/namespaces/{differential.NAMESPACE}/pods"
COLLECTIONS: dict[str, str] = {
    "RuntimeClass": "/apis/node.k8s.io/v1/runtimeclasses",
    "StorageClass": "/apis/storage.k8s.io/v1/storageclasses",
    "PersistentVolume": "/api/v1/persistentvolumes",
    "PersistentVolumeClaim": f"/api/v1/namespaces/{differential.NAMESPACE}/persistentvolumeclaims",
}
"""Where the world's objects of each kind are created (and deleted, by ``LABEL``)."""
VOLUME_KINDS = ("StorageClass", "PersistentVolume", "PersistentVolumeClaim")


@dataclass(frozen=True)
class Allowed:
    """A disagreement muster keeps on purpose: of ``kind`` (verdict, node, reason), on a case with ``trait``."""

    trait: str
    kind: str
    why: str


ALLOWED: tuple[Allowed, ...] = (
    Allowed("affinity:matchFields", "verdict",
            "muster refuses a pod whose node affinity has matchFields (node names, DaemonSet pods' way): it "
            "reads node labels only, and says so when it refuses the pod (services/admission/pods.py)"),
)


# ------------------------------------------------------------------ the API, over one kept-alive connection
class Kube:
    """The admin's requests to the API server over one HTTPS connection, JSON in and out: a kubectl run per
    request would cost more than kube-scheduler's answer."""

    def __init__(self, kubeconfig: Path) -> None:
        config = yaml.safe_load(kubeconfig.read_text())
        cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
        context = ssl.create_default_context(cafile=cluster["certificate-authority"])
        context.load_cert_chain(user["client-certificate"], user["client-key"])
        url = urlparse(cluster["server"])
        self.connection = http.client.HTTPSConnection(url.hostname or "127.0.0.1", url.port, context=context,
                                                      timeout=30)

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        kind = "application/merge-patch+json" if method == "PATCH" else "application/json"
        self.connection.request(method, path, body=data, headers={"Content-Type": kind, "Accept": "application/json"})
        answer = self.connection.getresponse()
        raw = answer.read()
        return answer.status, json.loads(raw) if raw else None

    def create(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        status, body = self.call("POST", path, obj)
        assert status in (200, 201), f"POST {path} {obj['metadata']['name']}: {status} {body and body.get('message')}"
        return dict(body)

    def items(self, path: str, kind: str, api_version: str = "v1") -> list[dict[str, Any]]:
        """The world's objects of a list, each with the ``kind`` and ``apiVersion`` a list leaves out (a watch
        event has them)."""
        status, body = self.call("GET", f"{path}?labelSelector={differential.LABEL}")
        assert status == 200, f"GET {path}: {status} {body}"
        return [{"kind": kind, "apiVersion": api_version, **item} for item in body["items"]]

    def close(self) -> None:
        self.connection.close()


# ------------------------------------------------------------------ kube-scheduler's answer
@dataclass(frozen=True)
class Answer:
    """``verdict``: bound / unschedulable (kube-scheduler); fits / nowhere / rejected (muster)."""

    verdict: str
    node: str = ""
    reason: str = ""
    feasible: frozenset[str] = frozenset()


HISTOGRAM = re.compile(r"0/\d+ nodes are available.*?\.(?= |$)")
"""kube-scheduler's FitError text, without what its PostFilter (preemption, DRA) appends."""


def decided(pod: dict[str, Any]) -> Answer | None:
    """What kube-scheduler made of ``pod`` so far: bound, unschedulable (its histogram), or None yet."""
    if pod["spec"].get("nodeName"):
        return Answer("bound", node=pod["spec"]["nodeName"])
    for condition in pod.get("status", {}).get("conditions", []):
        if condition["type"] == "PodScheduled" and condition.get("reason") == "Unschedulable":
            found = HISTOGRAM.search(condition.get("message", ""))
            return Answer("unschedulable", reason=found.group(0) if found else condition.get("message", ""))
    return None


SELECTED_NODE = "volume.kubernetes.io/selected-node"
"""Where kube-scheduler's VolumeBinding PreBind writes the node it chose for a claim it leaves to a provisioner."""


def schedule(api: Kube, pod: dict[str, Any], *, keep: bool = False, timeout: float = 20.0
             ) -> tuple[dict[str, Any], Answer]:
    """Create ``pod``, wait for kube-scheduler's answer, delete it (unless ``keep``): the pod as stored
    (what the API server's admission made of it, as muster would read it) and the answer.

    A pod whose unbound ``WaitForFirstConsumer`` claim must be provisioned is never bound here (no
    provisioner runs): kube-scheduler names its node on the claim and waits in PreBind for the volume,
    counting the pod on that node meanwhile. That node is its answer (``release``)."""
    stored = api.create(PODS, pod)
    name = pod["metadata"]["name"]
    claims = [v["persistentVolumeClaim"]["claimName"] for v in pod["spec"].get("volumes", [])
              if "persistentVolumeClaim" in v]
    deadline = time.monotonic() + timeout
    while True:
        status, now = api.call("GET", f"{PODS}/{name}")
        answer = decided(now) if status == 200 else None
        if answer is not None:
            break
        node = selected(api, claims)
        if node:
            release(api, name, claims)
            return stored, Answer("bound", node=node)
        assert time.monotonic() < deadline, f"kube-scheduler did not answer for {name} in {timeout:.0f} s: {now.get('status')}"
        time.sleep(0.005)
    if not keep:
        delete(api, name, bound=answer.verdict == "bound")
    return stored, answer


def selected(api: Kube, claims: list[str]) -> str:
    """The node kube-scheduler chose for the pod's claims to be provisioned on ("" when none yet)."""
    for claim in claims:
        status, obj = api.call("GET", f"{COLLECTIONS['PersistentVolumeClaim']}/{claim}")
        node = (obj.get("metadata", {}).get("annotations") or {}).get(SELECTED_NODE, "") if status == 200 else ""
        if node:
            return str(node)
    return ""


RELEASED = 1.2
"""Seconds kube-scheduler takes at most to give up a deleted pod waiting in PreBind: ``checkBindings`` polls
once a second and fails when the pod is gone."""


def release(api: Kube, name: str, claims: list[str]) -> None:
    """Delete a pod kube-scheduler holds in PreBind, take its node off the claims, and wait until its wait
    failed (``checkBindings`` fails once the pod is gone) and it counts the pod no more. Deleting first
    matters: a binding failed while the pod still exists sends it back to the queue, whence it may be
    assumed again at once (an idle queue pops backoff early), and a pod deleted while assumed holds its
    node until the 10-minute bind timeout, where later cases would meet it."""
    deleted = time.monotonic()
    delete(api, name, bound=False)
    for claim in claims:
        api.call("PATCH", f"{COLLECTIONS['PersistentVolumeClaim']}/{claim}",
                 {"metadata": {"annotations": {SELECTED_NODE: None}}})
    time.sleep(max(0.0, deleted + RELEASED - time.monotonic()))


def delete(api: Kube, name: str, *, bound: bool) -> None:
    """Delete at once; a bound pod is waited for until it is gone, so that the next case cannot meet it."""
    status, _ = api.call("DELETE", f"{PODS}/{name}", {"gracePeriodSeconds": 0})
    assert status in (200, 202, 404), f"DELETE {name}: {status}"
    while bound and api.call("GET", f"{PODS}/{name}")[0] != 404:
        time.sleep(0.005)


def set_up(api: Kube, world: World, timeout: float = 60.0) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Create the world's objects and nodes, wait until every node is Ready with exactly its taints (and the
    cordon's, which the node lifecycle controller adds), bind the residents (one that fits nowhere is
    dropped): the nodes and bound residents as the API server holds them."""
    remove(api)  # what a run cut short left (a volume's finalizer keeps it past its deletion)
    for obj in world.objects:
        made = api.create(COLLECTIONS[obj["kind"]], {k: v for k, v in obj.items() if k != "status"})
        if "status" in obj:  # what the PV controller (not run on the dev cluster) would have written
            path = f"{COLLECTIONS[obj['kind']]}/{obj['metadata']['name']}/status"
            status, body = api.call("PUT", path, {**made, "status": obj["status"]})
            assert status == 200, f"PUT {path}: {status} {body and body.get('message')}"
    for obj in world.nodes:
        api.create("/api/v1/nodes", obj)

    def wanted(node: dict[str, Any]) -> set[tuple[str, str, str]]:
        taints = {(t["key"], t.get("value", ""), t["effect"]) for t in node["spec"].get("taints", [])}
        if node["spec"].get("unschedulable"):
            taints.add((differential.UNSCHEDULABLE_TAINT, "", "NoSchedule"))
        return taints

    expected = {n["metadata"]["name"]: wanted(n) for n in world.nodes}
    deadline = time.monotonic() + timeout
    while True:
        nodes = api.items("/api/v1/nodes", "Node")
        ready = {n["metadata"]["name"] for n in nodes
                 if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))
                 and {(t["key"], t.get("value", ""), t["effect"]) for t in n["spec"].get("taints", [])}
                 == expected[n["metadata"]["name"]]}
        if ready == set(expected):
            break
        assert time.monotonic() < deadline, f"nodes not ready with their taints: {sorted(set(expected) - ready)}"
        time.sleep(0.1)
    residents = []
    for pod in world.residents:
        _, answer = schedule(api, pod, keep=True)
        if answer.verdict == "bound":
            residents.append(api.call("GET", f"{PODS}/{pod['metadata']['name']}")[1])
        else:
            delete(api, pod["metadata"]["name"], bound=False)
    return nodes, residents


# ------------------------------------------------------------------ muster's answer
class Muster:
    """muster's placement over the nodes and residents, as watch events through its own path."""

    def __init__(self, nodes: list[dict[str, Any]], residents: list[dict[str, Any]],
                 volumes: Sequence[dict[str, Any]] = ()) -> None:
        self.core = PlacementCore(Policy())
        for obj in [*volumes, *nodes, *residents]:
            self.core.handle(watch_envelope("Added", obj, 0.0))

    def answer(self, stored: dict[str, Any]) -> Answer:
        """Fits (the node it would choose, and every node it finds feasible), nowhere (its histogram), or
        rejected (ingest refused the object, or admission the pod spec)."""
        obj = observe("Added", stored).object
        refused = kube.refused(obj)
        if refused is not None:
            return Answer("rejected", reason=refused)
        namespace = kube.meta(obj).get("namespace") or differential.NAMESPACE
        try:
            ps = pod_set("pods", 1, obj, "", namespace=namespace)
        except Invalid as exc:
            return Answer("rejected", reason=exc.reason)
        ps = ps.model_copy(update={"namespace": namespace})  # as the core's ``interpod.marked_spec`` gives it
        table = self.core.nodes
        if ps.inter_pod:  # as the core does for a gang with inter-pod constraints (``PlacementCore._begin``)
            interpod.activate(table, self.core.ledger.pods.values(), self.core.workloads.values())
        feasible = table.feasible(pod_demand(table, ps), table.static_mask(ps), slice(0, table.n))
        names = frozenset(table.names[i] for i in np.flatnonzero(feasible).tolist())
        stmt = Statement(table)
        attempt = place_gang(table, stmt, Gang(min_member=1, pod_sets=(ps,)), self.core.policy.placement,
                             explain=True)
        stmt.rollback()
        if attempt.ok:
            return Answer("fits", node=table.names[attempt.placements[0].node], feasible=names)
        return Answer("nowhere", reason=attempt.fit_error, feasible=names)


# ------------------------------------------------------------------ comparing
AGREE = {"bound": "fits", "unschedulable": "nowhere"}


@dataclass
class Row:
    case: Case
    kube: Answer
    muster: Answer
    kinds: list[str] = field(default_factory=list)
    allowed: list[Allowed] = field(default_factory=list)


def compare(case: Case, theirs: Answer, ours: Answer) -> Row:
    row = Row(case, theirs, ours)
    if AGREE[theirs.verdict] != ours.verdict:
        row.kinds.append("verdict")
    elif theirs.verdict == "bound" and theirs.node not in ours.feasible:
        row.kinds.append("node")
    elif theirs.verdict == "unschedulable" and theirs.reason != ours.reason:
        row.kinds.append("reason")
    row.allowed = [a for a in ALLOWED if a.kind in row.kinds and a.trait in case.traits]
    return row


def said(answer: Answer) -> str:
    if answer.verdict in ("bound", "fits"):
        return f"{answer.verdict} {answer.node}"
    return f"{answer.verdict}: {answer.reason}"


def table(rows: list[Row], seed: int, residents: dict[str, str]) -> str:
    """The disagreements, with what reproduces them: the seed, and where kube-scheduler put the residents
    (it breaks ties between equally scored nodes at random, so that may differ from run to run)."""
    lines = [f"{len(rows)} disagreement(s) with kube-scheduler (MUSTER_DIFFERENTIAL_SEED={seed}; residents: "
             + ", ".join(f"{pod} on {node}" for pod, node in residents.items()) + "):"]
    for row in rows:
        lines += [f"- {row.case.name} [{', '.join(row.kinds)}] traits: {' '.join(row.case.traits)}",
                  f"    kube-scheduler: {said(row.kube)}",
                  f"    muster:         {said(row.muster)}"
                  + (f" (feasible: {', '.join(sorted(row.muster.feasible)) or 'none'})" if row.kinds == ["node"] else ""),
                  f"    pod spec: {json.dumps(row.case.pod['spec'], sort_keys=True)}"]
    return "\n".join(lines)


# ------------------------------------------------------------------ the test
def run(cluster: DevCluster, world: World) -> tuple[list[Row], dict[str, float], dict[str, str]]:
    """Every case on kube-scheduler, then on muster: the rows (disagreements confirmed), the times, and the
    node of each resident."""
    times: dict[str, float] = {}
    started = time.monotonic()
    api = Kube(cluster.kubeconfig)
    try:
        nodes, residents = set_up(api, world)
        times["set-up"] = time.monotonic() - started
        answers = [schedule(api, case.pod) for case in world.cases]
        times["kube-scheduler"] = time.monotonic() - started - times["set-up"]
        volumes = [obj for kind in VOLUME_KINDS
                   for obj in api.items(COLLECTIONS[kind], kind, "storage.k8s.io/v1" if kind == "StorageClass" else "v1")]
        muster = Muster(nodes, residents, volumes)
        rows = [compare(case, theirs, muster.answer(stored)) for case, (stored, theirs) in zip(world.cases, answers)]
        times["muster"] = time.monotonic() - started - times["set-up"] - times["kube-scheduler"]
        for i, row in enumerate(rows):
            if row.kinds:
                time.sleep(0.2)
                _, again = schedule(api, row.case.pod)
                rows[i] = compare(row.case, again, row.muster)
        times["confirming"] = time.monotonic() - started - sum(times.values())
        return rows, times, {pod["metadata"]["name"]: pod["spec"]["nodeName"] for pod in residents}
    finally:
        remove(api)
        api.close()


def remove(api: Kube) -> None:
    """Delete everything the world made, and the namespace's Events. Claims and volumes lose their protection
    finalizers first: the volume's is taken off only by the PV controller's release of it, which the dev
    cluster does not run."""
    for kind in ("PersistentVolumeClaim", "PersistentVolume"):
        for obj in api.items(COLLECTIONS[kind], kind):
            api.call("PATCH", f"{COLLECTIONS[kind]}/{obj['metadata']['name']}", {"metadata": {"finalizers": None}})
    for path in (PODS, "/api/v1/nodes", *COLLECTIONS.values()):
        api.call("DELETE", f"{path}?labelSelector={differential.LABEL}", {"gracePeriodSeconds": 0})
    # one Event or more per case: in one request, or the next test's reset (kubectl, one request per Event) takes minutes
    api.call("DELETE", f"/api/v1/namespaces/{differential.NAMESPACE}/events")


def test_muster_places_single_pods_as_kube_scheduler_does(clean_cluster: DevCluster) -> None:
    """Every case's verdict, node and reason agree with kube-scheduler's, but for the deliberate differences
    ``ALLOWED`` lists; the cases cover both verdicts, so the comparison is never empty."""
    seed = int(os.environ.get("MUSTER_DIFFERENTIAL_SEED", differential.SEED))
    world = differential.world(seed, cases=int(os.environ.get("MUSTER_DIFFERENTIAL_CASES", differential.CASES)))
    started = time.monotonic()
    rows, times, residents = run(clean_cluster, world)
    verdicts = [row.kube.verdict for row in rows]
    print(f"\n{len(rows)} cases (seed {seed}) in {time.monotonic() - started:.1f} s: "
          f"{verdicts.count('bound')} bound, {verdicts.count('unschedulable')} unschedulable; "
          + ", ".join(f"{k} {v:.1f} s" for k, v in times.items()))
    for allowed in ALLOWED:
        cases = [row.case.name for row in rows if allowed in row.allowed]
        print(f"allowed, {allowed.kind} of {allowed.trait}: {len(cases)} case(s) {' '.join(cases)}")
    unlisted = [row for row in rows if row.kinds and not row.allowed]
    assert not unlisted, table(unlisted, seed, residents)
    stale = [a for a in ALLOWED if any(a.trait in row.case.traits for row in rows)
             and not any(a in row.allowed for row in rows)]
    assert not stale, f"allowed differences that no case shows any more (take them out, and from the docs): {stale}"
    assert min(verdicts.count("bound"), verdicts.count("unschedulable")) >= len(rows) // 5, \
        f"the cases no longer test both verdicts: {verdicts.count('bound')} bound of {len(rows)}"
