"""What a compiled plan is made of: launches of named kernels on named buffers, the kernels'
work-group sizes and argument codes, shared by the lowering, the planner and the executor."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from accelerators.opencl.fpga.board import Board
from accelerators.opencl.ir import Node

# Work-group sizes and vector width: program_cache.BUILD_OPTIONS passes them to the kernels.
WG_1D, GEMM_WG, VN = 64, 4, 16
GEMV_SPLIT_K = 1024  # one-row GEMMs with K at least this split K across work-items
ACT = {None: 0, "Relu": 1, "LeakyRelu": 2, "Clip": 3, "Sigmoid": 4, "HardSigmoid": 5,
       "HardSwish": 6, "Silu": 7, "Gelu": 8}  # kernels/common.cl's ACT_*
ACT_GELU_TANH = 9  # Gelu with approximate="tanh"
BINARY = {"Add": 0, "Sub": 1, "Mul": 2, "Div": 3, "Sum": 0, "Pow": 4, "Max": 5, "Min": 6,
          "PRelu": 7}  # elementwise.cl's OP_*
# elementwise.cl's UNARY_*; "Square" is Pow by 2.
UNARY = {"Neg": 0, "Sqrt": 1, "Reciprocal": 2, "Square": 3, "Erf": 4, "Tanh": 5, "Exp": 6,
         "Abs": 7, "Log": 8, "Softplus": 9, "Mish": 10}
BIAS_NONE, BIAS_ROW, BIAS_COL = 0, 1, 2


@dataclass(frozen=True)
class LocalTiling:
    """gemm_local and conv_local (GPUs, FPGAs): ts x ts tiles of both operands in local memory,
    work-groups of ts x ts / wpt work-items each accumulating wpt rows; built with -DTS -DWPT."""
    ts: int = 32
    wpt: int = 8

    @property
    def rows(self) -> int:
        return self.ts // self.wpt

    @property
    def defines(self) -> str:
        return f"-DTS={self.ts} -DWPT={self.wpt}"

    @classmethod
    def for_device(cls, max_work_group: int, local_mem_bytes: int) -> LocalTiling:
        """The largest tile whose work-group the device allows and whose two tiles take at most
        3/4 of its local memory (the rest for a second resident work-group's share)."""
        for ts in (64, 32, 16):
            if ts * ts // 8 <= max_work_group and 2 * ts * ts * 4 <= local_mem_bytes * 3 // 4:
                return cls(ts, 8)
        return cls(8, 8)


@dataclass(frozen=True)
class Pipeline:
    """The FPGA pipeline's compile-time parameters (kernels/fpga/pipeline.cl): its board
    profile's MAC array, buffers and FIFOs, the arithmetic, and the activations its epilogue
    has."""
    board: Board
    q8: bool = False  # int8 x int8 MACs (QDQ models)
    leaky: bool = False  # LeakyRelu in the epilogue (ReLU and Clip always are)

    @property
    def pipe_depth(self) -> int:
        """Partial sums a lane keeps: a float adder's latency; an integer add closes in one."""
        return 1 if self.q8 else 6

    @property
    def fifo(self) -> str:
        """What joins the stages: AMD/Xilinx pipes, or Intel channels."""
        return "XILINX_PIPES" if self.board.vendor == "xilinx" else "INTEL_CHANNELS"

    @property
    def defines(self) -> str:
        b = self.board
        flags = [f"-DVEC={b.vec}", f"-DLANE={b.lane}", f"-DPIPE_DEPTH={self.pipe_depth}",
                 f"-DWEIGHT_BUF={b.weight_buffer}", f"-DLINE_BUF={b.line_buffer}",
                 f"-DPOOL_BUF={b.pool_buffer}", f"-DCHANNEL_DEPTH={b.channel_depth}",
                 f"-D{self.fifo}", "-DQ8" if self.q8 else "", "-DACT_LEAKY" if self.leaky else ""]
        return " ".join(filter(None, flags))


@dataclass(frozen=True)
class Build:
    """The choices a device's program is built with (its -D macros), which the lowering sizes
    its launches and buffers by."""
    rows: int = 8  # of a gemm_tile register tile (CPUs: register_rows)
    tiling: LocalTiling | None = None  # local-memory tiles (GPUs)
    pipeline: Pipeline | None = None  # FPGAs: kernels/fpga/pipeline.cl alone
    half: bool = False  # fp16 models: tensors and weights stored as halves
    half_compute: bool = False  # the local tiles in half arithmetic (cl_khr_fp16)

    @property
    def dtype(self) -> type:
        """What the device buffers of tensors and float weights hold."""
        return np.float16 if self.half else np.float32

    @property
    def defines(self) -> str:
        if self.pipeline:
            return " ".join(filter(None, [self.pipeline.defines,
                                          "-DHALF_STORAGE" if self.half else ""]))
        flags = [f"-DTM={self.rows}", self.tiling.defines if self.tiling else "",
                 "-DHALF_STORAGE" if self.half else "",
                 "-DHALF_COMPUTE" if self.half_compute else ""]
        return " ".join(filter(None, flags))

    @property
    def storage_kernel(self) -> str:
        """kernels/common.cl's marker of the storage the program was built for (the FPGA
        pipeline's binaries carry a manifest instead: fpga/manifest.py)."""
        return "storage_fp16" if self.half else "storage_fp32"

    @staticmethod
    def register_rows(kind: str, native_float_width: int) -> int:
        """Rows of gemm_tile's register tile (TM) x VN = 16 columns. On CPUs without AVX-512
        (native width 8: 16 ymm registers) 6 rows: 12 accumulators and room for B's vector
        and the broadcast; 8 rows spilled there, and 8 x 8 tiles reloaded B too often
        (measured on PoCL, BENCHMARKS.md). With AVX-512 (32 registers), and elsewhere, 8."""
        return 6 if kind == "cpu" and native_float_width < 16 else 8


# Each input's shape after the batch axis: a request's, where the served dims are variable.
Samples = dict[str, tuple[int, ...]]


@dataclass(frozen=True)
class Ref:
    """A device buffer: a planned buffer (`storage`) or an uploaded constant."""
    name: str


@dataclass(frozen=True)
class Dyn:
    shape: tuple[int, ...]
    storage: str  # the buffer holding it; reshapes share their input's


@dataclass
class Launch:
    kernel: str
    global_size: tuple[int, ...]
    local_size: tuple[int, ...]
    args: list
    node: str
    flops: int = 0
    # 0: the main queue. k > 0: the k-th stage of a chain of single work-item kernels joined by
    # channels or pipes (the FPGA pipeline), each stage on its own queue, all running at once.
    stage: int = 0
    host: HostStep | None = None  # a node the host computes (kernel HOST)


HOST = "host"  # Launch.kernel of a node computed on the host


@dataclass(frozen=True)
class HostStep:
    """A node an FPGA's pipeline does not cover, computed on the host between device launches:
    its inputs (device tensors, or constants known at lowering) and its outputs' tensors."""
    node: Node
    inputs: tuple[Dyn | np.ndarray | None, ...]
    outputs: tuple[Dyn, ...]
    opset: int


@dataclass
class Lowered:
    launches: list[Launch] = field(default_factory=list)
    storages: dict[str, int] = field(default_factory=dict)  # name -> bytes
    consts: dict[str, np.ndarray] = field(default_factory=dict)  # device constants
    inputs: dict[str, Dyn] = field(default_factory=dict)
    outputs: dict[str, Dyn] = field(default_factory=dict)
    dtype: type = np.float32  # of the input and output buffers (Build.dtype)
    on_host: dict[str, str] = field(default_factory=dict)  # FPGA: node -> why the host runs it


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def ints(*values: int) -> list[np.int32]:
    return [np.int32(v) for v in values]


def activation_args(node: Node, values: Mapping[str, np.ndarray | Dyn]) -> list:
    """(code, a, b) of the activation fused into `node`, or of `node` itself; `values`: the
    lowering's tensors, among them a Clip's bounds."""
    act = node if node.op in ACT else node.activation
    if act is None:
        return [np.int32(0), np.float32(0), np.float32(0)]
    a = b = 0.0
    if act.op == "Gelu" and act.attrs.get("approximate", "none") == "tanh":
        return [np.int32(ACT_GELU_TANH), np.float32(0), np.float32(0)]
    if act.op == "LeakyRelu":
        a = act.attrs.get("alpha", 0.01)
    elif act.op == "HardSigmoid":
        a, b = act.attrs.get("alpha", 0.2), act.attrs.get("beta", 0.5)
    elif act.op == "Clip":
        # Constants where the Clip is fused (graph.py fuses no other).
        bounds = [cast(np.ndarray, values[i]) if i else None for i in act.inputs[1:3]] + [
            None, None]
        a = float(bounds[0]) if bounds[0] is not None else act.attrs.get("min", -3.4e38)
        b = float(bounds[1]) if bounds[1] is not None else act.attrs.get("max", 3.4e38)
    return [np.int32(ACT[act.op]), np.float32(a), np.float32(b)]
