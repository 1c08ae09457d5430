"""Assigns every planned tensor a device buffer, reusing a buffer once the tensors in it are no
longer read, so peak device memory stays well below the sum of all tensors."""

from __future__ import annotations

from dataclasses import dataclass

from accelerators.opencl.launch import Lowered, Ref


@dataclass
class BufferPlan:
    slot_of: dict[str, int]  # storage name -> buffer index
    slot_bytes: list[int]

    @property
    def peak_bytes(self) -> int:
        return sum(self.slot_bytes)


def plan_buffers(lowered: Lowered) -> tuple[BufferPlan, int]:
    """The plan and the sum of all tensors' sizes. A storage lives from the launch that first
    touches it to the last that reads it; graph inputs from the start, outputs to the end. The
    stages of a pipelined chain count as one launch: joined by channels they run at once, so
    the chain's output must not reuse the buffer its first stage is still reading."""
    end = len(lowered.launches)
    first: dict[str, int] = {name: -1 for name in {d.storage for d in lowered.inputs.values()}}
    last: dict[str, int] = dict.fromkeys(first, -1)
    step = -1
    for i, launch in enumerate(lowered.launches):
        step = step if launch.stage > 1 else i  # a chain's later stages: its first's step
        for arg in launch.args:
            if isinstance(arg, Ref) and arg.name in lowered.storages:
                first.setdefault(arg.name, step)
                last[arg.name] = step
    for d in lowered.outputs.values():
        last[d.storage] = end
    slot_of: dict[str, int] = {}
    slot_bytes: list[int] = []
    busy: list[tuple[int, int]] = []  # (last use, slot)
    free: list[int] = []
    for name in sorted(first, key=lambda s: first[s]):
        start, size = first[name], lowered.storages[name]
        # A buffer read by the launch that writes this tensor is still busy: strictly before.
        free += [slot for until, slot in busy if until < start]
        busy = [(until, slot) for until, slot in busy if until >= start]
        fits = [s for s in free if slot_bytes[s] >= size]
        if fits:
            slot = min(fits, key=lambda s: slot_bytes[s])
        elif free:
            slot = max(free, key=lambda s: slot_bytes[s])
            slot_bytes[slot] = size
        else:
            slot = len(slot_bytes)
            slot_bytes.append(size)
        if slot in free:
            free.remove(slot)
        slot_of[name] = slot
        busy.append((last[name], slot))
    return BufferPlan(slot_of, slot_bytes), sum(lowered.storages[s] for s in first)
