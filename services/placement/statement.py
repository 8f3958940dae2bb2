"""One placement attempt as a statement (KAI's word): every change to the node table is logged,
so the attempt either commits as a whole or rolls back exactly, and a gang never half-lands.

Charges are integer additions, so undoing them in reverse order restores the table bit for bit.
"""

from __future__ import annotations

from services.placement.gpu import GpuCharge
from services.placement.nodes import Demand, NodeTable


class Statement:
    def __init__(self, table: NodeTable) -> None:
        self.table = table
        self._log: list[tuple[bool, int, Demand, GpuCharge]] = []

    def charge(self, node: int, demand: Demand, devices: GpuCharge) -> None:
        self.table.charge(node, demand, devices)
        self._log.append((True, node, demand, devices))

    def uncharge(self, node: int, demand: Demand, devices: GpuCharge) -> None:
        """Take a holding off a node for the attempt (a victim's pod or reservation)."""
        self.table.uncharge(node, demand, devices)
        self._log.append((False, node, demand, devices))

    def rollback(self) -> None:
        for charged, node, demand, devices in reversed(self._log):
            if charged:
                self.table.uncharge(node, demand, devices)
            else:
                self.table.charge(node, demand, devices)
        self._log.clear()

    def commit(self) -> None:
        self._log.clear()
