"""Seconds the OpenCL engine takes to load a model (graph import and folding, lowering, program
from the cache, batch-1 plan and weight uploads) and to plan its CPU batch sizes, against
onnxruntime's CPU session creation for the same file, measured in the same run.

    .venv/bin/python -m bench.opencl_load [--device cpu0] [--architectures resnet50,densenet121]
        [--repeat 3]

The example MNIST model and classifiers of tools/cnn_architectures.py (random weights). Each
engine loads once first, so that its kernels are compiled and cached (the program cache) and
every timed load is a daemon's restart; times are medians. Prints a Markdown table for
docs/benchmarks/opencl.md."""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import onnx
import onnxruntime as ort

from accelerators.opencl.engine import OpenCLEngine
from tools import cnn_architectures

ROOT = Path(__file__).resolve().parent.parent
BATCHES = (2, 4, 8, 16)  # the warm-up's other bucket sizes (a CPU plans up to a slice)


def median_s(work: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def architecture_files(names: str, folder: str) -> Iterator[tuple[str, Path]]:
    """Each of tools.cnn_architectures' `names` (comma-separated), saved as ONNX in `folder`."""
    for name in names.split(","):
        path = Path(folder) / f"{name}.onnx"
        onnx.save(cnn_architectures.ARCHITECTURES[name](), str(path))
        yield name, path


def row(name: str, path: Path, device: str, repeat: int) -> str:
    OpenCLEngine(path, device)  # kernels compiled once, as the program cache keeps them

    def plans() -> None:
        engine = OpenCLEngine(path, device)
        for batch in BATCHES:
            engine.prepare(batch)
    load = median_s(lambda: OpenCLEngine(path, device), repeat)
    planned = median_s(plans, repeat)
    session = median_s(lambda: ort.InferenceSession(
        str(path), providers=["CPUExecutionProvider"]), repeat)
    return (f"| {name} | {load:.2f} | {planned:.2f} | {session:.2f} | {load / session:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu0")
    parser.add_argument("--architectures", default="resnet50,densenet121,googlenet")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"| model | OpenCL load s | load + plans {list(BATCHES)} s | onnxruntime session s "
          f"| load / session |\n|---|---|---|---|---|")
    print(row("mnist_cnn", ROOT / "models" / "mnist_cnn" / "1" / "model.onnx", args.device,
              args.repeat), flush=True)
    with tempfile.TemporaryDirectory() as folder:
        for name, path in architecture_files(args.architectures, folder):
            print(row(name, path, args.device, args.repeat), flush=True)


if __name__ == "__main__":
    main()
