"""``make tools``: build or install every real part at its pinned version, once per machine.

``python -m shared.parts.build [PART ...]`` prints one line per part with the time it took
(``cached`` when it was already there). Each part is built with its ordinary client into a
directory of its own under the cache (``shared.parts.catalog``):

- kubernetes: a wrapper module requiring ``k8s.io/kubernetes`` whose replace block maps every
  ``k8s.io/*`` staging module to its ``v0.N.P`` tag (read from the go.mod the proxy serves), then
  ``go build`` of kube-apiserver, kube-controller-manager, kube-scheduler and kubectl with
  ``CGO_ENABLED=0`` and the version stamped as Kubernetes' own build stamps it;
- etcd, kwok, kuberay: a wrapper module that requires the module, ``go build`` of its main package;
  KubeRay's CRDs are copied from its module;
- crds: the peers' CRD files copied from their modules (``go mod download``);
- kafka: ``mvn dependency:copy-dependencies`` of ``org.apache.kafka:kafka_2.13``;
- kai: KAI Scheduler's scheduler, binder, pod grouper, queue controller, PodGroup controller and admission
  webhook (``cmd/*`` of ``github.com/NVIDIA/KAI-scheduler``), ``go build`` as the others;
- jaeger: Jaeger v2 (``cmd/jaeger`` of ``github.com/jaegertracing/jaeger``, an OpenTelemetry
  Collector build with in-memory trace storage and the query API), ``go build`` as the others;
- postgresql, prometheus: Debian's packages (``apt-get``), when no usable one is there.

Nothing comes from a release site, and nothing built lands in the checkout. A part whose registry
refuses it is recorded as failed with the reason (``<part>-<version>.failed.json``) and the command
exits 1; one that cannot be reached at all (a machine kind without the Go proxy or Maven Central)
is recorded as unreachable, which the tests report as a skip.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from shared.parts import catalog

GO_ENV = {"CGO_ENABLED": "0", "GOFLAGS": "-mod=mod -buildvcs=false"}
UNREACHABLE_MARKS = ("dial tcp", "no such host", "connection refused", "network is unreachable",
                     "Could not transfer artifact", "Temporary failure in name resolution", "i/o timeout")


class BuildFailed(RuntimeError):
    def __init__(self, reason: str, *, unreachable: bool = False) -> None:
        super().__init__(reason)
        self.unreachable = unreachable


def run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    """Run ``cmd``; its output, or ``BuildFailed`` with the last lines of it."""
    done = subprocess.run(cmd, cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True)
    if done.returncode != 0:
        out = (done.stdout + done.stderr).strip().splitlines()
        tail = " / ".join(line.strip() for line in out[-4:]) or f"exit {done.returncode}"
        raise BuildFailed(f"{' '.join(cmd[:3])}: {tail}", unreachable=any(m in tail for m in UNREACHABLE_MARKS))
    return done.stdout


# --------------------------------------------------------------------------- Go parts
def module_dir(module_at_version: str, work: Path) -> Path:
    """``go mod download`` a module; the directory of its files in the module cache."""
    out = run(["go", "mod", "download", "-json", module_at_version], work)
    info = json.loads(out)
    if info.get("Error"):
        raise BuildFailed(info["Error"].splitlines()[0], unreachable=any(m in info["Error"] for m in UNREACHABLE_MARKS))
    return Path(info["Dir"])


def wrapper(work: Path, requires: dict[str, str], replaces: dict[str, str], imports: list[str]) -> None:
    """A module that requires ``requires`` (and imports ``imports``, so ``tidy`` keeps them)."""
    lines = ["module muster.local/parts", "", "go 1.24.0", ""]
    lines += [f"require {mod} {ver}" for mod, ver in requires.items()]
    if replaces:
        lines += ["", "replace ("] + [f"\t{m} => {m} {v}" for m, v in sorted(replaces.items())] + [")"]
    (work / "go.mod").write_text("\n".join(lines) + "\n")
    body = "".join(f'\t_ "{imp}"\n' for imp in imports)
    (work / "tools.go").write_text(f"//go:build tools\n\npackage parts\n\nimport (\n{body})\n")
    run(["go", "mod", "tidy"], work, GO_ENV)


def go_build(work: Path, dest: Path, packages: dict[str, str], ldflags: str = "-s -w") -> None:
    """``go build -o dest/bin/NAME PACKAGE`` for each program."""
    (dest / "bin").mkdir(parents=True, exist_ok=True)
    for name, package in packages.items():
        run(["go", "build", "-trimpath", "-ldflags", ldflags, "-o", str(dest / "bin" / name), package], work, GO_ENV)


def build_kubernetes(dest: Path, work: Path) -> dict[str, object]:
    pin = catalog.pins()["kubernetes"]
    module, ver = pin["module"], pin["version"]
    gomod = run(["go", "mod", "download", "-json", f"{module}@{ver}"], work)
    info = json.loads(gomod)
    if info.get("Error"):
        raise BuildFailed(info["Error"].splitlines()[0])
    staging = [line.split("=>")[0].strip() for line in Path(info["GoMod"]).read_text().splitlines()
               if "=> ./staging/" in line]
    minor = ver.split(".", 1)[1]  # v1.34.4 -> 34.4: the staging modules' tag is v0.34.4
    cmds = ["kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"]
    wrapper(work, {module: ver}, {m: f"v0.{minor}" for m in staging}, [f"{module}/cmd/{c}" for c in cmds])
    major, minor_only = ver.lstrip("v").split(".")[:2]
    stamp = " ".join(f"-X {pkg}.{k}={v}" for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
                     for k, v in (("gitVersion", ver), ("gitMajor", major), ("gitMinor", minor_only),
                                  ("gitTreeState", "clean")))
    go_build(work, dest, {c: f"{module}/cmd/{c}" for c in cmds}, f"-s -w {stamp}")
    return {"bin": cmds, "staging_modules": len(staging)}


def build_simple(part: str, packages: dict[str, str], stamp: str = "") -> Callable[[Path, Path], dict[str, object]]:
    """``stamp``: the package whose ``latestVersion`` the version is stamped in (as the project's own build does)."""
    def build(dest: Path, work: Path) -> dict[str, object]:
        pin = catalog.pins()[part]
        wrapper(work, {pin["module"]: pin["version"]}, {}, list(packages.values()))
        go_build(work, dest, packages, f"-s -w -X {stamp}.latestVersion={pin['version']}" if stamp else "-s -w")
        return {"bin": list(packages)}
    return build


def build_kuberay(dest: Path, work: Path) -> dict[str, object]:
    pin = catalog.pins()["kuberay"]
    made = build_simple("kuberay", {"kuberay-operator": pin["module"]})(dest, work)
    source = module_dir(f"{pin['module']}@{pin['version']}", work) / "config" / "crd" / "bases"
    (dest / "crds").mkdir(exist_ok=True)
    # RayService too, though muster reads none: the operator starts its RayService controller whatever its
    # flags, and a manager whose informer cannot sync exits after two minutes (controller-runtime's cache
    # sync timeout), taking the RayCluster and RayJob controllers with it
    names = ["ray.io_rayclusters.yaml", "ray.io_rayjobs.yaml", "ray.io_rayservices.yaml"]
    for name in names:
        shutil.copyfile(source / name, dest / "crds" / name)
    return {**made, "crds": names}


KAI_COMMANDS = ("scheduler", "binder", "podgrouper", "queuecontroller", "podgroupcontroller", "admission")
"""KAI Scheduler's programs its operator deploys by default (``shared.parts.kai`` runs them); the node scale
adjuster (cluster autoscaling, off by default) and the operator itself are left out."""


PODGROUPCONTROLLER_MAIN = """// podgroupcontroller's main as KAI's own (cmd/podgroupcontroller/main.go), but for one line: its
// --metrics-bind-address reaches controller-runtime. KAI's app.Run gives its manager no metrics address,
// so it takes :8080 whatever the flag says, and two of them (or anything else on 8080) cannot share a host.
package main

import (
	"flag"
	"fmt"
	"os"

	"go.uber.org/zap/zapcore"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/NVIDIA/KAI-scheduler/cmd/podgroupcontroller/app"
)

func main() {
	options := app.InitOptions(nil)
	config := ctrl.GetConfigOrDie()
	logging := zap.Options{Development: true, TimeEncoder: zapcore.ISO8601TimeEncoder,
		Level: zapcore.Level(-1 * options.LogLevel)}
	logging.BindFlags(flag.CommandLine)
	flag.Parse()
	metricsserver.DefaultBindAddress = options.MetricsAddr
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&logging)))
	if err := app.Run(options, config, ctrl.SetupSignalHandler()); err != nil {
		fmt.Printf("Error while running the app: %v", err)
		os.Exit(1)
	}
}
"""


def build_kai(dest: Path, work: Path) -> dict[str, object]:
    """KAI's module pins every ``k8s.io/*`` staging module itself (no replace block), so a plain wrapper
    resolves; its go.mod asks for Go 1.24.4, which this machine's Go satisfies. Each program is KAI's own
    ``cmd/NAME`` but podgroupcontroller, whose main is ours (``PODGROUPCONTROLLER_MAIN``: its metrics
    address honoured)."""
    pin = catalog.pins()["kai"]
    packages = {f"kai-{name}": f"{pin['module']}/cmd/{name}" for name in KAI_COMMANDS}
    main = work / "cmd" / "kai-podgroupcontroller"
    main.mkdir(parents=True)
    (main / "main.go").write_text(PODGROUPCONTROLLER_MAIN)
    packages["kai-podgroupcontroller"] = "muster.local/parts/cmd/kai-podgroupcontroller"
    wrapper(work, {pin["module"]: pin["version"]}, {},
            [p for p in packages.values() if not p.startswith("muster.local/")])
    go_build(work, dest, packages)
    return {"bin": list(packages)}


RECIPES = {"kuberay": 2, "crds": 2, "kai": 2}
"""What a part's build makes, numbered: a cached part made by an older recipe is built again (kuberay 2:
the RayService CRD as well; crds 2: KAI's BindRequest and Topology, which its scheduler and binder watch;
kai 2: podgroupcontroller's metrics address)."""


CRD_FILES = {
    "volcano": ["config/crd/volcano/bases/scheduling.volcano.sh_queues.yaml",
                "config/crd/volcano/bases/scheduling.volcano.sh_podgroups.yaml"],
    "scheduler_plugins": ["config/crd/bases/scheduling.x-k8s.io_podgroups.yaml",
                          "config/crd/bases/scheduling.x-k8s.io_elasticquotas.yaml"],
    "kai": ["deployments/kai-scheduler/crds/scheduling.run.ai_queues.yaml",
            "deployments/kai-scheduler/crds/scheduling.run.ai_podgroups.yaml",
            "deployments/kai-scheduler/crds/scheduling.run.ai_bindrequests.yaml",
            "deployments/kai-scheduler/crds/kai.scheduler_topologies.yaml"],
}


def build_crds(dest: Path, work: Path) -> dict[str, object]:
    (work / "go.mod").write_text("module muster.local/crds\n\ngo 1.24.0\n")
    copied: dict[str, list[str]] = {}
    for peer, module_at_version in sorted(catalog.pins()["crds"].items()):
        source = module_dir(module_at_version, work)
        (dest / peer).mkdir(parents=True, exist_ok=True)
        for rel in CRD_FILES[peer]:
            shutil.copyfile(source / rel, dest / peer / Path(rel).name)
        copied[peer] = [f"{peer}/{Path(rel).name}" for rel in CRD_FILES[peer]]
    return {"crds": copied}


# --------------------------------------------------------------------------- Kafka, PostgreSQL
def build_kafka(dest: Path, work: Path) -> dict[str, object]:
    ver = catalog.pins()["kafka"]["version"]
    (work / "pom.xml").write_text(f"""<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>muster.local</groupId><artifactId>kafka-broker</artifactId><version>1</version>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>{ver}</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-tools</artifactId><version>{ver}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j2-impl</artifactId><version>2.24.3</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId><version>2.24.3</version></dependency>
  </dependencies>
</project>
""")
    run(["mvn", "-q", "-B", "dependency:copy-dependencies", f"-DoutputDirectory={dest / 'libs'}",
         "-DincludeScope=runtime"], work)
    jars = sorted(p.name for p in (dest / "libs").glob("*.jar"))
    if not any(j.startswith("kafka_2.13-") for j in jars):
        raise BuildFailed("mvn copied no kafka_2.13 jar")
    return {"libs": len(jars)}


def install_debian(part: str) -> str:
    """A Debian part (``catalog.DEBIAN``): its package installed by ``apt-get`` unless a usable one is there."""
    try:
        return str(catalog.built(part).path)
    except catalog.MissingPart as missing:
        if missing.unreachable:
            raise BuildFailed(str(missing), unreachable=True) from None
    root = [] if os.geteuid() == 0 else ["sudo", "-n"]
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    cwd = Path(tempfile.gettempdir())
    run(root + ["apt-get", "update", "-qq"], cwd, env)
    # no recommends: prometheus's would bring node-exporter; neither service is started (no init in a
    # container, and the tests start their own on free ports)
    run(root + ["apt-get", "install", "-y", "-qq", "--no-install-recommends", catalog.DEBIAN[part]], cwd, env)
    try:
        return str(catalog.built(part).path)
    except catalog.MissingPart as missing:
        raise BuildFailed(str(missing)) from None


BUILDERS: dict[str, Callable[[Path, Path], dict[str, object]]] = {
    "kubernetes": build_kubernetes,
    "etcd": build_simple("etcd", {"etcd": "go.etcd.io/etcd/server/v3"}),
    "kwok": build_simple("kwok", {"kwok": "sigs.k8s.io/kwok/cmd/kwok"}),
    "kuberay": build_kuberay,
    "jaeger": build_simple("jaeger", {"jaeger": "github.com/jaegertracing/jaeger/cmd/jaeger"},
                           stamp="github.com/jaegertracing/jaeger/internal/version"),
    "crds": build_crds,
    "kafka": build_kafka,
    "kai": build_kai,
}


def make(part: str) -> tuple[str, bool]:
    """Build ``part`` unless it is there; (one line saying what happened, whether it is usable)."""
    started = time.monotonic()
    if part in catalog.DEBIAN:
        try:
            where = install_debian(part)
        except BuildFailed as exc:
            return f"{part}: FAILED: {exc}", exc.unreachable
        return f"{part}: {where} ({time.monotonic() - started:.0f} s)", True
    dest = catalog.home(part)
    ver = catalog.version(part)
    failed = dest.with_name(dest.name + ".failed.json")
    complete = dest / "complete.json"
    if complete.exists() and json.loads(complete.read_text()).get("recipe", 1) == RECIPES.get(part, 1):
        return f"{part} {ver}: cached ({dest})", True
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    work = catalog.cache_root() / "src" / f"{part}-{ver}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        manifest = BUILDERS[part](dest, work)
    except (BuildFailed, OSError) as exc:
        unreachable = isinstance(exc, BuildFailed) and exc.unreachable
        shutil.rmtree(dest, ignore_errors=True)
        failed.write_text(json.dumps({"reason": str(exc), "unreachable": unreachable}))
        return f"{part} {ver}: FAILED after {time.monotonic() - started:.0f} s: {exc}", unreachable
    failed.unlink(missing_ok=True)
    (dest / "complete.json").write_text(json.dumps({"part": part, "version": ver, "recipe": RECIPES.get(part, 1),
                                                    **manifest}, indent=1))
    return f"{part} {ver}: built in {time.monotonic() - started:.0f} s ({dest})", True


def main(argv: list[str]) -> int:
    parts = argv or list(catalog.PARTS)
    unknown = [p for p in parts if p not in catalog.PARTS]
    if unknown:
        print(f"error: unknown part {', '.join(unknown)}; the parts are {', '.join(catalog.PARTS)}", file=sys.stderr)
        return 2
    ok = True
    for part in parts:
        line, usable = make(part)
        print(line, flush=True)
        ok = ok and usable
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
