"""A Prometheus server of its own: Debian's ``prometheus`` on a loopback port, its data in a directory.

The server is the one ``make tools`` installed (``catalog.built("prometheus")``); it scrapes what
the configuration file it is given names (a test renders the repository's
``deploy/prometheus/prometheus.yml`` with its own targets) and answers the HTTP API
(``/api/v1/query``, ``/api/v1/targets``, ``/api/v1/label/<name>/values``).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from shared.parts import catalog
from shared.parts.process import Part, Served, free_port


class PrometheusError(RuntimeError):
    """The API answered an error (a query it cannot parse, say); the message is its own."""


class PrometheusServer(Served):
    """``start()`` it with a configuration file; ``url`` is its HTTP root."""

    def __init__(self, config: Path, root: Path | None = None, *, port: int | None = None) -> None:
        super().__init__(root, "muster-prometheus-")
        self.config = config
        self.port = port or free_port()
        self.binary = catalog.built("prometheus").manifest["bin"]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> "PrometheusServer":
        self.root.mkdir(parents=True, exist_ok=True)
        self.part = Part("prometheus", [
            self.binary, f"--config.file={self.config}", f"--storage.tsdb.path={self.root / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle",
        ], self.root / "prometheus.log", cwd=self.root).start()
        try:
            self.part.wait_until(self._ready, timeout, f"ready on {self.url}")
        except BaseException:
            self.part.stop()  # not left running by a start that failed
            raise
        return self

    def _ready(self) -> bool:
        with urllib.request.urlopen(f"{self.url}/-/ready", timeout=5) as reply:
            return reply.status == 200

    def api(self, path: str, **params: Any) -> Any:
        """The ``data`` of an API answer (``api("query", query="up")``); ``PrometheusError`` with the
        server's own words when it refuses."""
        query = f"?{urllib.parse.urlencode(params, doseq=True)}" if params else ""
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=30) as reply:
                body = json.loads(reply.read())
        except urllib.error.HTTPError as exc:
            try:
                body = json.loads(exc.read())
            except ValueError:
                raise PrometheusError(f"{path}: HTTP {exc.code}") from None
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The series an instant query returns now (``[{"metric": {...}, "value": [t, "v"]}, ...]``)."""
        return self.api("query", query=expr)["result"]

    def targets(self) -> list[dict[str, Any]]:
        """The active scrape targets, with their ``health`` and ``lastError``."""
        return self.api("targets", state="active")["activeTargets"]

    def describe(self) -> str:
        return f"Prometheus {catalog.built('prometheus').version} (Debian's) at {self.url}"
