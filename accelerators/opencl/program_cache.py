"""Programs for a device: GPU and CPU programs are built from kernels/*.cl and their binaries
cached on disk, keyed by source, build options, device name and driver version (a driver
upgrade invalidates them); FPGA boards load precompiled binaries (`.aocx` for Intel, `.xclbin`
for AMD/Xilinx) from a configured folder. An emulated FPGA builds from source like a CPU, with
the board's macros, unless that folder is configured: then it loads its binary like a board."""

from __future__ import annotations

import hashlib
import logging
import os
from importlib import resources
from pathlib import Path

import pyopencl as cl

from accelerators import safe_files
from accelerators.opencl.device import OpenCLDevice
from accelerators.opencl.fpga.board import Board
from accelerators.opencl.fpga.manifest import Manifest, fpga_source
from accelerators.opencl.launch import GEMM_WG, VN, WG_1D

log = logging.getLogger(__name__)

BUILD_OPTIONS = f"-DWG_1D={WG_1D} -DGEMM_WG={GEMM_WG} -DVN={VN}"
FPGA_BINARY_SUFFIXES = (".aocx", ".xclbin")
CACHE_DIR_ENV = "HETSERVE_OPENCL_CACHE_DIR"
FPGA_BINARIES_ENV = "HETSERVE_FPGA_BINARIES"


class MissingKernelsError(RuntimeError):
    pass


class BadBinaryError(RuntimeError):
    """An FPGA binary the device refuses (built for another board or runtime, or damaged)."""


def kernel_source() -> str:
    """GPUs' and CPUs' kernels: kernels/common.cl, then every other kernel file, in a stable
    order (FPGAs build kernels/fpga/pipeline.cl alone: manifest.fpga_source)."""
    files = sorted((f for f in resources.files("kernels").iterdir() if f.name.endswith(".cl")),
                   key=lambda f: (f.name != "common.cl", f.name))
    return "\n".join(f"// ---- {f.name}\n{f.read_text()}" for f in files)


def default_cache_dir() -> Path:
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "hetserve" / "opencl"


def default_binary_dir() -> Path | None:
    value = os.environ.get(FPGA_BINARIES_ENV)
    return Path(value) if value else None


