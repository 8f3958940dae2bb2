"""The three uses together on a live deployment: schedule on a real cluster, then audit from the live log.

The deployment's pieces run in this process on the session's Kafka broker — the four services, the
projector into a SQLite store, ``muster run cluster``'s app — against the session's real cluster (real
KubeRay makes the pods, KWOK runs them). A KAI queue holds one GPU: ``train-1`` runs, ``train-2``
waits for the quota, ``build-1`` (a higher priority) preempts ``train-1``, and is deleted, after which
``train-1`` runs again. Then, from the live Kafka log and no other file, what the Audit sections of
README and docs/audit.md walk a user through: ``log export`` (no ``--policy``: the log records it; chained and
signed, the projector holding a signing key), ``replay --verify --public-key`` exit 0 with authenticity checked,
one input line edited exit 7 before any decision is replayed, the file stripped of its chain with one decision
altered exit 1 naming it (exit 7 with the public key), ``explain`` at an ISO time mid-history with the
queue position and quota numbers, ``report --html`` on date axes, ``--what-if`` with a bigger quota
showing a shorter wait; the log's time runs forwards, and the store says in one line why it cannot be
verified.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml

from shared.audit.errors import CANNOT_REPRODUCE, DIVERGED
from shared.audit.header import FORMAT, LogHeader
from shared.audit.integrity import TAMPERED
from shared.audit.logfile import LogFile, envelopes
from shared.audit.timeorder import backwards
from shared.history.query import workload_history
from shared.kernel.policy import Policy
from shared.kernel.topology import SERVICES
from shared.history.integrity import Signer, public_pem
from shared.kubernetes.app import cluster_app
from shared.kubernetes.cluster import KubeTarget
from shared.parts import kwok
from shared.parts.devcluster import DevCluster
from shared.runtime.bus.app import ensure_topics, service_app
from shared.runtime.bus.config import BusConfig
from shared.runtime.bus.driver import EventLoopThread, gather_all
from shared.runtime.bus.projector import projector_app
from tests.builders.audit import decision_lines, lines_of, rewritten
from tests.builders.cli import clean_exit, flat, invoke, one_line_error
from tests.conftest import log_complete, signed_to_its_end
from tests.integration.test_cluster_bridge import stop_apps
from tests.realcluster.conftest import create, eventually

NS = "team-a"
SIGNER = Signer.generate()
"""The projector's signing key (a deployment's ``--signing-key``)."""


LIVE = Path(__file__).resolve().parents[2] / "examples" / "audit" / "live"
"""The manifests the walk-through of README and docs/audit.md applies (a namespace, priorities, a KAI queue of one GPU, three
RayClusters, the queue with two GPUs for the what-if)."""


def manifests(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((LIVE / f"{name}.yaml").read_text()) if d]


def _phase(store: str, name: str) -> str:
    return str((workload_history(store, f"{NS}/{name}") or {}).get("phase") or "")


def _reasons(store: str, name: str) -> list[str]:
    return [t.get("phase", "") for t in (workload_history(store, f"{NS}/{name}") or {}).get("transitions", [])]


@pytest.fixture(scope="module")
def history(devcluster: DevCluster, kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The scenario run once through the deployed stack: (the exported log, the store, a folder, the public key)."""
    import uuid

    from shared.history import schema
    from tests.conftest import delete_topics

    devcluster.reset()
    folder = tmp_path_factory.mktemp("audit-live")
    store = f"sqlite:///{folder / 'history.db'}"
    schema.ensure(store)
    prefix = f"t{uuid.uuid4().hex[:8]}."
    config = BusConfig(kafka_bootstrap, prefix=prefix)
    cluster = devcluster
    create(cluster, kwok.node("n1", {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "2"}), *manifests("queue"))
    bus = EventLoopThread()
    try:
        bus.run(ensure_topics(config))
        apps: dict[str, Any] = {name: service_app(name, config, Policy()) for name in SERVICES}
        apps["projector"] = projector_app(config, store, signer=SIGNER, checkpoint_seconds=0.5)
        apps["cluster"] = cluster_app(config, KubeTarget(kubeconfig=str(cluster.kubeconfig)))
        bus.run(gather_all(app.start() for app in apps.values()), timeout=90)
        try:
            create(cluster, *manifests("train-1"))
            eventually(lambda: _phase(store, "train-1") == "Running", "train-1 to run", timeout=90)
            create(cluster, *manifests("train-2"))
            eventually(lambda: _phase(store, "train-2") == "Queued", "train-2 to wait for the queue's GPU")
            create(cluster, *manifests("build-1"))
            eventually(lambda: _phase(store, "build-1") == "Running" and "Preempted" in _reasons(store, "train-1"),
                       "build-1 to run, train-1 preempted", timeout=90)
            cluster.kubectl("delete", "raycluster", "build-1", "-n", NS, "--wait=true")
            eventually(lambda: _phase(store, "build-1") == "Deleted" and _phase(store, "train-1") == "Running",
                       "train-1 to run again once build-1 is gone", timeout=90)
            eventually(lambda: log_complete(kafka_bootstrap, prefix), "the stack to finish what it was doing")
            eventually(lambda: signed_to_its_end(kafka_bootstrap, prefix), "the projector to sign the log to its end")
        finally:
            stop_apps(bus, apps)
    finally:
        bus.close()
    exported = folder / "live.jsonl"
    result = invoke("log", "export", "--from", f"kafka://{kafka_bootstrap}", "--topic-prefix", prefix, "--out", exported)
    clean_exit(result, 0)
    public = folder / "audit.pub"
    public.write_text(public_pem(SIGNER.public))
    yield exported, store, folder, public
    delete_topics(kafka_bootstrap, prefix)


