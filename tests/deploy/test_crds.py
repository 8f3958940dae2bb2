"""deploy/k8s/crds against the peers' own CRDs, from the modules ``make tools`` fetched.

A user installs our CRD only where the peer is not installed; when they later install the peer,
its CRD replaces ours. So ours must name the same group, kind, plural, scope and versions, and
every field muster reads or writes must exist in the peer's schema with the same type — else
muster would read a field the peer never writes, or write a status the peer's schema prunes.
kube-queue's ElasticQuotaTree has no module the Go proxy serves; it is checked against the real
API server only (``test_our_crds_are_accepted_by_the_real_api_server``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

OURS = Path(__file__).parents[2] / "deploy" / "k8s" / "crds"

PEERS = {  # our file -> the peer's file in the crds part (shared/parts/build.py CRD_FILES)
    "volcano-queues.yaml": "volcano/scheduling.volcano.sh_queues.yaml",
    "volcano-podgroups.yaml": "volcano/scheduling.volcano.sh_podgroups.yaml",
    "kai-queues.yaml": "kai/scheduling.run.ai_queues.yaml",
    "coscheduling-podgroups.yaml": "scheduler_plugins/scheduling.x-k8s.io_podgroups.yaml",
}


@pytest.fixture(scope="module")
def peers() -> Path:
    from shared.parts.catalog import MissingPart, built

    try:
        return built("crds").path
    except MissingPart as exc:
        if exc.unreachable:
            pytest.skip(f"{exc} (this machine cannot reach its registry)")
        pytest.fail(str(exc), pytrace=False)


def _crd(path: Path) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert len(docs) == 1, f"{path}: one CRD a file"
    return docs[0]


def _fields(schema: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, str | None]]:
    """Every property path of an OpenAPI schema with its type (None for int-or-string and untyped)."""
    for name, sub in (schema.get("properties") or {}).items():
        path = f"{prefix}.{name}" if prefix else name
        kind = None if sub.get("x-kubernetes-int-or-string") else sub.get("type")
        yield path, kind
        yield from _fields(sub, path)
        if isinstance(sub.get("items"), dict):
            yield from _fields(sub["items"], f"{path}[]")


def _version(crd: dict[str, Any], name: str) -> dict[str, Any]:
    return next(v for v in crd["spec"]["versions"] if v["name"] == name)


@pytest.mark.parametrize("ours_name", sorted(PEERS))
def test_our_crd_names_what_the_peers_does(ours_name: str, peers: Path) -> None:
    ours, theirs = _crd(OURS / ours_name), _crd(peers / PEERS[ours_name])
    assert ours["metadata"]["name"] == theirs["metadata"]["name"]
    assert ours["spec"]["group"] == theirs["spec"]["group"]
    assert ours["spec"]["scope"] == theirs["spec"]["scope"]
    for key in ("kind", "plural"):
        assert ours["spec"]["names"][key] == theirs["spec"]["names"][key]
    served = {v["name"] for v in theirs["spec"]["versions"] if v.get("served")}
    for version in ours["spec"]["versions"]:
        assert version["name"] in served, f"{ours_name}: {version['name']} is not a version the peer serves"
        # where muster writes status (the subresource or the object) depends on it: Volcano's PodGroup has none
        assert ("status" in (version.get("subresources") or {})) == \
            ("status" in (_version(theirs, version["name"]).get("subresources") or {})), \
            f"{ours_name}: {version['name']}'s status subresource differs from the peer's"


@pytest.mark.parametrize("ours_name", sorted(PEERS))
def test_every_field_we_declare_is_the_peers_with_its_type(ours_name: str, peers: Path) -> None:
    ours, theirs = _crd(OURS / ours_name), _crd(peers / PEERS[ours_name])
    wrong = []
    for version in ours["spec"]["versions"]:
        their_fields = dict(_fields(_version(theirs, version["name"])["schema"]["openAPIV3Schema"]))
        for path, kind in _fields(version["schema"]["openAPIV3Schema"]):
            if path not in their_fields:
                wrong.append(f"{version['name']} {path}: not in the peer's schema")
            elif kind is not None and their_fields[path] is not None and kind != their_fields[path]:
                wrong.append(f"{version['name']} {path}: ours {kind}, the peer's {their_fields[path]}")
    assert not wrong, f"{ours_name} against {PEERS[ours_name]}:\n" + "\n".join(wrong)


def test_every_crd_of_ours_is_checked_or_has_no_peer_module() -> None:
    files = {p.name for p in OURS.glob("*.yaml") if p.name != "kustomization.yaml"}
    assert files - set(PEERS) == {"elasticquotatrees.yaml"}


def test_our_crds_are_accepted_by_the_real_api_server(clean_cluster: Any) -> None:
    """Server-side apply of every CRD of ours on a real API server (dry run: the cluster keeps the
    peers' own); a refusal names the CRD and the server's reason."""
    for path in sorted(OURS.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        done = clean_cluster.kubectl("apply", "--server-side", "--dry-run=server", "--force-conflicts",
                                     "-f", str(path), check=False)
        assert done.returncode == 0, f"{path.name}: {done.stderr.strip()}"
