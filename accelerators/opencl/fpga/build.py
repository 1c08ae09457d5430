"""`hetserve fpga build`: the FPGA kernel set (kernels/fpga/pipeline.cl alone) built with a
board profile's parameters and the model's precision, and the manifest that the engine checks
before it loads the binary (manifest.py). On Intel's emulator it builds the kernels and writes
the binary the platform returns, which `$HETSERVE_FPGA_BINARIES` then loads as a board's. For a
board it writes the source, the manifest of the binary to come, and the vendor compiler's
command line: `aoc` and `v++` run for hours and need the board's kit, so they are run by hand
(docs/fpga.md)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from accelerators import safe_files
from accelerators.devices import opencl_devices
from accelerators.engine import parse_device_name
from accelerators.opencl.engine import OpenCLEngine, fpga_build
from accelerators.opencl.fpga import board as boards
from accelerators.opencl.fpga.estimate import resources
from accelerators.opencl.fpga.lowering import STAGES
from accelerators.opencl.fpga.manifest import Manifest, fpga_source
from accelerators.opencl.graph import load_graph
from accelerators.opencl.program_cache import ProgramCache

SOURCE_NAME = "hetserve.cl"
EMULATOR_BINARY = "emulation.aocx"  # its stem is in the emulator's device name


@dataclass(frozen=True)
class FpgaBuild:
    board: boards.Board
    kernels: set[str]
    options: str  # the build's macros
    source: Path
    binary: Path  # written for an emulated board; for a board, the one its compiler will write
    manifest: Path
    commands: list[str]  # for a board: the vendor compiler's line


def build(model: Path, out: Path, device: str = "fpga0", board: str | None = None,
          precision: str = "fp32", force: bool = False) -> FpgaBuild:
    """The program for `model` on `device`: a binary where the device is Intel's emulator, else
    the source and the command that compiles it for `board` (a profile's name or file; by
    default $HETSERVE_FPGA_BOARD). Files go to `out` as safe_files writes them (`force`: as
    root, into a folder another user owns)."""
    emulated = _emulated(device)
    profile = boards.for_device(board, emulated, device)
    options = fpga_build(load_graph(model), profile, precision == "fp16")
    assert options.pipeline is not None  # an FPGA's build
    datapath = "int8" if options.pipeline.q8 else precision
    dsps, rams = resources(profile, datapath)
    if dsps > profile.dsp_blocks or rams > profile.ram_blocks:
        raise boards.BoardError(
            f"the pipeline's VEC {profile.vec} x LANE {profile.lane} array and buffers take "
            f"about {dsps} DSPs and {rams} RAM blocks in {datapath}; "
            f"{profile.name} has {profile.dsp_blocks} and {profile.ram_blocks} (estimates): "
            f"give --board a copy of its profile with the vec and lane that `hetserve fpga "
            f"plan --search` finds")
    safe_files.make_folder(out, force)
    text = fpga_source()
    source = safe_files.write_file(out / SOURCE_NAME, text, force)
    if emulated:
        engine = OpenCLEngine(model, device, ProgramCache(from_source=True), precision=precision,
                              board=profile.name if board is None else board)
        binary = safe_files.write_file(out / EMULATOR_BINARY, engine.program.binaries[0], force)
        target = engine.program.devices[0].name.strip()
        commands = []
    else:
        suffix = ".xclbin" if profile.vendor == "xilinx" else ".aocx"
        binary = out / f"{profile.compile_target}{suffix}"
        target = profile.compile_target
        commands = [_command(profile, options.defines, source, binary)]
    manifest = Manifest.expected(text, options.defines, profile, target, set(STAGES)).write(
        binary, force)
    return FpgaBuild(profile, set(STAGES), options.defines, source, binary, manifest, commands)


def _emulated(device: str) -> bool:
    """Whether `device` (`fpga0`) is Intel's emulator here; False where it is a board or
    absent (the command for a board is then what can be given)."""
    parsed = parse_device_name(device)
    if parsed is None or parsed[0] != "fpga":
        raise ValueError(f"device {device!r} is not an FPGA's name, e.g. fpga0")
    fpgas = [d for d in opencl_devices() if d.kind == "fpga"]
    return parsed[1] < len(fpgas) and fpgas[parsed[1]].emulated


def _command(board: boards.Board, options: str, source: Path, binary: Path) -> str:
    if board.vendor == "xilinx":
        return (f"v++ -c -t hw --platform {board.compile_target} {options} -k all "
                f"-o hetserve.xo {source} && v++ -l -t hw --platform {board.compile_target} "
                f"-o {binary} hetserve.xo")
    return f"aoc -board={board.compile_target} -fp-relaxed {options} {source} -o {binary}"