def test_the_live_log_is_chained_and_verifies_with_the_public_key_and_runs_forwards_in_time(history: Any) -> None:
    exported, _, _, public = history
    assert LogFile(exported).header.chained and LogFile(exported).header.replay_order
    log = list(envelopes(LogFile(exported)))
    assert backwards(log) == [], "no effect is stamped before its cause, no service's time goes back"
    assert any(e.type == "PolicyApplied" for e in log), "the services wrote the policy they decide with"
    result = invoke("replay", exported, "--verify", "-q", "--public-key", public)
    clean_exit(result, 0)
    said = flat(result.stdout)
    assert "chain OK" in said and "checked against the given public key" in said and ", 0 different" in said


def test_one_edited_input_line_is_caught_before_replay(history: Any) -> None:
    exported, _, folder, public = history
    lines = exported.read_bytes().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if b'"source":"ingest"' in line and b'"change":"Added"' in line)
    lines[at] = lines[at].replace(b'"change":"Added"', b'"change":"Updated"', 1)
    edited = folder / "edited.jsonl"
    edited.write_bytes(b"".join(lines))
    result = invoke("replay", edited, "--verify", "-q", "--public-key", public)
    clean_exit(result, TAMPERED)
    said = flat(result.stdout)
    assert f"line {at + 1}:" in said and "edited" in said and "different" not in said


def _unchained(path: Path, out: Path) -> Path:
    """The export stripped of its chain (layout 1, the envelopes as they stand): what a forger who gives
    up on the chain hands over."""
    lines = path.read_bytes().splitlines(keepends=True)
    header = LogHeader.parse(lines[0], "line 1").model_copy(update={"muster_log": FORMAT, "replay_order": False})
    body = [line[line.index(b',"envelope":') + len(b',"envelope":'):-2] + b"\n" for line in lines[1:-1]
            if line.startswith(b'{"chain"')]
    out.write_bytes(header.line() + b"".join(body) + lines[-1])
    return out


def test_one_decision_altered_is_exit_1_naming_it(history: Any) -> None:
    exported, _, folder, public = history
    stripped = _unchained(exported, folder / "unchained.jsonl")
    lines = lines_of(stripped)
    at = decision_lines(lines)[0]
    altered = json.loads(lines[at])
    altered["payload"]["reason"] += " (edited)"
    lines[at] = json.dumps(altered, separators=(",", ":")).encode() + b"\n"
    result = invoke("replay", rewritten(stripped, lines, folder / "altered.jsonl"), "--verify", "-q")
    clean_exit(result, DIVERGED)
    assert altered["id"] in flat(result.stdout) and "the log was altered" in flat(result.stdout)
    refused = invoke("replay", folder / "altered.jsonl", "--verify", "-q", "--public-key", public)
    clean_exit(refused, TAMPERED)
    assert "NOT CHAINED" in flat(refused.stdout)


def test_explain_at_an_iso_time_mid_history_gives_the_queue_position_and_quota(history: Any) -> None:
    exported, _, _, _ = history
    log = list(envelopes(LogFile(exported)))
    admitted = next(e for e in log if e.type == "GangPlaced" and e.subject == f"{NS}/build-1")  # after preempting
    deleted = next(e for e in log if e.type == "WorkloadDeleted" and e.subject == f"{NS}/build-1")
    # while build-1 holds the queue's GPU: how long that is depends on the machine (its deletion follows it
    # being seen Running), so the instant is halfway between, not a fixed time after it was placed
    halfway = (admitted.occurred_at + deleted.occurred_at) / 2
    mid = datetime.fromtimestamp(halfway, tz=timezone.utc).isoformat().replace("+00:00", "Z")
    result = invoke("explain", f"{NS}/train-2", "--log", exported, "--at", mid)
    clean_exit(result, 0)
    out = flat(result.stdout)
    assert f"{NS}/train-2 (RayCluster, queue team-a, priority 50) at {mid[:19]}" in out
    assert "queue team-a: position" in out
    assert "quota team-a nvidia.com/gpu: used 1 + requested 1 against limit 1, quota 1: over" in out
    assert "past" not in flat(result.stderr)


def test_the_report_puts_the_live_history_on_date_axes(history: Any) -> None:
    exported, _, folder, _ = history
    page = folder / "report.html"
    clean_exit(invoke("report", "--log", exported, "--html", page), 0)
    assert '"type":"date"' in page.read_text()


def test_a_bigger_quota_shortens_the_wait_in_the_what_if_of_the_live_log(history: Any) -> None:
    exported, _, folder, _ = history
    result = invoke("replay", exported, "--what-if", LIVE / "same-policy.yaml", "--apply", LIVE / "bigger-queue.yaml",
                    "--json", folder / "whatif.json")
    clean_exit(result, 0)
    assert "recorded watch events at their recorded times" in flat(result.stdout)
    doc = json.loads((folder / "whatif.json").read_text())
    waited = doc["workloads"][f"{NS}/train-2"]
    assert not waited["recorded"]["waits"], "it never got the queue's one GPU in the recording"
    assert waited["new"]["waits"][0] < 0.5 < waited["recorded"]["waited"], "with two it is admitted at once"
    assert waited["new"]["waited"] < waited["recorded"]["waited"]
    assert f"{NS}/train-2" in doc["changed"]


def test_the_store_the_projector_wrote_says_in_one_line_why_it_cannot_be_verified(history: Any) -> None:
    _, store, _, _ = history
    one_line_error(invoke("replay", store, "--verify", "-q"), CANNOT_REPRODUCE, "each service's inbox order")
    result = invoke("explain", f"{NS}/train-2", "--store", store)
    clean_exit(result, 0)
    assert "queue team-a" in flat(result.stdout)
