"""The free-running deployment under faults: what it ends with equals what an undisturbed run ends with.

Each run is the deployment as operators run it: the four services, the projector and the cluster
link (``muster run cluster``, no lease) are ``muster run`` processes, kept alive by a supervisor that
restarts whatever exits (as a Deployment does), on an Apache Kafka broker of the test's own, with the
projector's Postgres reached through a TCP proxy, and the API emulator (tests/kubeapi.py, real HTTP)
as the cluster. The test plays the users and KubeRay: RayClusters arrive one after another in two
Volcano queues; when muster unsuspends one, its pods appear; later two of them are deleted.

The undisturbed run does only that. The disturbed run does the same while it SIGKILLs a service
every ``KILL_EVERY`` seconds (every one of the six several times, ``KILLS`` in all, each restarted
at once), pauses the broker (SIGSTOP, then SIGCONT ``PAUSE`` seconds later: every client's requests
hang) and takes the store away (the proxy stops, dropping every connection, for ``OUTAGE`` seconds).

Both end states are then compared: the cluster (which RayClusters are unsuspended and with which
queue annotation, where each pod is bound, the Scheduled events), and the projection (each
workload's queue, phase and transitions, each pod's node and binds, each queue's usage and active
workloads). Nothing lost (a bind, a transition), nothing doubled (a transition, a bind, an event,
usage counted twice).
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from sqlalchemy import func, select
from sqlalchemy.engine import make_url

from shared.history.engine import connect
from shared.history.models import EventLog, Workload
from shared.history.query import queue_report, workload_history
from shared.kernel import kube as k
from shared.parts.kafka import KafkaBroker
from shared.parts.localbroker import free_port
from shared.runtime.bus.config import BusConfig
from tests.builders import node, ray_cluster, worker_group
from tests.integration.test_cluster_bridge import ray_pod
from tests.realcluster.conftest import probe
from tests.kubeapi import KubeApiEmulator

ROOT = Path(__file__).resolve().parents[2]
PROCESSES = ("admission", "queue", "placement", "reconciler", "projector", "cluster")
QUEUES = ("research", "prod")
WORKLOADS = 8
ARRIVE_EVERY = 3.0
"""Seconds between two RayClusters' arrival: the faults fall while work keeps coming."""
DELETED = ("rc-1", "rc-4")
KILLS, KILL_EVERY = 20, 1.0
PAUSE, OUTAGE = 3.0, 5.0
READY_WAIT = 30.0
"""Longest wait for a victim to be ready again before it is killed anyway (a loaded machine)."""
STARTUP, SETTLE = 180.0, 180.0
"""Longest waits for every process to be ready, then for the run's end state once the users began (on
a quiet machine these take 5 s and under a minute; a loaded one takes far longer to start Python)."""


# --------------------------------------------------------------------------- the store, through a proxy
class Proxy:
    """A TCP proxy to the store on a loopback port; ``down`` stops listening and drops every
    connection (the store is unreachable), ``up`` listens again on the same port."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="store-proxy", daemon=True)
        self._thread.start()
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            self._writers -= {writer, up_writer}

    def up(self) -> None:
        async def start() -> None:
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self._call(start())

    def down(self) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
                self._server = None
            for writer in list(self._writers):
                writer.transport.abort()
            self._writers.clear()
        self._call(stop())

    def close(self) -> None:
        self.down()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


# --------------------------------------------------------------------------- the deployment
class Deployment:
    """The six ``muster run`` processes, restarted whenever one exits (a Deployment's pods)."""

    def __init__(self, config: BusConfig, kube_url: str, store: str, logs: Path) -> None:
        self.config, self.kube_url, self.store, self.logs = config, kube_url, store, logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ports: dict[str, int] = {}
        self.starts: Counter[str] = Counter()
        self.kills: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._supervisor = threading.Thread(target=self._supervise, name="supervisor", daemon=True)

    def _spawn(self, name: str) -> None:
        self.ports[name] = free_port()
        args = [sys.executable, "-m", "shared.cli.main", "run", name, "--metrics-port", str(self.ports[name]),
                "--log-level", "info"]
        if name == "cluster":
            args += ["--kube-url", self.kube_url, "--lease", "none"]
        if name == "projector":
            args += ["--store", self.store]
        env = {**os.environ, **self.config.env(), "PYTHONUNBUFFERED": "1"}
        self.starts[name] += 1
        with (self.logs / f"{name}.log").open("ab") as log:
            log.write(f"---- start {self.starts[name]}\n".encode())
            log.flush()
            self.procs[name] = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)

    def start(self) -> "Deployment":
        with self._lock:
            for name in PROCESSES:
                self._spawn(name)
        self._supervisor.start()
        return self

    def _supervise(self) -> None:
        while not self._stopping.wait(0.2):
            with self._lock:
                for name, proc in list(self.procs.items()):
                    if proc.poll() is not None and not self._stopping.is_set():
                        self._spawn(name)

    def ready(self, name: str) -> bool:
        """Whether the process answers ``/readyz`` with 200: past its replay, caught up, working."""
        return probe(self.ports[name], "/readyz") == 200

    def kill(self, name: str) -> None:
        with self._lock:
            self.procs[name].send_signal(signal.SIGKILL)
            self.procs[name].wait()
            self.kills[name] += 1
            self._spawn(name)

    def stop(self) -> None:
        self._stopping.set()
        self._supervisor.join(5)
        with self._lock:
            for proc in self.procs.values():
                if proc.poll() is None:
                    proc.terminate()
            for proc in self.procs.values():
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


