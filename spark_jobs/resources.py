"""Accelerator-aware scheduling: Spark resource discovery for `fpga` and `gpu`, and the
ResourceProfile that puts scoring tasks on executors holding one.

    python -m spark_jobs.resources fpga   # {"name": "fpga", "addresses": ["0", ...]}

Spark runs a discovery script without arguments, so point
spark.{worker,executor}.resource.fpga.discoveryScript at spark_jobs/discover-fpga.sh (or
discover-gpu.sh), which call this module. Addresses count the devices of that kind from 0: GPUs
as NVML numbers them when nvidia-ml-py finds a driver, else in OpenCL's order; FPGAs in OpenCL's
order (accelerators.devices classifies them). $HETSERVE_FPGA_ADDRESSES / $HETSERVE_GPU_ADDRESSES
(comma-separated) replace the probe: for tests, and for hosts whose devices it cannot see.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import TYPE_CHECKING

from accelerators.devices import opencl_devices

if TYPE_CHECKING:
    from pyspark.resource import ResourceProfile

log = logging.getLogger(__name__)
KINDS = ("fpga", "gpu")


def _nvml_gpus() -> list[str] | None:
    """GPU indices from NVML, or None where nvidia-ml-py or the driver is absent."""
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception as e:  # ImportError, or NVMLError without a driver
        log.info("NVML unavailable: %s", e)
        return None
    try:
        return [str(i) for i in range(pynvml.nvmlDeviceGetCount())]
    finally:
        pynvml.nvmlShutdown()


def discover(kind: str) -> dict[str, object]:
    """Spark's resource JSON for one kind of device found on this host."""
    given = os.environ.get(f"HETSERVE_{kind.upper()}_ADDRESSES")
    if given is not None:
        return {"name": kind, "addresses": [a for a in given.split(",") if a]}
    if kind == "gpu":
        gpus = _nvml_gpus()
        if gpus is not None:
            return {"name": kind, "addresses": gpus}
    count = sum(1 for d in opencl_devices() if d.kind == kind)
    return {"name": kind, "addresses": [str(i) for i in range(count)]}


def task_profile(spec: str, new_executors: bool = True) -> ResourceProfile:
    """A ResourceProfile from "NAME=AMOUNT" (e.g. "fpga=1"): each task holds AMOUNT devices of
    the kind; with `new_executors` (dynamic allocation on) it also asks for executors holding
    them, where without it Spark (3.4+) only accepts task requests on the executors it has."""
    from pyspark.resource import (
        ExecutorResourceRequests,
        ResourceProfileBuilder,
        TaskResourceRequests,
    )

    name, _, amount = spec.partition("=")
    if name not in KINDS or not amount.replace(".", "", 1).isdigit() or float(amount) <= 0:
        raise ValueError(f"--task-resource {spec!r}: expected fpga=AMOUNT or gpu=AMOUNT "
                         "with AMOUNT > 0")
    builder = ResourceProfileBuilder().require(TaskResourceRequests().resource(name,
                                                                              float(amount)))
    if new_executors:
        builder.require(ExecutorResourceRequests().resource(name, max(1, int(float(amount)))))
    return builder.build


def task_resources() -> dict[str, list[str]]:
    """The accelerators Spark gave the running task, by kind ({} outside a task, or in local
    mode, which has no custom resources)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        return {}
    return {name: list(info.addresses) for name, info in context.resources().items()}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in KINDS:
        print(__doc__, file=sys.stderr)
        return 2
    print(json.dumps(discover(argv[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
