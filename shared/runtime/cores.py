"""The composition root: which pure core each service runs.

The one place that names the four services' cores; the embedded runtime, the Kafka workers and the
audits build their cores from here, so a test that swaps one (``monkeypatch.setitem(CORE_CLASSES, ...)``)
swaps it for all of them.
"""

from __future__ import annotations

from typing import Callable

from services.admission.core import AdmissionCore
from services.placement.core import PlacementCore
from services.queue.core import QueueCore
from services.reconciler.core import ReconcilerCore
from shared.kernel.core import Core
from shared.kernel.policy import Policy

CORE_CLASSES: dict[str, Callable[[Policy], Core]] = {
    "admission": AdmissionCore,
    "queue": QueueCore,
    "placement": PlacementCore,
    "reconciler": ReconcilerCore,
}


def build_cores(policy: Policy) -> dict[str, Core]:
    """One pure core per service, all reading the same policy."""
    return {name: make(policy) for name, make in CORE_CLASSES.items()}