# --------------------------------------------------------------------------- users and KubeRay
def workload(i: int) -> dict[str, Any]:
    return ray_cluster(f"rc-{i}", "team-a", suspend=True, head={"cpu": "1", "memory": "1Gi"},
                       workers=[worker_group("worker", 1 + i % 2, {"cpu": "1", "memory": "1Gi"})],
                       labels={"ray.io/scheduler-name": "volcano", "volcano.sh/queue-name": QUEUES[i % 2]})


def pods_of(i: int) -> list[dict[str, Any]]:
    name = f"rc-{i}"
    return [ray_pod(name, f"{name}-head", "head", "headgroup", "1")] + [
        ray_pod(name, f"{name}-worker-{w}", "worker", "worker", "1") for w in range(1 + i % 2)]


def _rc(kube: KubeApiEmulator, i: int) -> dict[str, Any]:
    return kube.get("RayCluster", "ray.io/v1", "team-a", f"rc-{i}") or {}


def _pod(kube: KubeApiEmulator, name: str) -> dict[str, Any]:
    return kube.get("Pod", "v1", "team-a", name) or {}


class Users:
    """Creates the RayClusters one after another, plays KubeRay (an unsuspended RayCluster's pods
    appear), and deletes ``DELETED`` (with their pods) once they are bound."""

    def __init__(self, kube: KubeApiEmulator) -> None:
        self.kube = kube
        self.created: set[int] = set()
        self.pods_made: set[int] = set()
        self.deleted: set[int] = set()
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="users", daemon=True)

    def start(self) -> "Users":
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            started = time.monotonic()
            while not self._stop.wait(0.2):
                due = min(WORKLOADS, int((time.monotonic() - started) / ARRIVE_EVERY) + 1)
                for i in range(len(self.created), due):
                    self.kube.create(workload(i))
                    self.created.add(i)
                for i in sorted(self.created - self.pods_made):
                    if _rc(self.kube, i).get("spec", {}).get("suspend") is False:
                        for p in pods_of(i):
                            self.kube.create(p)
                        self.pods_made.add(i)
                for i in sorted(self.pods_made - self.deleted):
                    if f"rc-{i}" in DELETED and all(_pod(self.kube, p["metadata"]["name"]).get("spec", {})
                                                    .get("nodeName") for p in pods_of(i)):
                        for p in pods_of(i):
                            self.kube.delete("Pod", "v1", "team-a", p["metadata"]["name"])
                        self.kube.delete("RayCluster", "ray.io/v1", "team-a", f"rc-{i}")
                        self.deleted.add(i)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def done(self) -> bool:
        return len(self.deleted) == len(DELETED) and len(self.pods_made) == WORKLOADS

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(10)


# --------------------------------------------------------------------------- the end state
def cluster_state(kube: KubeApiEmulator) -> dict[str, Any]:
    clusters = {rc["metadata"]["name"]: (rc["spec"].get("suspend"), rc["metadata"]["annotations"].get("muster.dev/queue"))
                for rc in kube.items("RayCluster", "ray.io/v1")}
    pods = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in kube.items("Pod")}
    scheduled = Counter(e["involvedObject"]["name"] for e in kube.items("Event") if e["reason"] == "Scheduled")
    return {"clusters": clusters, "pods": pods, "scheduled": dict(scheduled)}


