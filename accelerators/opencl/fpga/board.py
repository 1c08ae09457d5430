"""Board profiles (kernels/boards/*.toml): a board's resources, its typical clock and power, and
the compile-time parameters of the pipeline built for it (the MAC array's VEC x LANE and the
on-chip buffers' depths). The engine sizes an FPGA's launches by its profile, `hetserve fpga
build` compiles with it, and the hardware model (estimate.py) prices it."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, fields, replace
from importlib import resources
from pathlib import Path

BOARD_ENV = "HETSERVE_FPGA_BOARD"  # the profile an FPGA device is driven by
EMULATOR = "emulator"


class BoardError(ValueError):
    pass


@dataclass(frozen=True)
class Board:
    name: str
    description: str
    vendor: str  # "intel" (aoc, channels) or "xilinx" (v++, pipes)
    family: str  # cyclone5 | stratix5 | arria10 | stratix10 | ultrascale | emulator
    compile_target: str  # aoc's -board, v++'s --platform
    dsp_blocks: int
    ram_blocks: int
    ram_block_kbit: int
    ddr_gbytes_per_s: float
    fmax_mhz: float
    power_w: float  # typical under load: the model's power, never a measurement
    vec: int  # input channels a clock
    lane: int  # output channels a clock
    weight_buffer: int  # VEC x LANE words
    line_buffer: int  # VEC words
    pool_buffer: int  # LANE words
    channel_depth: int  # of the FIFOs between the stages

    @property
    def macs_per_clock(self) -> int:
        return self.vec * self.lane

    def with_array(self, vec: int, lane: int) -> Board:
        return replace(self, vec=vec, lane=lane)


_REQUIRED = [f.name for f in fields(Board) if f.name != "name"]
_VENDORS = ("intel", "xilinx")


def names() -> list[str]:
    """The shipped profiles."""
    return sorted(f.name.removesuffix(".toml") for f in resources.files("kernels").joinpath(
        "boards").iterdir() if f.name.endswith(".toml"))


def load(name_or_path: str) -> Board:
    """A shipped profile by name (`de5net`), or a profile file of a site's own."""
    path = Path(name_or_path)
    if path.suffix == ".toml":
        try:
            text = path.read_text()
        except OSError as e:
            raise BoardError(f"board profile {name_or_path!r} cannot be read: {e}") from e
        return parse(path.stem, text, str(path))
    if name_or_path not in names():
        raise BoardError(f"board {name_or_path!r} is unknown; expected one of {names()} or a "
                         f"profile file ending in .toml")
    text = resources.files("kernels").joinpath("boards", f"{name_or_path}.toml").read_text()
    return parse(name_or_path, text, f"kernels/boards/{name_or_path}.toml")


def parse(name: str, text: str, where: str) -> Board:
    """A profile from TOML, every field present and of its type, the array a power of two."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise BoardError(f"board profile {where}: {e}") from e
    missing = [f for f in _REQUIRED if f not in raw]
    if missing:
        raise BoardError(f"board profile {where}: field {missing[0]!r} is missing; a profile "
                         f"names {_REQUIRED}")
    unknown = sorted(set(raw) - set(_REQUIRED))
    if unknown:
        raise BoardError(f"board profile {where}: field {unknown[0]!r} is unknown; expected "
                         f"only {_REQUIRED}")
    values: dict = {"name": name}
    for f in fields(Board):
        if f.name == "name":
            continue
        value, kind = raw[f.name], {"str": str, "int": int, "float": float}[str(f.type)]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise BoardError(f"board profile {where}: field {f.name!r} is {value!r}; expected "
                             f"a {kind.__name__}")
        if isinstance(value, int | float) and value < 0:
            raise BoardError(f"board profile {where}: field {f.name!r} is {value}; expected "
                             f"0 or more")
        values[f.name] = value
    board = Board(**values)
    if board.vendor not in _VENDORS:
        raise BoardError(f"board profile {where}: field 'vendor' is {board.vendor!r}; expected "
                         f"one of {list(_VENDORS)}")
    for field in ("vec", "lane"):
        n = getattr(board, field)
        if n < 1 or n & (n - 1):
            raise BoardError(f"board profile {where}: field {field!r} is {n}; expected a "
                             f"power of two")
    return board


def for_device(name: str | None, emulated: bool, device: str) -> Board:
    """The profile an FPGA device is driven by: `name`, else $HETSERVE_FPGA_BOARD, else the
    emulator's where the device is Intel's emulator. A board must be named: its binary was
    built for one profile, and the engine must size its launches the same way."""
    chosen = name or os.environ.get(BOARD_ENV) or (EMULATOR if emulated else "")
    if not chosen:
        raise BoardError(f"{device} is an FPGA board: set {BOARD_ENV} to its profile, one of "
                         f"{names()} or a .toml file of your own (docs/fpga.md)")
    return load(chosen)
