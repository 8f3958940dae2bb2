"""The dev cluster's audit log read per user and per call (the bench's requests per pod and where they go)."""

from __future__ import annotations

import json
from pathlib import Path

from shared.parts.devcluster import DevCluster


def _event(user: str, verb: str, resource: str | None, subresource: str | None = None) -> str:
    ref = {k: v for k, v in (("resource", resource), ("subresource", subresource)) if v}
    return json.dumps({"verb": verb, "user": {"username": user}, **({"objectRef": ref} if ref else {})})


def test_requests_are_counted_per_audited_user_and_per_call(tmp_path: Path) -> None:
    cluster = DevCluster(tmp_path, audited=("muster", "vc-scheduler"))
    assert cluster.audited_requests() == {"muster": 0, "vc-scheduler": 0}  # no log yet: nothing answered
    cluster.root.mkdir(parents=True, exist_ok=True)
    cluster.audit_log.write_text("\n".join([
        _event("muster", "create", "pods", "binding"), _event("muster", "create", "pods", "binding"),
        _event("muster", "watch", "pods"), _event("vc-scheduler", "get", None),
        _event("admin", "create", "pods"),  # not audited: not counted
    ]) + "\n")
    calls = cluster.audited_calls()
    assert calls["muster"] == {"create pods/binding": 2, "watch pods": 1}
    assert calls["vc-scheduler"] == {"get nonresource": 1}
    assert cluster.audited_requests() == {"muster": 3, "vc-scheduler": 1}
