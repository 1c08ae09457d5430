"""Chooses an OpenCL device explicitly (`fpga0`, `gpu1`, `cpu0`: the n-th device of a kind as
accelerators.devices classifies it) and opens one context with one in-order profiling queue."""

from __future__ import annotations

from dataclasses import dataclass

import pyopencl as cl

from accelerators.devices import opencl_handles
from accelerators.engine import device_name, parse_device_name

# An empty device part picks the first device of the first kind present, most efficient first.
PREFERENCE = ("fpga", "gpu", "cpu")


class NoSuchDeviceError(LookupError):
    pass


@dataclass
class OpenCLDevice:
    name: str  # e.g. "cpu0"
    kind: str
    device: cl.Device
    context: cl.Context
    queue: cl.CommandQueue
    emulated: bool = False  # accelerators.devices.OpenCLDevice.emulated

    @property
    def description(self) -> str:
        return f"{self.device.platform.name.strip()} / {self.device.name.strip()}"


def find_device(spec: str = "") -> tuple[str, str, cl.Device, bool]:
    """(name, kind, device, emulated) for a spec such as "gpu0", or the preferred device for
    ""."""
    by_kind: dict[str, list[cl.Device]] = {}
    emulated = set()
    for handle, record in opencl_handles():
        by_kind.setdefault(record.kind, []).append(handle)
        if record.emulated:
            emulated.add(handle.int_ptr)
    present = {k: len(v) for k, v in by_kind.items()}
    if not spec:
        for kind in PREFERENCE:
            if by_kind.get(kind):
                device = by_kind[kind][0]
                return device_name(kind, 0), kind, device, device.int_ptr in emulated
        raise NoSuchDeviceError(f"no OpenCL fpga, gpu or cpu device found (present: {present})")
    parsed = parse_device_name(spec)
    if parsed is None or parsed[0] not in (*PREFERENCE, "other"):
        raise NoSuchDeviceError(f"OpenCL device {spec!r} is not of the form fpga0, gpu0, cpu0 "
                                f"(or other0: simulators such as Oclgrind)")
    kind, index = parsed
    devices = by_kind.get(kind, [])
    if index >= len(devices):
        ids = [f"opencl:{device_name(k, i)}" for k, handles in by_kind.items()
               for i in range(len(handles))]
        hint = "; no FPGA at all here: Intel's emulator comes with hetserve[fpga-emulator]" \
            if kind == "fpga" and not devices else ""
        raise NoSuchDeviceError(f"no such device: opencl:{spec}; this node has "
                                f"{', '.join(ids) or 'no OpenCL device'}{hint} (`hetserve "
                                "devices` lists every device)")
    return spec, kind, devices[index], devices[index].int_ptr in emulated


def open_device(spec: str = "") -> OpenCLDevice:
    name, kind, device, emulated = find_device(spec)
    context = cl.Context([device])
    queue = cl.CommandQueue(
        context, device, properties=cl.command_queue_properties.PROFILING_ENABLE)
    return OpenCLDevice(name, kind, device, context, queue, emulated)
