"""The one home of the cluster link: the Kubernetes API client (watch, apply), the Lease, the
watched resources, the Kafka bridge and its watching process, and scenarios on a real cluster.
"""
