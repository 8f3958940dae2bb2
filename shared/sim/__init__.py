"""The simulated cluster: API server, KubeRay and kubelet in one deterministic object.

Driven by the embedded runtime through ``SimCluster`` (see ``cluster.py``): the runtime ``apply``s
and ``delete``s scenario objects, hands it the reconciler's ``KubeEffect``s (``perform``), reads the
watch stream (``take_watch_events``) and answers its timers (``take_timer_requests`` / ``fire``).
There is no randomness and no wall clock: ``now`` is always passed in, names and uids are hashes.

API server (``cluster.py``)
  Objects are stored by (kind, namespace, name). Nodes and the other cluster-scoped kinds
  (``CLUSTER_SCOPED``) have no namespace; every other object defaults to ``default``. Each write
  bumps a global ``metadata.resourceVersion``; ``metadata.uid`` is a hash of the object's identity
  and creation sequence (a re-created object gets a new uid); ``metadata.generation`` counts spec
  changes. Watch events are emitted only when an object actually changed. Deleting an object
  deletes what it owns (``ownerReferences``), as the garbage collector does. Re-applying a
  manifest keeps server-side fields: status (unless the manifest has one), annotations written by
  others, a pod's binding, and ``spec.suspend`` when the manifest did not change it (kubectl's
  three-way merge, for the one field muster itself writes).

KubeRay (``kuberay.py``)
  A RayCluster that is not suspended gets a head pod ``<cluster>-head-<5>`` and, per worker group,
  clamp(replicas, minReplicas, maxReplicas) x numOfHosts pods ``<cluster>-<group>-worker-<5>``
  (minReplicas x numOfHosts with in-tree autoscaling, 0 for a suspended group). The suffix is
  ``kube.short_hash(cluster, group, index, generation)``; the generation grows each time the slot
  is refilled, so a recreated pod has a new name. A suspended or deleted cluster loses its pods;
  ``status.state`` is ``ready`` when every pod runs, ``suspended`` when suspended. A RayJob creates
  its cluster ``kube.rayjob_cluster_name(job)`` when not suspended, a submitter pod ``<job>-<5>``
  once the cluster is ready (K8sJobMode; SidecarMode adds a container to the head), runs for its
  ``muster.dev/sim-duration`` annotation once cluster and submitter run, then finishes with
  ``muster.dev/sim-outcome`` (default Succeeded) and, with ``shutdownAfterJobFinishes``, deletes
  its cluster after ``ttlSecondsAfterFinished``. Suspending a RayJob deletes its cluster and
  submitter; a job whose cluster stops being ready while it runs starts over when it is ready again.

kubelet (``kubelet.py``)
  A bound pod (``spec.nodeName``) turns Running ``pod_startup`` seconds after binding; a deleted
  pod is gone at once; pods on a deleted node are deleted (pod garbage collection).

Effects (``SimCluster.perform``)
  ``suspend``/``unsuspend`` set ``spec.suspend``; ``bind`` binds an unbound pod and merges the
  effect's annotations; ``annotate`` merges annotations (recorded in ``annotation_history`` when
  the cluster is made to keep it: ``muster simulate`` does when an expectation reads annotations);
  ``evict`` deletes the pod; ``event`` appends a core/v1 Event to ``SimCluster.events``, kept an
  hour (``EVENT_TTL``, the API server's ``--event-ttl``). What the cluster keeps of an object goes
  when the object does (a long run keeps nothing per job gone, but a KubeRay slot's count). An effect
  with ``kind=""`` addresses the workload of that namespace/name (RayJob, else RayCluster). Effects
  on objects that do not exist are ignored; applying an effect twice changes nothing.
"""

from shared.sim.cluster import CLUSTER_SCOPED, ScenarioError, SimCluster

__all__ = ["CLUSTER_SCOPED", "ScenarioError", "SimCluster"]
