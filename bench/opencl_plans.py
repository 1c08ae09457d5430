"""What a model's launch plans cost on the OpenCL engine: launches per plan, seconds to build the
plans of the CPU batch sizes after load, and seconds per batch, against onnxruntime's CPU
session on the same batches, measured in the same run.

    .venv/bin/python -m bench.opencl_plans [--device cpu0] [--architectures densenet121]
        [--repeat 5]

Classifiers of tools/cnn_architectures.py (random weights). The engine loads once first, so
that its kernels come from the program cache; times are medians. Prints a Markdown table for
docs/benchmarks/opencl.md."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort

from accelerators.opencl.engine import OpenCLEngine
from bench.opencl_load import BATCHES, architecture_files, median_s


def row(name: str, path: Path, device: str, repeat: int) -> str:
    OpenCLEngine(path, device)  # kernels compiled once, as the program cache keeps them
    engines = [OpenCLEngine(path, device) for _ in range(repeat)]

    def plans() -> None:
        engine = engines.pop()  # a fresh one each time: the plans are built, not looked up
        for batch in BATCHES:
            engine.prepare(batch)
    plan_s = median_s(plans, repeat)
    engine = OpenCLEngine(path, device)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name_in = engine.inputs[0].name
    cells = [name, str(len(engine.plan(1).launches)), f"{plan_s:.2f}"]
    for batch in (1, 8):
        x = {name_in: np.random.default_rng(0).standard_normal(
            (batch, *engine.inputs[0].shape[1:])).astype(np.float32)}
        outputs = [engine.outputs[0].name]
        engine.run(x, outputs)  # this batch size's plan
        opencl = median_s(lambda: engine.run(x, outputs), repeat)
        reference = median_s(lambda: session.run(outputs, x), repeat)
        cells += [f"{opencl * 1e3:.0f}", f"{reference * 1e3:.0f}"]
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu0")
    parser.add_argument("--architectures", default="densenet121")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print("| model | launches per batch-1 plan | plans of batches 2-16 s | batch 1 ms | "
          "onnxruntime batch 1 ms | batch 8 ms | onnxruntime batch 8 ms |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for name, path in architecture_files(args.architectures, folder):
            print(row(name, path, args.device, args.repeat), flush=True)


if __name__ == "__main__":
    main()
