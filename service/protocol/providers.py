"""What the operations answer from wherever a process keeps it: statistics and the registry of
clients' regions (model control is service.core.types.ModelControls). A process that serves alone
answers from its own (OwnStatistics, OwnRegions); a front-end is given its device owner
(service/workers/frontend_process.py)."""

from __future__ import annotations

from typing import Protocol

from service.core.dataplane import DataPlane
from service.edge.shared_memory import Caller, SharedMemoryRegions
from service.protocol import outputs
from service.protocol.types import ModelStatistics


class StatisticsSource(Protocol):
    async def statistics(self, name: str, version: str) -> list[ModelStatistics]:
        """Every served model version's counts when `name` is empty, else the one asked for."""
        ...


class RegionRegistry(Protocol):
    """Where a client's system shared memory regions are registered."""

    async def register(self, name: str, key: str, offset: int, byte_size: int,
                       caller: Caller) -> None:
        ...

    async def unregister(self, name: str, caller: Caller) -> None:
        ...


class OwnStatistics:
    """This process's data plane's counts (the one process that serves)."""

    def __init__(self, plane: DataPlane) -> None:
        self._plane = plane

    async def statistics(self, name: str, version: str) -> list[ModelStatistics]:
        return outputs.statistics_of(self._plane, name, version)


class OwnRegions:
    """Regions registered in this process alone (the one process that serves)."""

    def __init__(self, regions: SharedMemoryRegions) -> None:
        self._regions = regions

    async def register(self, name: str, key: str, offset: int, byte_size: int,
                       caller: Caller) -> None:
        self._regions.register(name, key, offset, byte_size, caller)

    async def unregister(self, name: str, caller: Caller) -> None:
        self._regions.unregister(name, caller)
