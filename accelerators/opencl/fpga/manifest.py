"""What an FPGA binary was built from, written beside it by `hetserve fpga build`
(`<binary>.json`) and checked before the engine loads it: the hash of the kernel source, the
build options, the board profile and its parameters, the device and the kernel set. A binary
whose manifest differs from what the engine would build in any field is refused, naming the
field: a stale source (a kernel body changed, the names kept), another board's or device's
binary, other array or buffer sizes, another precision."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

from accelerators import safe_files
from accelerators.opencl.fpga.board import Board

SOURCE = ("fpga", "pipeline.cl")  # under kernels/: the FPGA kernel set, alone
FIELDS = ("source_sha256", "options", "board", "device", "kernels", "parameters")


class ManifestError(RuntimeError):
    """A binary built from something other than what the engine would build."""


def fpga_source() -> str:
    return resources.files("kernels").joinpath(*SOURCE).read_text()


@dataclass(frozen=True)
class Manifest:
    source_sha256: str
    options: str
    board: str
    device: str  # the OpenCL device name the binary was built by or for
    kernels: list[str]
    parameters: dict  # the board profile, as built

    @classmethod
    def expected(cls, source: str, options: str, board: Board, device: str,
                 kernels: set[str]) -> Manifest:
        return cls(hashlib.sha256(source.encode()).hexdigest(), options, board.name,
                   device.strip(), sorted(kernels), asdict(board))

    def write(self, binary: Path, force: bool = False) -> Path:
        text = json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"
        return safe_files.write_file(path_of(binary), text.encode(), force)

    def check(self, binary: Path) -> None:
        """Raises ManifestError naming the first field where `binary`'s manifest differs."""
        path = path_of(binary)
        try:
            with safe_files.folder(path.parent, force=True) as fd:
                found = json.loads(safe_files.read_at(fd, path.name).decode())
        except (OSError, ValueError) as e:
            raise ManifestError(f"the FPGA binary {binary} has no readable manifest {path} "
                                f"({e}): rebuild it with `hetserve fpga build`") from e
        want = asdict(self)
        for name in FIELDS:
            if found.get(name) != want[name]:
                raise ManifestError(
                    f"the FPGA binary {binary} was built with {name} "
                    f"{_short(found.get(name))}, and this engine builds with "
                    f"{_short(want[name])}: rebuild it with `hetserve fpga build`")


def path_of(binary: Path) -> Path:
    return binary.with_name(binary.name + ".json")


def _short(value: object) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 160 else text[:157] + "..."
