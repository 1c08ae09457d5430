"""The OpenCL engine: an ONNX model on one OpenCL device, behind accelerators.engine.Engine.
Loading checks every op (an unsupported one fails here, naming op and node, so the daemon
falls back to its next device) by compiling the batch-1 plan; plans for other batch sizes are
compiled on first use and cached. On CPUs a large batch runs as back-to-back slices of
`slice` samples through one plan, so each layer's tensors stay in cache (measured: GEMM
throughput falls fourfold once a batch's im2col buffer outgrows the cache)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pyopencl as cl

from accelerators.engine import Device, TensorSignature
from accelerators.opencl.device import OpenCLDevice, open_device
from accelerators.opencl.executor import Executor, as_float32
from accelerators.opencl.graph import fix_input_dims, load_graph
from accelerators.opencl.ir import Graph, UnsupportedModelError
from accelerators.opencl.launch import Build, LocalTiling, Lowered
from accelerators.opencl.lowering import lower
from accelerators.opencl.program_cache import ProgramCache

log = logging.getLogger(__name__)

SLICE_TILES = 2  # a CPU slice: this many register tiles' rows (fully connected layers' M)
PIPELINED_ENV = "HETSERVE_OPENCL_PIPELINED"
PRECISIONS = ("fp32", "fp16")


def lowered_plans(graph: Graph, build: Build) -> tuple[Lowered, Lowered]:
    """The plans for one sample and for a CPU slice: kernels differ between them (GEMV vs GEMM
    tiles), so a program, and an FPGA binary, must hold both sets. A slice is as many samples
    as fill whole register tiles of the fully connected layers: 12 with AVX2's 6-row tiles (8
    ran half-empty second tiles)."""
    return lower(graph, 1, build), lower(graph, SLICE_TILES * build.rows, build)


def kernels_of(first: Lowered, several: Lowered, build: Build) -> set[str]:
    """The kernels the plans launch, and the marker of the storage they were built for."""
    return {la.kernel for plan in (first, several) for la in plan.launches} | {
        build.storage_kernel}


class OpenCLEngine:
    def __init__(self, model_path: Path, device: str = "", cache: ProgramCache | None = None,
                 local_tiles: bool | None = None, pipelined: bool | None = None,
                 precision: str = "fp32", served: dict[str, tuple[int, ...]] | None = None,
                 ) -> None:
        """`local_tiles`: GEMMs and convolutions through local memory; by default on GPUs, and
        always on FPGAs. Their tile size follows the device's limits; FPGAs, emulated or not,
        take the default tiles their binaries are built with (docs/opencl.md). `pipelined`:
        fp32 convolutions through the pipelined single work-item kernels, built with
        -DPIPELINED (and the FPGA's channels or pipes); by default when
        $HETSERVE_OPENCL_PIPELINED is 1. `precision` "fp16": tensors and weights stored as
        halves on the device (any device), the local tiles computed in half where the device
        has cl_khr_fp16; inputs and outputs stay FP32. `served`: each input's dims after the
        batch axis as the model is served (config.pbtxt's), which fix the graph's symbolic
        ones."""
        if precision not in PRECISIONS:
            raise ValueError(f"precision {precision!r} is unknown; expected one of "
                             f"{list(PRECISIONS)}")
        pipelined = os.environ.get(PIPELINED_ENV) == "1" if pipelined is None else pipelined
        self.graph: Graph = load_graph(model_path)
        fix_input_dims(self.graph, served or {})
        half = precision == "fp16"
        if half and (pipelined or any(n.op == "FakeQuant" or "quant_in" in n.attrs
                                      for n in self.graph.nodes)):
            raise UnsupportedModelError(
                f"precision fp16 applies to float models on the non-pipelined kernels; "
                f"{model_path} is {'pipelined' if pipelined else 'an int8 model'}")
        self._dev: OpenCLDevice = open_device(device)
        d = self._dev.device
        half_compute = half and "cl_khr_fp16" in d.extensions
        if self._dev.kind == "fpga":
            self.build = Build.for_fpga(d.platform.name, pipelined, half, half_compute)
        else:
            tiled = self._dev.kind == "gpu" if local_tiles is None else local_tiles
            tiling = LocalTiling.for_device(d.max_work_group_size, d.local_mem_size) \
                if tiled else None
            self.build = Build(Build.register_rows(self._dev.kind, d.native_vector_width_float),
                               tiling, pipelined, "", half, half_compute)
        self.device = Device(self._dev.name, self._dev.kind, "opencl", self._dev.emulated)
        self.inputs = tuple(TensorSignature(n, "FP32", s) for n, s in self.graph.inputs)
        self.outputs = tuple(TensorSignature(n, "FP32", s) for n, s in self.graph.outputs)
        self._cache = cache or ProgramCache()
        self._consts: dict[str, cl.Buffer] = {}
        self._plans: dict[int, Executor] = {}
        # Raises for unsupported ops before the device is touched.
        first, several = lowered_plans(self.graph, self.build)
        self.slice = SLICE_TILES * self.build.rows
        self.kernels = kernels_of(first, several, self.build)
        self.program = self._cache.program(self._dev, self.kernels, self.build.defines)
        plan = self.plan(1, first)
        log.info("OpenCL engine for %s on %s (%s, %s): %d launches; fused %s; batch-1 buffers "
                 "%.1f MiB peak vs %.1f MiB for all tensors", model_path, self.device.name,
                 self._dev.description, self.build.defines, len(first.launches),
                 dict(self.graph.fused),
                 plan.peak_bytes / 2**20, plan.sum_bytes / 2**20)

    def plan(self, batch: int, lowered: Lowered | None = None) -> Executor:
        """The launch plan for `batch` samples, compiled once and cached."""
        plan = self._plans.get(batch)
        if plan is None:
            lowered = lowered or lower(self.graph, batch, self.build)
            for key, value in lowered.consts.items():
                if key not in self._consts:
                    self._consts[key] = cl.Buffer(
                        self._dev.context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR,
                        hostbuf=value)
            plan = self._plans[batch] = Executor(
                self._dev, self.program, lowered, self._consts,
                concurrent_stages=self.build.concurrent_stages)
        return plan

    def step(self, batch: int) -> int:
        """The samples one plan runs at a time: CPUs run slices, other devices the batch."""
        return min(batch, self.slice) if self.device.kind == "cpu" else batch

    def run(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        batch = next(iter(inputs.values())).shape[0]
        step = self.step(batch)
        if batch <= step:
            return self.plan(batch).run(inputs, outputs)
        sliced = self.plan(step)  # shapes from the plan: declared outputs may lack them
        results = {name: np.empty((batch, *sliced.output_shape(name)[1:]), self.build.dtype)
                   for name in outputs}
        held = []  # every slice is enqueued before the one wait: no host round trip between
        for lo in range(0, batch, step):
            hi = min(lo + step, batch)
            held += self.plan(hi - lo).enqueue(
                {k: v[lo:hi] for k, v in inputs.items()},
                {k: v[lo:hi] for k, v in results.items()})
        self._dev.queue.finish()
        return as_float32(results)
