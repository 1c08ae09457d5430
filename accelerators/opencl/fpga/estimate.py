"""The hardware model behind `hetserve fpga plan`: what a model would take on a board, from the
passes the engine would launch there (the same lowering) and the pipeline's structure. It is an
estimate, never a measurement: no board is attached, and the clock after place and route,
routing congestion, DDR refresh and bank conflicts, and the host's share of the time are not
known to it.

Per pass (one layer through read -> conv -> pool -> write, for a whole batch):
- clocks: for each block of LANE output channels, its weights (one LANE x VEC word a clock),
  then for each sample the first output row's input rows, then for each output row the longer
  of its windows (ow x kh x kw x ceil(C / VEC) words, one a clock) and the next row's loads
  (the read stage's flat loop);
- DDR bytes: the weights once a batch, the input rows once for each block, the outputs once;
- time: the larger of clocks / fmax and bytes / (DDR bandwidth x DDR_EFFICIENCY), and which one
  bounds it.
DSPs: VEC x LANE multipliers at the family's MACs per DSP, one per lane for the epilogue's
scale, and about 20 for the multiplies of run-time sizes in the stages' address arithmetic.
RAM blocks: the weight, line and pool buffers at the block's 40-bit port width. Power: the
board profile's typical figure.

Calibrated against PipeCNN's published AlexNet (CaffeNet, 227 x 227) figures, configured as
PipeCNN was (8-bit weights and activations in DDR): tests/accelerators/test_fpga_estimate.py
holds it to +-30% of 150 ms on the DE1-SoC (VEC 8 x LANE 8, 122 MHz) and of 15 ms an image at
batch 16 on the DE5-Net (8 x 32, 206 MHz), and of the 68 and 228 DSPs."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from accelerators.opencl.engine import fpga_build, lower_for
from accelerators.opencl.fpga.board import Board
from accelerators.opencl.fpga.lowering import POOL_ARGS, READ_ARGS, STAGES
from accelerators.opencl.graph import load_graph
from accelerators.opencl.ir import Graph
from accelerators.opencl.launch import Lowered

# What a DDR controller delivers of its peak on long bursts (calibrated on the DE1-SoC's fully
# connected layers, which PipeCNN ran at 2.6 of its 3.2 GB/s).
DDR_EFFICIENCY = 0.8
# MACs a DSP block does a clock: int8, two (the two 18 x 18 multipliers of Cyclone V's and
# Stratix V's variable-precision blocks, the two 18 x 19 of Arria 10's and Stratix 10's); a
# float, one (hard floating point on Arria 10 and Stratix 10, a 27 x 27 and soft logic before).
MACS_PER_DSP = {"int8": 2, "float": 1}
ADDRESS_DSPS = 20
PORT_BITS = 40  # an M10K's or M20K's widest port
PRECISIONS = {"fp32": (4, 4), "fp16": (2, 2), "int8": (1, 4)}  # bytes: weights, activations


@dataclass(frozen=True)
class PassEstimate:
    node: str
    macs: int
    clocks: int
    ddr_bytes: int
    seconds: float
    bound: str  # "compute" | "memory"


@dataclass
class Estimate:
    board: Board
    precision: str
    batch: int
    passes: list[PassEstimate]
    on_host: dict[str, str]  # nodes the host computes, not timed here
    dsps: int
    ram_blocks: int
    misfit: str = ""  # why the parameters do not fit the board; empty where they do
    notes: list[str] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.passes)

    @property
    def images_per_s(self) -> float:
        return self.batch / self.seconds if self.seconds else 0.0

    @property
    def gops(self) -> float:
        """Billions of operations a second, a multiply-add counted as two."""
        return 2 * sum(p.macs for p in self.passes) / self.seconds / 1e9 if self.seconds else 0.0

    @property
    def gops_per_w(self) -> float:
        return self.gops / self.board.power_w if self.board.power_w else 0.0


def resources(board: Board, precision: str) -> tuple[int, int]:
    """(DSP blocks, RAM blocks) the board's array and buffers take."""
    per_dsp = MACS_PER_DSP["int8" if precision == "int8" else "float"]
    dsps = math.ceil(board.macs_per_clock / per_dsp) + board.lane + ADDRESS_DSPS
    on_chip = 8 if precision == "int8" else 32  # bits of a value in the buffers
    depth = board.ram_block_kbit * 1024 // PORT_BITS

    def blocks(width_bits: int, words: int) -> int:
        return math.ceil(width_bits / PORT_BITS) * math.ceil(words / depth)

    rams = (blocks(board.macs_per_clock * on_chip, board.weight_buffer)
            + blocks(board.vec * on_chip, board.line_buffer)
            + blocks(board.lane * 32, board.pool_buffer))
    return dsps, rams