class ProgramCache:
    def __init__(self, cache_dir: Path | None = None, binary_dir: Path | None = None,
                 options: str = BUILD_OPTIONS, from_source: bool = False) -> None:
        """`binary_dir`: FPGA binaries ($HETSERVE_FPGA_BINARIES by default). `from_source`:
        emulated FPGAs build from source even where that folder is set (`hetserve fpga
        build`, which writes the binaries)."""
        self.cache_dir = cache_dir or default_cache_dir()
        self.binary_dir = None if from_source else (
            binary_dir if binary_dir is not None else default_binary_dir())
        self.options = options
        self.hits = 0  # programs loaded from the on-disk cache

    def program(self, dev: OpenCLDevice, required: set[str], defines: str = "",
                board: Board | None = None) -> cl.Program:
        """`defines`: build macros beside BUILD_OPTIONS (launch.Build's). `required` names the
        kernels the model's plans launch, and the storage marker of its precision
        (`storage_fp32`, `storage_fp16`: kernels/common.cl), so that a program built for
        another precision is refused too. FPGAs (`board`: the profile the build is sized
        by) build the pipeline's source alone, and a board's binary must carry the manifest
        of exactly that build."""
        # The pipeline has its own macros only: BUILD_OPTIONS size the others' work-groups.
        options = defines if board else f"{self.options} {defines}".strip()
        source = fpga_source() if board else kernel_source()
        binary = None
        if dev.kind == "fpga" and (self.binary_dir is not None or not dev.emulated):
            binary = self._fpga_binary(dev)
            if board is not None:
                Manifest.expected(source, options, board, built_for(dev, board),
                                  required).check(binary)
            program = self._load(dev, binary)
        else:
            program = self._built(dev, source, options)
        present = set(filter(None, str(program.get_info(cl.program_info.KERNEL_NAMES)).split(";")))
        missing = sorted(required - present)
        if missing:
            raise MissingKernelsError(
                f"the program for {dev.name} ({dev.description}"
                f"{f', from {binary}' if binary else ''}) lacks kernels {missing}; "
                f"it has {sorted(present)}")
        return program

    def key(self, dev: OpenCLDevice, source: str, options: str | None = None) -> str:
        d = dev.device
        text = "\0".join([source, self.options if options is None else options,
                          d.platform.name, d.name, d.driver_version, d.version])
        return hashlib.sha256(text.encode()).hexdigest()

    def _built(self, dev: OpenCLDevice, source: str, options: str) -> cl.Program:
        safe_files.check_trusted(self.cache_dir, f"the OpenCL program cache (${CACHE_DIR_ENV})")
        path = self.cache_dir / f"{self.key(dev, source, options)}.bin"
        if path.exists():
            try:
                program = cl.Program(dev.context, [dev.device], [path.read_bytes()])
                program.build(options)
                self.hits += 1
                return program
            except cl.Error as e:  # a truncated or foreign file: rebuild over it
                log.warning("cached OpenCL binary %s unusable (%s); rebuilding", path, e)
        program = cl.Program(dev.context, source).build(options)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        # Atomic: concurrent daemons never read half a file.
        safe_files.write_file(path, program.binaries[0], flag=None)
        log.info("built OpenCL kernels for %s; cached at %s", dev.description, path)
        return program

    def _fpga_binary(self, dev: OpenCLDevice) -> Path:
        if self.binary_dir is None:
            raise FileNotFoundError(
                f"{dev.name} is an FPGA: set {FPGA_BINARIES_ENV} to the folder holding its "
                f"precompiled kernels ({' or '.join(FPGA_BINARY_SUFFIXES)}; `hetserve fpga "
                f"build` writes them, docs/opencl.md)")
        safe_files.check_trusted(self.binary_dir, f"the FPGA binaries (${FPGA_BINARIES_ENV})")
        return fpga_binary(self.binary_dir, dev.device.name)

    @staticmethod
    def _load(dev: OpenCLDevice, binary: Path) -> cl.Program:
        """clCreateProgramWithBinary, then the build that readies it, with an error naming the
        file where the device refuses it."""
        try:
            program = cl.Program(dev.context, [dev.device], [binary.read_bytes()])
            program.build()
        except cl.Error as e:
            raise BadBinaryError(
                f"{dev.name} ({dev.description}) refuses the binary {binary}: {e}; it was "
                f"built for another device or runtime, or is damaged: rebuild it for this one "
                f"(`hetserve fpga build`, docs/opencl.md)") from e
        log.info("loaded FPGA binary %s on %s", binary, dev.description)
        return program


def built_for(dev: OpenCLDevice, board: Board) -> str:
    """What an FPGA binary's manifest names as its target: the emulator's device name, or the
    board's compile target (aoc -board=, v++ --platform), which is all a build knows of a board
    it cannot see."""
    return dev.device.name.strip() if dev.emulated else board.compile_target


def fpga_binary(folder: Path, device_name: str) -> Path:
    """The binary for a board: `<board>.aocx`/`<board>.xclbin` when the device name names one,
    else the folder's only binary."""
    found = sorted(p for p in folder.iterdir() if p.suffix in FPGA_BINARY_SUFFIXES) \
        if folder.is_dir() else []
    named = [p for p in found if p.stem.lower() in device_name.lower()]
    if named:
        return named[0]
    if len(found) == 1:
        return found[0]
    raise FileNotFoundError(
        f"no FPGA binary for device {device_name!r} in {folder}: expected one "
        f"{'/'.join(FPGA_BINARY_SUFFIXES)} file, or one named after the board; found "
        f"{[p.name for p in found]}")
