"""The one fold table: payload type -> the most derived ``_on_<PayloadType>``, misspellings refused."""

import pytest

from services.admission.core import AdmissionCore
from services.placement.core import PlacementCore
from services.queue.core import QueueCore
from services.reconciler.core import ReconcilerCore
from shared.audit.fold import AuditFold
from shared.kernel.events import PAYLOAD_TYPES
from shared.kernel.fold import Folds, handlers_of
from shared.kernel.projection import ResultProjection
from shared.kernel.topology import ROUTES


class Base(Folds):
    def _on_Dequeued(self, p: object, t: float) -> str:
        return "base"

    _on_ReclaimRequested = _on_Dequeued

    def _on_ray(self, p: object) -> None:  # a lower-case helper is no handler
        ...


class Derived(Base):
    def _on_Dequeued(self, p: object, t: float) -> str:
        return "derived"


def test_a_table_holds_handlers_aliases_and_the_most_derived_override():
    assert set(Base.folds) == {"Dequeued", "ReclaimRequested"}
    assert Base.folds["Dequeued"](Base(), None, 0.0) == "base"
    assert Derived.folds["Dequeued"](Derived(), None, 0.0) == "derived"
    assert Derived.folds["ReclaimRequested"](Derived(), None, 0.0) == "base"  # the alias names the base's


def test_a_handler_for_no_payload_type_is_refused_when_the_class_is_made():
    with pytest.raises(TypeError, match="_on_Dequeud handles no payload type"):
        class Misspelt(Folds):
            def _on_Dequeud(self, p: object, t: float) -> None:
                ...


@pytest.mark.parametrize("core", [AdmissionCore, PlacementCore, QueueCore, ReconcilerCore])
def test_each_core_handles_only_what_the_topology_routes_to_it(core):
    """A handler for an event no route brings to the service would never run."""
    routed = {t for t, services in ROUTES.items() if core.service in services}
    facts = {"ObjectChanged", "ObjectsListed", "TimerFired"}  # routed by topology's watch rules and the clock
    assert core.folds and set(core.folds) <= routed | facts, set(core.folds) - routed


def test_the_projection_and_the_audit_fold_share_the_table_rule():
    assert set(ResultProjection.folds) <= set(PAYLOAD_TYPES)
    assert AuditFold.folds["Dequeued"] is AuditFold._on_Dequeued is not ResultProjection.folds["Dequeued"]
    assert handlers_of(AuditFold) == AuditFold.folds