def store_state(url: str) -> dict[str, Any]:
    engine = connect(url)
    try:
        with engine.connect() as conn:
            keys = sorted(conn.execute(select(Workload.__table__.c.key)).scalars())
            ids = conn.execute(select(func.count(), func.count(EventLog.__table__.c.event_id.distinct()))
                               .select_from(EventLog.__table__)).one()
    finally:
        engine.dispose()
    assert ids[0] == ids[1], "an envelope stored twice"
    workloads = {}
    for key in keys:
        doc = workload_history(url, key) or {}
        workloads[key] = {"queue": doc.get("queue"), "phase": doc.get("phase"),
                          "phases": phases([t["phase"] for t in doc.get("transitions", [])]),
                          "transitions": [(t["phase"], t["reason"]) for t in doc.get("transitions", [])],
                          "pods": {p["name"]: (p["node"], len(p["bound"])) for p in doc.get("pods", [])}}
    queues = {name: {"usage": q["usage"], "active": sorted(q.get("active", []))}
              for name, q in queue_report(url).items()}
    return {"workloads": workloads, "queues": queues}


def phases(seen: list[str]) -> list[str]:
    """The phases a workload went through, each once in a row: a change of reason within a phase (a
    backoff, a queue that became known) depends on timing, a phase entered twice does not."""
    return [phase for i, phase in enumerate(seen) if i == 0 or seen[i - 1] != phase]


def without_history(store: dict[str, Any]) -> dict[str, Any]:
    """The store's end state but each workload's exact transitions (see ``phases``)."""
    return {**store, "workloads": {key: {f: v for f, v in w.items() if f != "transitions"}
                                   for key, w in store["workloads"].items()}}


def settled(kube: KubeApiEmulator, users: Users, url: str) -> Callable[[], dict[str, Any] | None]:
    """The end state once the users are done, every pod left is bound and the projection has caught
    up with the cluster (every workload in its last phase: the live ones bound, the deleted ones
    Deleted; the same two reads in a row). Two equal reads alone are not enough: a killed service
    restarting for longer than their interval holds back what is left to project."""
    last: list[dict[str, Any]] = []

    def check() -> dict[str, Any] | None:
        if not users.done():
            return None
        cluster = cluster_state(kube)
        if not all(cluster["pods"].values()):
            return None
        try:
            store = store_state(url)
        except Exception:  # noqa: BLE001 - the store may be away (the outage): not settled yet
            return None
        live = {f"team-a/{name}" for name in cluster["clusters"]}
        if not live <= set(store["workloads"]) or any(
                len(store["workloads"][key]["pods"]) != len(pods_of(int(key.rsplit("-", 1)[1]))) or
                any(node is None for node, _ in store["workloads"][key]["pods"].values()) for key in live):
            return None
        if any(store["workloads"].get(f"team-a/{name}", {}).get("phase") != "Deleted" for name in DELETED):
            return None
        state = {"cluster": cluster, "store": store}
        if last and last[-1] == state:
            return state
        last[:] = [state]
        return None

    return check


def wait_for(check: Callable[[], Any], what: str, timeout: float, logs: Path) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            tails = {p.name: p.read_text(errors="replace")[-1500:] for p in sorted(logs.glob("*.log"))}
            pytest.fail(f"still waiting for {what} after {timeout:.0f}s; logs: {tails}")
        time.sleep(0.5)


# --------------------------------------------------------------------------- one run
@pytest.fixture
def stores(postgres_server: str, pg_store: str) -> Iterator[tuple[str, str]]:
    """Two migrated, empty stores: the calm run's (a database of its own) and the disturbed run's."""
    import psycopg

    from shared.history import schema

    server = make_url(postgres_server)
    name = f"{server.database or 'postgres'}_calm_{os.getpid()}"
    admin = dict(host=server.host or "127.0.0.1", port=server.port or 5432, user=server.username,
                 password=server.password, dbname=server.database or "postgres", autocommit=True)
    with psycopg.connect(**admin) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    calm = server.set(database=name).render_as_string(hide_password=False)
    try:
        schema.upgrade(calm)
        yield calm, pg_store
    finally:
        with psycopg.connect(**admin) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def run(store_url: str, logs: Path, *, faults: bool) -> tuple[dict[str, Any], "Deployment"]:
    """One run, on a broker of its own (the disturbed run pauses its process), from an empty store and
    an empty cluster to its end state; with ``faults``, the faults."""
    server = make_url(store_url)
    proxy = Proxy(server.host or "127.0.0.1", server.port or 5432)
    proxy.up()
    store = server.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    logs.mkdir(parents=True, exist_ok=True)
    with KafkaBroker(logs / "kafka") as broker, KubeApiEmulator() as kube:
        key = logs / "snapshot.key"  # as a deployment's mounted Secret: the services sign and load snapshots
        key.write_text(os.urandom(32).hex())
        config = BusConfig(broker.bootstrap, prefix="muster.", snapshot_key_file=str(key))
        kube.create(node("n1", cpu="64", memory="256Gi"))
        for name in QUEUES:
            kube.create({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": name},
                         "spec": {"weight": 1, "capability": {"cpu": "12", "memory": "48Gi"}}})
        deployment = Deployment(config, kube.url, store, logs).start()
        users = Users(kube)
        try:
            wait_for(lambda: all(deployment.ready(name) for name in PROCESSES), "every process to be ready",
                     STARTUP, logs)
            users.start()
            if faults:
                disturb(deployment, broker, proxy)
            state = wait_for(settled(kube, users, store_url), "the end state", SETTLE, logs)
        finally:
            users.stop()
            deployment.stop()
            proxy.close()
        assert users.error is None, users.error
    return state, deployment


