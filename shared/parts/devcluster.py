"""A real Kubernetes cluster on one machine, from the parts ``make tools`` built.

etcd; kube-apiserver (TLS, client certificates, the RBAC authorizer, service-account tokens);
kube-controller-manager (garbage collection, namespaces, service accounts and their tokens, jobs,
node lifecycle, the ephemeral volume controller that makes a pod's ``<pod>-<volume>`` claims) and kube-scheduler, each with its own client certificate; KWOK, which makes nodes
exist and bound pods run without kubelets (``kwok.STAGES``); the KubeRay operator with a chosen
``--batch-scheduler``; the CRDs of KubeRay and of the peers muster reads. Every program listens on
127.0.0.1 only.

``DevCluster(root).up()`` starts it all and writes ``root/kubeconfig`` (the admin's);
``state.json`` holds the process ids, so that ``down(root)`` — another command, later — stops it
and removes the directory. ``make devcluster`` / ``make devcluster-down`` and the tests' cluster
fixture use this module.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

import yaml

from shared.parts import catalog, kwok
from shared.parts.pki import Authority
from shared.parts.process import Part, PartFailed, free_port, stop_group, tail

if TYPE_CHECKING:
    from shared.kernel.policy import Policy
    from shared.sim.scenario import Scenario

BATCH_SCHEDULERS = ("none", "volcano", "kai-scheduler", "scheduler-plugins")
SERVICE_CIDR = "10.96.0.0/16"
SYSTEM_NAMESPACES = frozenset({"default", "kube-system", "kube-public", "kube-node-lease"})


def kubeconfig(server: str, ca: Path, crt: Path, key: Path, user: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Config", "current-context": "devcluster",
            "clusters": [{"name": "devcluster", "cluster": {"server": server, "certificate-authority": str(ca)}}],
            "users": [{"name": user, "user": {"client-certificate": str(crt), "client-key": str(key)}}],
            "contexts": [{"name": "devcluster", "context": {"cluster": "devcluster", "user": user}}]}


class DevCluster:
    """The cluster whose files live in ``root`` (see the module docstring)."""

    def __init__(self, root: Path, *, batch_scheduler: str = "none", nodes: Path | None = None,
                 audited: tuple[str, ...] = (), apiserver_flags: tuple[str, ...] = ()) -> None:
        if batch_scheduler not in BATCH_SCHEDULERS:
            raise ValueError(f"unknown batch scheduler {batch_scheduler!r}: one of {', '.join(BATCH_SCHEDULERS)}")
        self.root = root.resolve()
        self.batch_scheduler = batch_scheduler
        self.nodes = nodes
        self.apiserver_flags = apiserver_flags
        """More kube-apiserver flags (a test's ``--watch-cache=false``: watches served by etcd itself)."""
        self.audited = audited
        """Users whose every request the API server writes to ``audit.log`` (metadata only; the bench
        counts a scheduler's requests there)."""
        self.parts: dict[str, Part] = {}
        self.ports: dict[str, int] = {}
        self.attached: dict[str, int] = {}
        """Process ids of the parts an earlier command started (``attach``)."""

    @classmethod
    def attach(cls, root: Path) -> "DevCluster | None":
        """The dev cluster an earlier ``up`` left running in ``root``, or None if there is none."""
        state_file = root / "state.json"
        if not state_file.exists():
            return None
        state = json.loads(state_file.read_text())
        cluster = cls(root, batch_scheduler=state.get("batch_scheduler", "none"))
        cluster.ports = {k: int(v) for k, v in state.get("ports", {}).items()}
        cluster.attached = {k: int(v) for k, v in state.get("pids", {}).items()}
        return cluster

    # ------------------------------------------------------------------ files
    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    def _logs(self, name: str) -> Path:
        return self.root / "logs" / f"{name}.log"

    def kubectl(self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120.0
                ) -> subprocess.CompletedProcess[str]:
        """``kubectl`` of the pinned release, as the admin."""
        done = subprocess.run([catalog.binary("kubernetes", "kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
                              input=input, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise PartFailed(f"kubectl {' '.join(args[:3])}: {(done.stderr or done.stdout).strip()[-800:]}")
        return done

    # ------------------------------------------------------------------ up
    def up(self, *, timeout: float = 120.0) -> "DevCluster":
        """Start every part (see the module docstring); returns once the API server is ready, the CRDs
        are established, and KWOK and KubeRay run."""
        started = time.monotonic()
        self.root.mkdir(parents=True, exist_ok=True)
        self.ports = {name: free_port() for name in ("etcd", "etcd_peer", "apiserver", "kcm", "scheduler",
                                                     "kwok", "kuberay_metrics", "kuberay_probe")}
        pki = Authority(self.root / "pki")
        self._etcd(timeout)
        self._apiserver(pki, timeout)
        self._components(pki)
        self.apply_crds()
        self._kwok()
        self.start_kuberay(self.batch_scheduler)
        if self.nodes is not None:
            self.kubectl("apply", "-f", str(self.nodes))
        self._save()
        self.ready_seconds = time.monotonic() - started
        return self

    def _start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Part:
        part = Part(name, argv, self._logs(name), env=env, cwd=self.root).start()
        self.parts[name] = part
        return part

    def start_part(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Part:
        """Start one more program beside the cluster (a peer scheduler's: every peer's programs start here,
        ``shared.parts.peers`` and ``shared.parts.kai``), its log in ``logs/NAME.log``; ``problems`` reports
        it, ``stop_part``, ``stop`` and a later ``down`` stop it."""
        part = self._start(name, argv, env)
        self._save()
        return part

    def stop_part(self, name: str) -> None:
        """Stop a program ``start_part`` (or an earlier command's) started; nothing if it is not running."""
        part = self.parts.pop(name, None)
        if part is not None:
            part.stop()
        elif name in self.attached:
            stop_group(self.attached.pop(name))
        if (self.root / "state.json").exists():
            self._save()

    def _etcd(self, timeout: float) -> None:
        client = f"http://127.0.0.1:{self.ports['etcd']}"
        part = self._start("etcd", [
            catalog.binary("etcd", "etcd"), "--name", "devcluster", "--data-dir", str(self.root / "etcd"),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", f"http://127.0.0.1:{self.ports['etcd_peer']}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.ports['etcd_peer']}",
            "--initial-cluster", f"devcluster=http://127.0.0.1:{self.ports['etcd_peer']}",
            "--unsafe-no-fsync", "--quota-backend-bytes", str(4 * 2**30), "--log-level", "warn",
        ])
        part.wait_until(lambda: urllib.request.urlopen(f"{client}/health", timeout=2).status == 200, timeout,
                        f"answering on {client}")

    def _apiserver(self, pki: Authority, timeout: float) -> None:
        serving, serving_key = pki.issue("apiserver", "kube-apiserver", server=True,
                                         hosts=("127.0.0.1", "localhost", "10.96.0.1", "kubernetes",
                                                "kubernetes.default", "kubernetes.default.svc",
                                                "kubernetes.default.svc.cluster.local"))
        sa_key, sa_pub = pki.service_account_keys()
        part = self._start("kube-apiserver", [
            catalog.binary("kubernetes", "kube-apiserver"),
            "--etcd-servers", f"http://127.0.0.1:{self.ports['etcd']}",
            "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
            "--secure-port", str(self.ports["apiserver"]),
            "--tls-cert-file", str(serving), "--tls-private-key-file", str(serving_key),
            "--client-ca-file", str(pki.ca_file),
            "--authorization-mode", "Node,RBAC",
            "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
            "--service-account-key-file", str(sa_pub), "--service-account-signing-key-file", str(sa_key),
            "--service-cluster-ip-range", SERVICE_CIDR,
            "--enable-priority-and-fairness=false",  # one client host; APF's seats would only queue the tests
            "--profiling=false", "--v=1", *self._audit_flags(), *self.apiserver_flags,
        ])
        crt, key = pki.issue("admin", "kubernetes-admin", groups=("system:masters",))
        self.kubeconfig.write_text(yaml.safe_dump(kubeconfig(self.server, pki.ca_file, crt, key, "admin")))
        context = ssl.create_default_context(cafile=str(pki.ca_file))
        context.load_cert_chain(str(crt), str(key))

        def ready() -> bool:
            with urllib.request.urlopen(f"{self.server}/readyz", timeout=3, context=context) as answer:
                return bool(answer.status == 200)

        part.wait_until(ready, timeout, f"ready at {self.server}/readyz")

    def _audit_flags(self) -> list[str]:
        if not self.audited:
            return []
        policy = {"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
                  "rules": [{"level": "Metadata", "users": list(self.audited)}, {"level": "None"}]}
        (self.root / "audit-policy.yaml").write_text(yaml.safe_dump(policy))
        return ["--audit-policy-file", str(self.root / "audit-policy.yaml"), "--audit-log-path", str(self.audit_log),
                "--audit-log-format", "json", "--audit-log-mode", "blocking"]

    @property
    def audit_log(self) -> Path:
        return self.root / "audit.log"

    def audited_requests(self) -> dict[str, int]:
        """Requests the API server answered per audited user so far (``audited``)."""
        return {user: sum(calls.values()) for user, calls in self.audited_calls().items()}

    def audited_calls(self) -> dict[str, Counter[str]]:
        """Per audited user, the requests answered so far by call, ``verb resource`` (``create pods/binding``,
        ``list nodes``): where a program's requests go."""
        calls: dict[str, Counter[str]] = {user: Counter() for user in self.audited}
        if self.audit_log.exists():
            with self.audit_log.open() as log:
                for line in log:
                    event = json.loads(line)
                    user = event.get("user", {}).get("username")
                    if user in calls:
                        ref = event.get("objectRef") or {}
                        resource = "/".join(filter(None, (ref.get("resource"), ref.get("subresource"))))
                        calls[user][f"{event.get('verb')} {resource or 'nonresource'}"] += 1
        return calls

    def client(self, user: str, groups: tuple[str, ...] = ("system:masters",)) -> Path:
        """A kubeconfig for ``user`` (a client certificate the cluster's CA signs; by default an admin),
        so that a program's requests are told apart from the others' (``audited``)."""
        pki = Authority(self.root / "pki")
        crt, key = pki.issue(f"user-{user}", user, groups=groups)
        path = self.root / f"{user}.kubeconfig"
        path.write_text(yaml.safe_dump(kubeconfig(self.server, pki.ca_file, crt, key, user)))
        return path

    def _components(self, pki: Authority) -> None:
        """kube-controller-manager and kube-scheduler, each as the user RBAC's bootstrap roles name."""
        sa_key, _ = pki.service_account_keys()
        for name, user in (("kube-controller-manager", "system:kube-controller-manager"),
                           ("kube-scheduler", "system:kube-scheduler")):
            crt, key = pki.issue(name, user)
            (self.root / f"{name}.kubeconfig").write_text(
                yaml.safe_dump(kubeconfig(self.server, pki.ca_file, crt, key, user)))
        kcm_config = str(self.root / "kube-controller-manager.kubeconfig")
        self._start("kube-controller-manager", [
            catalog.binary("kubernetes", "kube-controller-manager"),
            "--kubeconfig", kcm_config, "--authentication-kubeconfig", kcm_config,
            "--authorization-kubeconfig", kcm_config,
            "--bind-address", "127.0.0.1", "--secure-port", str(self.ports["kcm"]),
            "--service-account-private-key-file", str(sa_key), "--root-ca-file", str(pki.ca_file),
            "--use-service-account-credentials=true", "--leader-elect=false",
            "--controllers", "*,-nodeipam,-cloud-node-lifecycle,-service-lb-controller,-route,-persistentvolume-binder,"
                             "-attachdetach,-persistentvolume-expander,-bootstrapsigner,"
                             "-tokencleaner",
            "--v=1",
        ])
        self.kube_scheduler(True)

    def kube_scheduler(self, running: bool) -> None:
        """Start kube-scheduler, or stop it: a scenario run whose muster answers to ``default-scheduler``
        (as the simulated cluster's does, having no other scheduler) would otherwise race it for
        every pod that names no scheduler."""
        part = self.parts.get("kube-scheduler")
        if running == (part.alive() if part is not None else "kube-scheduler" in self.attached):
            return
        if not running:
            if part is not None:
                self.parts.pop("kube-scheduler").stop()
            else:
                stop_group(self.attached.pop("kube-scheduler"))
            self._save()
            return
        sched_config = str(self.root / "kube-scheduler.kubeconfig")
        self.parts.pop("kube-scheduler", None)
        self._start("kube-scheduler", [
            catalog.binary("kubernetes", "kube-scheduler"),
            "--kubeconfig", sched_config, "--authentication-kubeconfig", sched_config,
            "--authorization-kubeconfig", sched_config,
            "--bind-address", "127.0.0.1", "--secure-port", str(self.ports["scheduler"]),
            "--leader-elect=false", "--v=1",
        ])
        if (self.root / "state.json").exists():
            self._save()

    def crd_files(self) -> list[Path]:
        """KubeRay's RayCluster, RayJob and RayService (its operator exits without the last), and the
        peers' CRDs muster reads: the peers' own files where their modules are served (Volcano,
        scheduler-plugins, KAI), muster's for kube-queue's ElasticQuotaTree, whose module the proxy
        does not serve."""
        kuberay = catalog.built("kuberay")
        crds = catalog.built("crds")
        files = [kuberay.file(f"crds/{name}") for name in kuberay.manifest["crds"]]
        files += [crds.file(rel) for peer in sorted(crds.manifest["crds"]) for rel in crds.manifest["crds"][peer]
                  if not rel.endswith("_elasticquotas.yaml")]
        files.append(Path(__file__).parents[2] / "deploy" / "k8s" / "crds" / "elasticquotatrees.yaml")
        return files

    def apply_crds(self) -> None:
        files = self.crd_files()
        args = ["apply", "--server-side", "--force-conflicts"]
        for path in files:
            args += ["-f", str(path)]
        self.kubectl(*args)
        deadline = time.monotonic() + 60
        while True:  # kubectl wait fails, not waits, on a CRD whose status has no conditions yet
            done = self.kubectl("wait", "--for", "condition=Established", "--timeout", "60s", "crd", "--all",
                                check=False)
            if done.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise PartFailed(f"the CRDs were not established within 60 s: {done.stderr.strip()[-400:]}")
            time.sleep(0.2)

    def _kwok(self) -> None:
        (self.root / "kwok.yaml").write_text(kwok.STAGES)
        self._start("kwok", [
            catalog.binary("kwok", "kwok"), "--kubeconfig", str(self.kubeconfig),
            "--config", str(self.root / "kwok.yaml"),
            "--manage-nodes-with-annotation-selector", f"{kwok.ANNOTATION}=fake",
            "--node-lease-duration-seconds", "40",
            "--server-address", f"127.0.0.1:{self.ports['kwok']}",
            "--node-ip", "10.200.0.1", "--cidr", "10.201.0.0/16",
        ])

    def start_kuberay(self, batch_scheduler: str) -> None:
        """(Re)start the KubeRay operator with ``--batch-scheduler`` (``none``: no batch scheduler)."""
        if batch_scheduler not in BATCH_SCHEDULERS:
            raise ValueError(f"unknown batch scheduler {batch_scheduler!r}: one of {', '.join(BATCH_SCHEDULERS)}")
        old = self.parts.pop("kuberay", None)
        if old is not None:
            old.stop()
        elif "kuberay" in self.attached:
            stop_group(self.attached.pop("kuberay"))
        self.batch_scheduler = batch_scheduler
        argv = [catalog.binary("kuberay", "kuberay-operator"),
                "--metrics-addr", f"127.0.0.1:{self.ports['kuberay_metrics']}",
                "--health-probe-bind-address", f"127.0.0.1:{self.ports['kuberay_probe']}",
                "--enable-leader-election=false", "--log-stdout-encoder", "console"]
        if batch_scheduler != "none":
            argv.append(f"--batch-scheduler={batch_scheduler}")
        part = self._start("kuberay", argv, env={"KUBECONFIG": str(self.kubeconfig)})
        probe = f"http://127.0.0.1:{self.ports['kuberay_probe']}/readyz"
        part.wait_until(lambda: urllib.request.urlopen(probe, timeout=2).status == 200, 60,
                        f"ready at {probe}")
        self._save()

    def prepare(self, scenario: "Scenario", policy: "Policy | None" = None) -> None:
        """Empty the cluster (``reset``) and make it run as the simulated one does for ``scenario``: KubeRay
        with its ``--batch-scheduler`` (restarted only when that changes), and no kube-scheduler while
        muster answers to ``default-scheduler`` (the simulated cluster has no scheduler but muster)."""
        from shared.kernel.kube import DEFAULT_SCHEDULER

        self.reset()
        self.kube_scheduler(not scenario.effective_policy(policy).answers_to(DEFAULT_SCHEDULER))
        if self.batch_scheduler != scenario.batch_scheduler:
            self.start_kuberay(scenario.batch_scheduler)

    def reset(self) -> None:
        """Leave the cluster as ``up`` made it, but without nodes: every workload, PodGroup, queue, Job,
        pod, PriorityClass of its users, node and namespace of its users deleted (and waited for)."""
        # one request list per group (kubectl deletes every kind it is given in one run): a reset between two
        # scenarios of the parity tier costs a few kubectl starts, not one per kind
        self.kubectl("delete", ",".join(("rayjobs.ray.io", "rayclusters.ray.io", "jobs.batch",
                                         "podgroups.scheduling.volcano.sh", "podgroups.scheduling.x-k8s.io",
                                         "podgroups.scheduling.run.ai", "elasticquotatrees.scheduling.sigs.k8s.io",
                                         "poddisruptionbudgets.policy")),
                     "--all", "--all-namespaces", "--wait=true", "--timeout=90s", check=False)
        # KAI's binder's requests, apart: a crds part of before they were fetched has no such type, and kubectl
        # deletes nothing of a list that names one it does not know
        self.kubectl("delete", "bindrequests.scheduling.run.ai", "--all", "--all-namespaces", "--wait=true",
                     "--timeout=90s", check=False)
        self.kubectl("delete", "pods", "--all", "--all-namespaces", "--grace-period=0", "--force", "--wait=true",
                     "--timeout=90s", check=False)
        self.kubectl("delete", "queues.scheduling.volcano.sh,queues.scheduling.run.ai,nodes", "--all", "--wait=true",
                     "--timeout=90s", check=False)
        # kubectl refuses --all beside a selector ("setting 'all' parameter but found a non empty selector"):
        # the users' PriorityClasses are those the selector leaves
        self.kubectl("delete", "priorityclasses", "--field-selector",
                     "metadata.name!=system-cluster-critical,metadata.name!=system-node-critical", "--wait=true",
                     "--timeout=90s", check=False)
        listed = self.kubectl("get", "namespaces", "-o", "name", check=False).stdout.split()
        mine = [n.split("/", 1)[1] for n in listed if n.split("/", 1)[1] not in SYSTEM_NAMESPACES]
        if mine:
            self.kubectl("delete", "namespaces", *mine, "--wait=true", "--timeout=120s", check=False)
        # one DELETE of each namespace's collection (deletecollection): `kubectl delete events --all` sends one
        # request per Event, which after a test that made thousands outran kubectl's timeout
        listed = self.kubectl("get", "events", "--all-namespaces", "-o",
                              "jsonpath={range .items[*]}{.metadata.namespace}{'\\n'}{end}", check=False).stdout
        for namespace in sorted(set(listed.split())):
            self.kubectl("delete", "--raw", f"/api/v1/namespaces/{namespace}/events", check=False)

    # ------------------------------------------------------------------ state
    def _save(self) -> None:
        pids = {**self.attached, **{name: part.pid for name, part in self.parts.items() if part.alive()}}
        state = {"pids": pids,
                 "ports": self.ports, "batch_scheduler": self.batch_scheduler}
        (self.root / "state.json").write_text(json.dumps(state, indent=1))

    def problems(self) -> list[str]:
        """The parts that have exited, with the tail of their logs."""
        return [f"{name} exited: {tail(part.log)}" for name, part in self.parts.items() if not part.alive()]

    def stop(self) -> None:
        for name in reversed(list(self.parts)):
            self.parts[name].stop()
        self.parts.clear()


def down(root: Path, *, remove: bool = True) -> list[str]:
    """Stop the cluster a ``DevCluster(root).up()`` left running; the names of the parts stopped."""
    state_file = root / "state.json"
    stopped: list[str] = []
    if state_file.exists():
        pids: dict[str, int] = json.loads(state_file.read_text()).get("pids", {})
        for name, pid in reversed(list(pids.items())):
            stop_group(pid)
            stopped.append(name)
    if remove:
        shutil.rmtree(root, ignore_errors=True)
    return stopped
