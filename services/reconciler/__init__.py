"""The reconciler: the only service that talks to Kubernetes.

``ingest`` turns watch events into ``ObjectChanged`` payloads; ``core`` turns decisions (GangPlaced,
PodAssigned, PreemptionRequested, queue status) into idempotent ``KubeEffect``s that an adapter
(the real API client, or ``shared.sim``) applies.
"""
