"""The OpenCL devices under test: PoCL's cpu0 (or $HETSERVE_TEST_OPENCL_DEVICE), an fp16 CPU device,
the emulated FPGA where it is installed."""

from __future__ import annotations

import os

from accelerators.devices import opencl_handles

NO_EMULATOR = "no emulated FPGA: Intel's FPGA Emulation Platform (hetserve[fpga-emulator]) is " \
              "not installed here"


def emulated_fpga() -> str | None:
    """`fpga0` where it is the emulator, else None."""
    fpgas = [record for _, record in opencl_handles() if record.kind == "fpga"]
    return "fpga0" if fpgas and fpgas[0].emulated else None


def fp16_device() -> str | None:
    """The first CPU device that announces cl_khr_fp16 (Intel's CPU runtime, which comes with
    the emulator), e.g. `cpu1`; None where none does."""
    cpus = [handle for handle, record in opencl_handles() if record.kind == "cpu"]
    return next((f"cpu{i}" for i, d in enumerate(cpus) if "cl_khr_fp16" in d.extensions), None)


def devices_under_test() -> list:
    return [os.environ.get("HETSERVE_TEST_OPENCL_DEVICE") or "cpu0"]
