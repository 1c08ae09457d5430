"""`hetserve fpga build` and `hetserve fpga plan`: the FPGA kernel set built for a board
profile (accelerators/opencl/fpga/build.py), and the hardware model's estimate of a model on a
board (estimate.py), both over a model of a repository or an .onnx file (docs/fpga.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from accelerators.opencl.fpga.board import names

PLAN_PRECISIONS = ("int8", "fp16", "fp32")


def add_arguments(commands: argparse._SubParsersAction) -> None:
    fpga = commands.add_parser(
        "fpga", help="build the FPGA pipeline for a board, or estimate a model on one "
                     "(docs/fpga.md)")
    sub = fpga.add_subparsers(dest="fpga_command", required=True)
    build = sub.add_parser(
        "build", help="on an emulated FPGA, build the pipeline and write its binary and "
                      "manifest; for a board, write the source, the manifest and the aoc / v++ "
                      "command line",
        description="The binary, or a board's .aocx / .xclbin, and its manifest go into the "
                    "folder that HETSERVE_FPGA_BINARIES names; the daemon then loads it "
                    "instead of building from source, once its manifest matches.")
    _model_argument(build)
    build.add_argument("--out", required=True, metavar="DIR",
                       help="where the source, the binary and its manifest are written")
    build.add_argument("--device", default="opencl:fpga0", type=_fpga_id,
                       help="the FPGA to build for, by its id in `hetserve devices` "
                            "(default: opencl:fpga0; fpga0 alone is read the same)")
    _board_argument(build, "default: $HETSERVE_FPGA_BOARD, else `emulator` on the emulator")
    build.add_argument("--precision", choices=["fp32", "fp16"],
                       help="default: the model's `precision` parameter, else fp32 (an int8 "
                            "QDQ model builds the int8 pipeline whatever this says)")
    build.add_argument("--force", action="store_true",
                       help="run as root, write into --out even where another user owns it "
                            "(refused otherwise; docs/security.md)")
    plan = sub.add_parser(
        "plan", help="estimate a model on a board: per layer clocks, DDR bytes and bound; DSPs, "
                     "RAM blocks, img/s, GOP/s and GOP/s per W (a model, not a measurement)")
    _model_argument(plan)
    _board_argument(plan, "required", required=True)
    plan.add_argument("--precision", choices=PLAN_PRECISIONS, default="int8",
                      help="the datapath priced (default: int8)")
    plan.add_argument("--batch", type=int, default=1, help="samples a run (default: 1)")
    plan.add_argument("--activation-bytes", type=int, choices=[1, 2, 4],
                      help="bytes a value of a tensor between layers takes in DDR, where not "
                           "hetserve's own (4 for int8 and fp32, 2 for fp16); PipeCNN's is 1")
    plan.add_argument("--search", action="store_true",
                      help="try every VEC x LANE that fits the board and plan the fastest")


def _model_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL",
                        help="a model's folder in a repository (config.pbtxt and its versions; "
                             "the newest is used), or an .onnx file")


def _board_argument(parser: argparse.ArgumentParser, default: str,
                    required: bool = False) -> None:
    parser.add_argument("--board", required=required, metavar="NAME",
                        help=f"a board profile, one of {', '.join(names())}, or a .toml file "
                             f"({default})")


def run(args: argparse.Namespace) -> int:
    try:
        model, fp16 = _model(Path(args.model))
        if args.fpga_command == "plan":
            return _plan(args, model)
        return _build(args, model, args.precision or ("fp16" if fp16 else "fp32"))
    except Exception as e:  # a model, board or device that cannot be used is the answer
        print(f"hetserve fpga {args.fpga_command}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2


def _model(path: Path) -> tuple[Path, bool]:
    """The .onnx file, and whether its config asks for fp16."""
    from service.core.engine_settings import parse_engine_options
    from service.core.repository import ModelRepository

    if not path.is_dir():
        return path, False
    entry = ModelRepository(path.parent).load(path.name)
    return entry.versions[max(entry.versions)], parse_engine_options(entry.config).fp16


def _fpga_id(text: str) -> str:
    """opencl:fpga0 (as configs and `hetserve devices` name it) or fpga0 -> fpga0."""
    return text.removeprefix("opencl:")


def _build(args: argparse.Namespace, model: Path, precision: str) -> int:
    from accelerators.opencl.fpga.build import build

    result = build(model, Path(args.out), args.device, args.board, precision, args.force)
    print(f"board profile: {result.board.name} ({result.board.description})")
    print(f"kernels: {', '.join(sorted(result.kernels))} ({result.options})")
    print(f"kernel source: {result.source}")
    print(f"manifest: {result.manifest}")
    if not result.commands:
        print(f"built for the emulated {args.device}: {result.binary}")
        print(f"serve it with HETSERVE_FPGA_BINARIES={result.binary.parent}")
    else:
        print(f"{args.device} is not an emulated board here: compile the source with the "
              f"board's kit into {result.binary.name}, beside its manifest, then point "
              "HETSERVE_FPGA_BINARIES at that folder:")
        print("\n".join(f"  {line}" for line in result.commands))
    return 0


def _plan(args: argparse.Namespace, model: Path) -> int:
    from accelerators.opencl.fpga import board as boards
    from accelerators.opencl.fpga.estimate import plan, search

    if args.batch < 1:
        print(f"hetserve fpga plan: --batch {args.batch}: expected 1 or more", file=sys.stderr)
        return 2
    board = boards.load(args.board)
    if args.search:
        found = search(model, board, args.precision, args.batch, args.activation_bytes)
        if not found:
            print(f"hetserve fpga plan: no VEC x LANE fits {board.name}", file=sys.stderr)
            return 2
        e = found[0]
    else:
        e = plan(model, board, args.precision, args.batch, args.activation_bytes)
    print(f"ESTIMATE (a model of the board, not a measurement): {model} on {board.name} "
          f"({board.description}), {args.precision}, batch {args.batch}, VEC {e.board.vec} x "
          f"LANE {e.board.lane} at {board.fmax_mhz:g} MHz")
    print(f"{'LAYER':<32} {'CLOCKS':>12} {'DDR MB':>9} {'MS':>9}  BOUND")
    for p in e.passes:
        print(f"{p.node[:32]:<32} {p.clocks:>12,} {p.ddr_bytes / 1e6:>9.2f} "
              f"{p.seconds * 1e3:>9.3f}  {p.bound}")
    print(f"DSPs {e.dsps} of {board.dsp_blocks}; RAM blocks {e.ram_blocks} of "
          f"{board.ram_blocks}" + (f"; DOES NOT FIT: {e.misfit}" if e.misfit else ""))
    print(f"{e.seconds * 1e3:.2f} ms a batch ({e.seconds / e.batch * 1e3:.2f} ms an image), "
          f"{e.images_per_s:,.1f} img/s, {e.gops:,.1f} GOP/s, "
          f"{e.gops_per_w:,.2f} GOP/s per W at the profile's typical {board.power_w:g} W")
    if e.on_host:
        print(f"on the host, not timed: {len(e.on_host)} nodes "
              f"({', '.join(sorted(set(e.on_host.values())))})")
    print("not known to the model: the clock after place and route, routing congestion, DDR "
          "refresh and bank conflicts, the host's share")
    return 0