def disturb(deployment: Deployment, broker: KafkaBroker, proxy: Proxy) -> None:
    """``KILLS`` SIGKILLs, every process several times in a random order, each once it is up and
    working (ready) and a moment later, with a broker pause and a store outage among them."""
    rng = random.Random(14)
    rounds = -(-KILLS // len(PROCESSES))
    victims = [name for _ in range(rounds) for name in rng.sample(PROCESSES, len(PROCESSES))][:KILLS]
    for n, name in enumerate(victims):
        time.sleep(KILL_EVERY * rng.uniform(0.5, 1.5))
        deadline = time.monotonic() + READY_WAIT
        while not deployment.ready(name) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(rng.uniform(0.3, 2.0))  # at work: a batch, a commit, an apply in flight, or idle
        deployment.kill(name)
        if n == KILLS // 3:
            os.kill(broker.pid, signal.SIGSTOP)
            try:
                time.sleep(PAUSE)
            finally:
                os.kill(broker.pid, signal.SIGCONT)
        if n == 2 * KILLS // 3:
            proxy.down()
            time.sleep(OUTAGE)
            proxy.up()


def test_kills_a_broker_pause_and_a_store_outage_change_nothing_in_the_end(
        stores: tuple[str, str], tmp_path: Path) -> None:
    calm_store, stormy_store = stores
    with ThreadPoolExecutor(1) as side:  # side by side: the calm run mostly waits
        calm_run = side.submit(run, calm_store, tmp_path / "calm", faults=False)
        stormy, deployment = run(stormy_store, tmp_path / "storm", faults=True)
        calm, _ = calm_run.result()
    assert sum(deployment.kills.values()) >= 20 and set(deployment.kills) == set(PROCESSES), deployment.kills
    # the kills hit processes at work: each service rebuilt itself after one from a non-empty inbox,
    # or from a snapshot of one (then its tail may be empty: shared/runtime/bus/snapshot.py)
    logs = {name: (tmp_path / "storm" / f"{name}.log").read_text(errors="replace") for name in PROCESSES}
    for name in ("admission", "queue", "placement", "reconciler"):
        rebuilt = [int(n) for n in re.findall(rf"{name}: rebuilt from (\d+) inbox records", logs[name])]
        rebuilt += [int(n) for n in re.findall(rf"{name}: loaded the snapshot at inbox offset (\d+)", logs[name])]
        assert max(rebuilt, default=0) > 0, (name, rebuilt)
    for name, text in logs.items():  # a restart of a healthy stack is never refused (its records are all there)
        assert "not starting:" not in text, (name, text[text.index("not starting:"):][:300])

    # what the cluster ends with: every workload left admitted to its queue, each pod bound once, where
    # the calm run bound it, one Scheduled event per workload
    assert stormy["cluster"] == calm["cluster"]
    assert len(calm["cluster"]["clusters"]) == WORKLOADS - len(DELETED)
    assert all(suspend is False and queue in QUEUES for suspend, queue in calm["cluster"]["clusters"].values())
    assert set(calm["cluster"]["scheduled"].values()) == {1}
    # what the projection ends with: the same phases, transitions, binds and queue usage
    differ = {k: (w, calm["store"]["workloads"].get(k)) for k, w in stormy["store"]["workloads"].items()
              if w != calm["store"]["workloads"].get(k)}
    assert without_history(stormy["store"]) == without_history(calm["store"]), differ
    assert all(binds == 1 for w in calm["store"]["workloads"].values() for _, binds in w["pods"].values())
