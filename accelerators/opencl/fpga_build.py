"""`hetserve fpga build`: the program a model needs on an FPGA. On an emulated board it builds the
kernels from source with the board's macros and writes the binary the platform returns, which
`$HETSERVE_FPGA_BINARIES` then loads as a board's (clCreateProgramWithBinary). For a real board
it writes the kernel source and the vendor compiler's command lines: `aoc` and `v++` run for
hours and need the board's kit, so they are run by hand (docs/opencl.md)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from accelerators import safe_files
from accelerators.devices import opencl_devices
from accelerators.engine import parse_device_name
from accelerators.opencl.engine import OpenCLEngine, kernels_of, lowered_plans
from accelerators.opencl.graph import load_graph
from accelerators.opencl.launch import Build
from accelerators.opencl.program_cache import BUILD_OPTIONS, ProgramCache, kernel_source

SOURCE_NAME = "hetserve.cl"
EMULATOR_BINARY = "emulation.aocx"  # its stem is in the emulator's device name


@dataclass(frozen=True)
class FpgaBuild:
    kernels: set[str]  # what the model's plans launch
    options: str  # the build macros (Intel's; AMD/Xilinx's name their pipes instead)
    source: Path
    binary: Path | None  # written for an emulated board
    commands: list[str]  # for a real board: the vendor compilers' lines


def build(model: Path, out: Path, device: str = "fpga0", precision: str = "fp32",
          pipelined: bool = False, force: bool = False) -> FpgaBuild:
    """The program for `model` on `device`: a binary where the device is an emulator, else the
    source and the commands that compile it for a board. Files go to `out` as safe_files
    writes them (`force`: as root, into a folder another user owns)."""
    safe_files.make_folder(out, force)
    source = safe_files.write_file(out / SOURCE_NAME, kernel_source(), force)
    if _emulated(device):
        engine = OpenCLEngine(model, device, ProgramCache(from_source=True),
                              pipelined=pipelined, precision=precision)
        binary = safe_files.write_file(out / EMULATOR_BINARY, engine.program.binaries[0], force)
        return FpgaBuild(engine.kernels, _options(engine.build), source, binary, [])
    graph = load_graph(model)
    builds = {vendor: Build.for_fpga(vendor, pipelined, precision == "fp16")
              for vendor in ("Intel", "Xilinx")}
    kernels = kernels_of(*lowered_plans(graph, builds["Intel"]), builds["Intel"])
    return FpgaBuild(kernels, _options(builds["Intel"]), source, None,
                     [_command(vendor, _options(b), source) for vendor, b in builds.items()])


def _emulated(device: str) -> bool:
    """Whether `device` (`fpga0`) is an emulated board here; False where it is a board or
    absent (the commands for a board are then what can be given)."""
    parsed = parse_device_name(device)
    if parsed is None or parsed[0] != "fpga":
        raise ValueError(f"device {device!r} is not an FPGA's name, e.g. fpga0")
    fpgas = [d for d in opencl_devices() if d.kind == "fpga"]
    return parsed[1] < len(fpgas) and fpgas[parsed[1]].emulated


def _options(build: Build) -> str:
    return f"{BUILD_OPTIONS} {build.defines}"


def _command(vendor: str, options: str, source: Path) -> str:
    if vendor == "Xilinx":
        return (f"v++ -c -t hw --platform <platform> {options} -o hetserve.xo {source} && "
                f"v++ -l -t hw --platform <platform> -o <board>.xclbin hetserve.xo")
    return f"aoc -board=<board> {options} {source} -o <board>.aocx"
