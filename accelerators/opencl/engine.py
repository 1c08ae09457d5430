"""The OpenCL engine: an ONNX model on one OpenCL device, behind accelerators.engine.Engine.
Loading checks every op (an unsupported one fails here, naming op and node, so the daemon
falls back to its next device) by compiling the batch-1 plan; plans for other batch sizes are
compiled on first use and cached. A model whose served dims are variable (-1 in config.pbtxt) is
checked at load at a probe size, and planned per request shape on first sight: the plans of the
last `max_shapes` shapes are kept (plans.py). On CPUs a large batch runs as back-to-back slices of
`slice` samples through one plan, so each layer's tensors stay in cache (measured: GEMM
throughput falls fourfold once a batch's im2col buffer outgrows the cache)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from accelerators.engine import Device, TensorSignature
from accelerators.opencl.device import OpenCLDevice, open_device
from accelerators.opencl.executor import Executor, as_float32
from accelerators.opencl.fpga import board as boards
from accelerators.opencl.fpga.lowering import STAGES, lower_fpga
from accelerators.opencl.graph import fix_input_dims, load_graph
from accelerators.opencl.ir import Graph, UnsupportedModelError, UnsupportedOpError
from accelerators.opencl.launch import Build, LocalTiling, Lowered, Pipeline, Samples
from accelerators.opencl.lowering import lower
from accelerators.opencl.plans import (
    DEFAULT_SHAPES,
    PlanEvents,
    ShapeCache,
    ShapePlans,
    SharedConsts,
)
from accelerators.opencl.program_cache import ProgramCache

log = logging.getLogger(__name__)

SLICE_TILES = 2  # a CPU slice: this many register tiles' rows (fully connected layers' M)
PRECISIONS = ("fp32", "fp16")
# The size a variable dim is checked at when the model loads: a multiple of the strides of
# detectors' and text recognizers' downsampling, and as long as a token sequence commonly is.
PROBE_SIZE = 64


def lower_for(graph: Graph, batch: int, build: Build, samples: Samples | None = None
              ) -> Lowered:
    """The plan for `batch` samples: the FPGA pipeline's where the build has it."""
    if build.pipeline:
        return lower_fpga(graph, batch, build, samples)
    return lower(graph, batch, build, samples)


def lowered_plans(graph: Graph, build: Build, samples: Samples | None = None
                  ) -> tuple[Lowered, Lowered]:
    """The plans for one sample and for a CPU slice: kernels differ between them (GEMV vs GEMM
    tiles), so a program must hold both sets. A slice is as many samples as fill whole register
    tiles of the fully connected layers: 12 with AVX2's 6-row tiles (8 ran half-empty second
    tiles). The FPGA pipeline's one binary runs every size: its one sample's plan serves."""
    first = lower_for(graph, 1, build, samples)
    if build.pipeline:
        return first, first
    return first, lower(graph, SLICE_TILES * build.rows, build, samples)


def kernels_of(first: Lowered, several: Lowered, build: Build) -> set[str]:
    """The kernels a program must hold: the FPGA pipeline's four stages (what the board's
    binary is), or the kernels the plans launch and the marker of their storage."""
    if build.pipeline:
        return set(STAGES)
    return {la.kernel for plan in (first, several) for la in plan.launches} | {
        build.storage_kernel}


def fpga_build(graph: Graph, board: boards.Board, half: bool) -> Build:
    """An FPGA's build for `graph`: the board's array and buffers, int8 MACs for a QDQ model,
    and LeakyRelu in the epilogue only where a layer has it."""
    int8 = any(n.quant_in is not None for n in graph.nodes)
    leaky = any(getattr(n.activation, "op", None) == "LeakyRelu"
                for n in graph.nodes)
    return Build(pipeline=Pipeline(board, int8, leaky), half=half)


