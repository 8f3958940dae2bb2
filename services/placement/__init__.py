"""placement: decides *where* — all-or-nothing gang placement, binpack/spread, GPU sharing, preemption.

``PlacementCore`` (core.py) is the pure decision core; see its docstring for where each decision lives.
"""

from services.placement.core import PlacementCore

__all__ = ["PlacementCore"]
