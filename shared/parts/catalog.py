"""Where the real parts are: the pinned versions (``versions.toml``) and the cache ``make tools`` fills.

Each part lives in ``<cache>/<part>-<version>/`` (cache: ``$MUSTER_CACHE``, else ``~/.cache/muster``)
and is complete once its ``complete.json`` is there; a part its registry refused has a
``failed.json`` beside it instead, saying why. Nothing here builds anything (``shared.parts.build``
does) or falls back to a stand-in: asking for a part that is not there raises ``MissingPart`` with
the reason a test or a command prints.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

VERSIONS = Path(__file__).with_name("versions.toml")
PARTS = ("kubernetes", "etcd", "kwok", "kuberay", "crds", "kafka", "postgresql", "jaeger", "prometheus", "kai")
DEBIAN = {"postgresql": "postgresql", "prometheus": "prometheus"}
"""Parts that are Debian's packages (part -> package), installed by ``apt-get``, not built into the cache."""


class MissingPart(RuntimeError):
    """A real part is not built here; the message says which and how to get it."""

    def __init__(self, part: str, why: str, *, unreachable: bool = False) -> None:
        super().__init__(f"{part}: {why}")
        self.part = part
        self.unreachable = unreachable
        """True when the machine cannot reach the part's registry at all (a test skips, saying so)."""


@lru_cache(maxsize=1)
def pins() -> dict[str, dict[str, Any]]:
    """The pinned versions, one table per part."""
    with VERSIONS.open("rb") as handle:
        return tomllib.load(handle)


def cache_root() -> Path:
    return Path(os.environ.get("MUSTER_CACHE") or Path.home() / ".cache" / "muster")


def version(part: str) -> str:
    pin = pins()[part]
    if "version" in pin:
        return str(pin["version"])
    if part in DEBIAN:
        return "debian"
    # crds: one directory for the set, named after every module version in it
    return "+".join(str(v).rsplit("@", 1)[1] for _, v in sorted(pin.items()))


def home(part: str) -> Path:
    """The part's directory in the cache (it may not exist yet)."""
    return cache_root() / f"{part}-{version(part)}"


@dataclass(frozen=True)
class Built:
    part: str
    version: str
    path: Path
    manifest: dict[str, Any]

    def file(self, name: str) -> Path:
        """A file the part's manifest names (``bin/kube-apiserver``, ``crds/...``), checked to exist."""
        found = self.path / name
        if not found.exists():
            raise MissingPart(self.part, f"{found} is missing from the cache; run `make tools` again")
        return found


def built(part: str) -> Built:
    """The built part, or ``MissingPart`` saying why it is not here."""
    if part == "postgresql":
        return _postgresql()
    if part == "prometheus":
        return _prometheus()
    where = home(part)
    complete = where / "complete.json"
    if complete.exists():
        return Built(part, version(part), where, json.loads(complete.read_text()))
    failed = where.with_name(where.name + ".failed.json")
    if failed.exists():
        record = json.loads(failed.read_text())
        raise MissingPart(part, f"{version(part)} could not be built: {record.get('reason')}",
                          unreachable=bool(record.get("unreachable")))
    raise MissingPart(part, f"{version(part)} is not built in {cache_root()}: run `make tools`")


def binary(part: str, name: str) -> str:
    """The path of one program of a part (``binary("kubernetes", "kube-apiserver")``)."""
    return str(built(part).file(f"bin/{name}"))


def _postgresql() -> Built:
    """Debian's PostgreSQL server binaries, newest pinned major first (or ``$MUSTER_PG_BIN``)."""
    given = os.environ.get("MUSTER_PG_BIN")
    candidates = [Path(given)] if given else [Path(f"/usr/lib/postgresql/{major}/bin")
                                               for major in sorted(pins()["postgresql"]["majors"], reverse=True)]
    for bindir in candidates:
        if (bindir / "postgres").exists() and (bindir / "initdb").exists():
            return Built("postgresql", bindir.parent.name, bindir.parent, {"bin": str(bindir)})
    if shutil.which("apt-get") is None:
        raise MissingPart("postgresql", "no PostgreSQL server binaries and no apt-get to install them",
                          unreachable=True)
    raise MissingPart("postgresql", "no PostgreSQL server binaries in /usr/lib/postgresql/*/bin: run `make tools`")


def _prometheus() -> Built:
    """Debian's Prometheus server (``$MUSTER_PROMETHEUS_BIN``, else ``prometheus`` on the PATH) of a pinned major."""
    given = os.environ.get("MUSTER_PROMETHEUS_BIN")
    found = given or shutil.which("prometheus")
    if found and Path(found).exists():
        try:
            said = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=30)
            words = (said.stdout + said.stderr).split()
            ver = words[words.index("version") + 1] if "version" in words else ""
        except (OSError, subprocess.SubprocessError):
            ver = ""
        major = ver.split(".", 1)[0]
        majors = [str(m) for m in pins()["prometheus"]["majors"]]
        if major not in majors:
            raise MissingPart("prometheus", f"{found} is version {ver or '(unknown)'}, not of a pinned major "
                                            f"({', '.join(majors)})")
        return Built("prometheus", ver, Path(found).parent, {"bin": found})
    if shutil.which("apt-get") is None:
        raise MissingPart("prometheus", "no prometheus server and no apt-get to install it", unreachable=True)
    raise MissingPart("prometheus", "no prometheus on the PATH: run `make tools`")