def estimate(lowered: Lowered, board: Board, precision: str, batch: int,
             activation_bytes: int | None = None) -> Estimate:
    """The model of `lowered` (a plan of `batch` samples for `board`'s pipeline).
    `activation_bytes`: per value in DDR between layers, where not this engine's own (4 for fp32
    and int8, whose tensors stay float between layers; 2 for fp16)."""
    weight_bytes, own = PRECISIONS[precision]
    act = activation_bytes or own
    dsps, rams = resources(board, precision)
    bandwidth = board.ddr_gbytes_per_s * 1e9 * DDR_EFFICIENCY
    clock = board.fmax_mhz * 1e6
    passes = []
    launches = lowered.launches
    for i, launch in enumerate(launches):
        if launch.kernel != STAGES[0]:
            continue
        r = dict(zip(READ_ARGS, (int(a) for a in launch.args[1:1 + len(READ_ARGS)])))
        pool = dict(zip(POOL_ARGS, (int(a) for a in launches[i + 2].args)))
        macs = launches[i + 1].flops // 2
        window = r["kh"] * r["kw"] * r["cv"]
        new_rows = min(r["sh"], r["kh"])
        row_words = r["w"] * r["cv"]
        rows = [max(r["ow"] * window, new_rows * row_words if y + 1 < r["oh"] else 0)
                for y in range(r["oh"])]
        per_block = window + r["n"] * (r["kh"] * row_words + sum(rows))
        blocks = r["groups"] * r["blocks"]
        clocks = blocks * per_block
        loaded_rows = min(r["h"], r["kh"] + (r["oh"] - 1) * new_rows)
        ddr = (blocks * window * board.lane * board.vec * weight_bytes
               + blocks * r["n"] * loaded_rows * r["w"] * r["cv"] * board.vec * act
               + r["n"] * r["groups"] * r["blocks"] * board.lane * pool["poh"] * pool["pow"]
               * act)
        compute_s, memory_s = clocks / clock, ddr / bandwidth
        passes.append(PassEstimate(launch.node, macs, clocks, ddr, max(compute_s, memory_s),
                                   "compute" if compute_s >= memory_s else "memory"))
    misfit = ""
    if dsps > board.dsp_blocks:
        misfit = f"{dsps} DSPs needed, the board has {board.dsp_blocks}"
    elif rams > board.ram_blocks:
        misfit = f"{rams} RAM blocks needed, the board has {board.ram_blocks}"
    return Estimate(board, precision, batch, passes, dict(lowered.on_host), dsps, rams, misfit)


def plan(model: Path | Graph, board: Board, precision: str = "int8", batch: int = 1,
         activation_bytes: int | None = None) -> Estimate:
    """The estimate of `model` (a file, or its loaded graph) on `board` as its profile sizes
    the pipeline. A float model priced in int8 has the same passes: only their bytes differ."""
    graph = model if isinstance(model, Graph) else load_graph(model)
    build = fpga_build(graph, board, precision == "fp16")
    return estimate(lower_for(graph, batch, build), board, precision, batch, activation_bytes)


def search(model: Path, board: Board, precision: str = "int8", batch: int = 1,
           activation_bytes: int | None = None) -> list[Estimate]:
    """Every VEC x LANE that fits the board, fastest first (fewer DSPs first among equals):
    the design-space exploration PipeCNN leaves to its users."""
    graph = load_graph(model)
    found = []
    for vec in (4, 8, 16, 32):
        for lane in (4, 8, 16, 32, 64, 128):
            sized = board.with_array(vec, lane)
            if resources(sized, precision)[0] > board.dsp_blocks:
                continue
            candidate = plan(graph, sized, precision, batch, activation_bytes)
            if not candidate.misfit:
                found.append(candidate)
    return sorted(found, key=lambda e: (e.seconds, e.dsps))
