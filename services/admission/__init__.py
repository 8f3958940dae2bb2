"""admission: validates and normalises RayClusters, RayJobs, pod gangs and queue objects (see core.py)."""

from services.admission.core import AdmissionCore

__all__ = ["AdmissionCore"]