class OpenCLEngine:
    def __init__(self, model_path: Path, device: str = "", cache: ProgramCache | None = None,
                 local_tiles: bool | None = None, precision: str = "fp32",
                 served: dict[str, tuple[int, ...]] | None = None,
                 max_shapes: int = DEFAULT_SHAPES, board: str | None = None) -> None:
        """`local_tiles`: GEMMs and convolutions through local memory; by default on GPUs,
        their tile size from the device's limits. FPGAs run the pipeline of
        kernels/fpga/pipeline.cl as `board`'s profile sizes it (by default
        $HETSERVE_FPGA_BOARD, and `emulator` on the emulator; docs/fpga.md), the nodes it
        does not cover on the host. `precision` "fp16": tensors and weights stored as
        halves on the device (any device), the local tiles computed in half where the device
        has cl_khr_fp16; inputs and outputs stay FP32. `served`: each input's dims after the
        batch axis as the model is served (config.pbtxt's), which fix the graph's symbolic
        ones; those left variable are planned per request shape, keeping the plans of the last
        `max_shapes` shapes."""
        if precision not in PRECISIONS:
            raise ValueError(f"precision {precision!r} is unknown; expected one of "
                             f"{list(PRECISIONS)}")
        self.graph: Graph = load_graph(model_path)
        variable = fix_input_dims(self.graph, served or {})
        half = precision == "fp16"
        if half and any(n.op == "FakeQuant" or n.quant_in is not None for n in self.graph.nodes):
            raise UnsupportedModelError(f"precision fp16 applies to float models; {model_path} "
                                        f"is an int8 model")
        self._dev: OpenCLDevice = open_device(device)
        d = self._dev.device
        half_compute = half and "cl_khr_fp16" in d.extensions
        self.board: boards.Board | None = None
        if self._dev.kind == "fpga":
            self.board = boards.for_device(board, self._dev.emulated, self._dev.name)
            self.build = fpga_build(self.graph, self.board, half)
        else:
            tiled = self._dev.kind == "gpu" if local_tiles is None else local_tiles
            tiling = LocalTiling.for_device(d.max_work_group_size, d.local_mem_size) \
                if tiled else None
            self.build = Build(Build.register_rows(self._dev.kind, d.native_vector_width_float),
                               tiling, None, half, half_compute)
        self.device = Device(self._dev.name, self._dev.kind, "opencl", self._dev.emulated)
        self.inputs = tuple(TensorSignature(n, "FP32", s) for n, s in self.graph.inputs)
        self.outputs = tuple(TensorSignature(n, "FP32", s) for n, s in self.graph.outputs)
        self._cache = cache or ProgramCache()
        self._consts = SharedConsts(self._dev.context, per_shape=bool(variable))
        self.plan_counts = {"built": 0, "evicted": 0}
        self._listener: PlanEvents | None = None
        # Raises for unsupported ops before the device is touched.
        first, several = self._check(variable)
        self.slice = SLICE_TILES * self.build.rows
        self.kernels = kernels_of(first, several, self.build)
        self.program = self._cache.program(self._dev, self.kernels, self.build.defines,
                                           self.board)
        self.on_host = first.on_host  # FPGA: node -> why the host computes it
        if first.on_host:
            log.info("%s on %s: %d nodes on the host, the rest on the board's pipeline: %s",
                     model_path, self._dev.name, len(first.on_host), _reasons(first.on_host))
        names = [name for name, _ in self.graph.inputs]
        # Fixed shapes: one set of plans, never evicted; variable dims: per request shape.
        self._fixed = None if variable else ShapePlans(None)
        self._shapes = ShapeCache(names, max_shapes, self._report) if variable else None
        if self._fixed is None:
            log.info("OpenCL engine for %s on %s (%s, %s): %d launches at size %d of %s; "
                     "planned per request shape, the last %d shapes kept", model_path,
                     self.device.name, self._dev.description, self.build.defines,
                     len(first.launches), PROBE_SIZE, _named(variable), max_shapes)
            return
        plan = self.plan(1, first)
        log.info("OpenCL engine for %s on %s (%s, %s): %d launches; fused %s; batch-1 buffers "
                 "%.1f MiB peak vs %.1f MiB for all tensors", model_path, self.device.name,
                 self._dev.description, self.build.defines, len(first.launches),
                 dict(self.graph.fused),
                 plan.peak_bytes / 2**20, plan.sum_bytes / 2**20)

    def _check(self, variable: list[tuple[str, int]]) -> tuple[Lowered, Lowered]:
        """The lowered plans that load checks the model with; with variable dims, at
        PROBE_SIZE. A model that cannot be planned there is refused naming the dims, so that
        the daemon serves it on its next device."""
        if not variable:
            return lowered_plans(self.graph, self.build)
        probe = {name: tuple(PROBE_SIZE if d == -1 else d for d in dims[1:])
                 for name, dims in self.graph.inputs}
        try:
            return lowered_plans(self.graph, self.build, probe)
        except UnsupportedOpError:
            raise  # no size helps
        except UnsupportedModelError as e:
            raise UnsupportedModelError(
                f"{_named(variable)} variable (-1 or absent in config.pbtxt's dims, symbolic in "
                f"the graph), and the OpenCL engine, which plans each request shape, cannot "
                f"plan the model at size {PROBE_SIZE} there: {e}; give the dim a size in "
                f"config.pbtxt") from e

    def report_plans(self, listener: PlanEvents) -> None:
        """Tells `listener` of every plan built or evicted from now on, and at once of those
        so far (the plans load built)."""
        for event, count in self.plan_counts.items():
            if count:
                listener(event, count)
        self._listener = listener

    def _report(self, event: str, count: int) -> None:
        self.plan_counts[event] += count
        if self._listener is not None:
            self._listener(event, count)

    def plan(self, batch: int, lowered: Lowered | None = None,
             shape: ShapePlans | None = None) -> Executor:
        """The launch plan for `batch` samples, compiled once and cached; of `shape`'s plans
        where the served dims are variable."""
        shape = shape or self._fixed
        if shape is None:
            raise ValueError("the model's dims are variable: its plans are per request shape")
        plan = shape.by_batch.get(batch)
        if plan is None:
            lowered = lowered or lower_for(self.graph, batch, self.build, shape.samples)
            plan = shape.by_batch[batch] = Executor(
                self._dev, self.program, lowered, self._consts.for_plan(lowered.consts, shape),
                concurrent_stages=self.build.pipeline is not None)
            self._report("built", 1)
        return plan

    def prepare(self, batch: int) -> None:
        """The plan for `batch` samples of the served shape, built now (warm-up); models with
        variable dims plan per request shape, when one comes."""
        if self._fixed is not None:
            self.plan(self.step(batch))

    def step(self, batch: int) -> int:
        """The samples one plan runs at a time: CPUs run slices, other devices the batch."""
        return min(batch, self.slice) if self.device.kind == "cpu" else batch

    def run(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        batch = next(iter(inputs.values())).shape[0]
        # Looked up once: a new shape evicts another's plans before anything is enqueued.
        if self._fixed is not None:
            shape = self._fixed
        else:
            assert self._shapes is not None  # variable shapes: one or the other is set
            shape = self._shapes.get(inputs)
        step = self.step(batch)
        if batch <= step:
            return self.plan(batch, shape=shape).run(inputs, outputs)
        sliced = self.plan(step, shape=shape)  # shapes from the plan: outputs may lack them
        results = {name: np.empty((batch, *sliced.output_shape(name)[1:]), self.build.dtype)
                   for name in outputs}
        held = []  # every slice is enqueued before the one wait: no host round trip between
        for lo in range(0, batch, step):
            hi = min(lo + step, batch)
            held += self.plan(hi - lo, shape=shape).enqueue(
                {k: v[lo:hi] for k, v in inputs.items()},
                {k: v[lo:hi] for k, v in results.items()})
        self._dev.queue.finish()
        return as_float32(results)


def _reasons(on_host: dict[str, str]) -> str:
    """`Add x3 (op Add has no FPGA kernel); conv1 (...)`: the nodes by reason."""
    by_reason: dict[str, list[str]] = {}
    for node, reason in on_host.items():
        by_reason.setdefault(reason, []).append(node)
    return "; ".join(f"{', '.join(nodes[:3])}{f' and {len(nodes) - 3} more' * (len(nodes) > 3)}"
                     f" ({reason})" for reason, nodes in by_reason.items())


def _named(variable: list[tuple[str, int]]) -> str:
    """`input 'x': dim 3 is` or `input 'x': dims 2, 3 are`, for each input."""
    by_input: dict[str, list[int]] = {}
    for name, axis in variable:
        by_input.setdefault(name, []).append(axis)
    return "; ".join(
        f"input {name!r}: dim{'s' * (len(axes) > 1)} {', '.join(map(str, axes))} "
        f"{'are' if len(axes) > 1 else 'is'}" for name, axes in by_input.items())
