"""Images/s of the OpenCL engine against onnxruntime's CPU provider, measured in the same run,
and GFLOP/s of the engine's dominant kernels from their profiling events.

    .venv/bin/python -m bench.opencl_engine [--device cpu0[,fpga0]] [--resnet] [--int8] [--fp16]
        [--architectures mobilenet_v2,densenet121] [--architecture-batches 1,8]
        [--provider CUDAExecutionProvider] [--seconds 2]

MNIST CNN at batch 1, 8, 64; with --int8 also the MNIST CNN quantized to int8 QDQ
(tools/quantize_int8.py) on the engine's int8 kernels against onnxruntime's own int8 kernels;
with --fp16 also the MNIST CNN in the engine's fp16 precision (half storage) against
onnxruntime's FP32;
with --resnet or --architectures classifiers of tools/cnn_architectures.py and ViT-B/16 of
tools/vit_architecture.py (random weights) at batch 1 and 8. On a GPU node: --device gpu0
--provider CUDAExecutionProvider. Several devices (`--device cpu0,fpga0`) are each measured
against the same onnxruntime figure, in one run; an emulated FPGA's row says so (its speed is
not a board's). Prints a Markdown table for docs/BENCHMARKS.md."""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from accelerators.opencl.engine import OpenCLEngine
from service import contract
from tools import cnn_architectures, mnist_digits, quantize_int8, vit_architecture

ROOT = Path(__file__).resolve().parent.parent

ARCHITECTURES = cnn_architectures.ARCHITECTURES | {"vit_b_16": vit_architecture.vit}


def images_per_s(run: Callable[[], object], batch: int, seconds: float) -> float:
    """Median over five slices of `seconds` / 5 each, after a warm-up run."""
    run()
    rates = []
    for _ in range(5):
        n, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds / 5 or n == 0:
            run()
            n += 1
        rates.append(n * batch / elapsed)
    return statistics.median(rates)


def compare(name: str, path: Path, input_name: str, shape: tuple[int, ...], batches: list[int],
            devices: list[str], seconds: float, provider: str = "CPUExecutionProvider",
            precision: str = "fp32") -> list[str]:
    engines = [OpenCLEngine(path, device, precision=precision) for device in devices]
    session = ort.InferenceSession(str(path), providers=[provider])
    if session.get_providers()[0] != provider:  # onnxruntime-gpu falls back silently
        raise SystemExit(f"onnxruntime has no {provider} here: {session.get_providers()}")
    rows = []
    for batch in batches:
        x = np.random.default_rng(0).random((batch, *shape), np.float32)
        theirs = images_per_s(lambda: session.run(None, {input_name: x}), batch, seconds)
        for engine in engines:
            output = engine.outputs[0].name
            ours = images_per_s(lambda: engine.run({input_name: x}, [output]), batch, seconds)
            engine.run({input_name: x}, [output])  # then profile the plan that ran last
            launches = sorted(engine.plan(engine.step(batch)).profile(), key=lambda t: -t.seconds)
            total = sum(t.seconds for t in launches)
            top = "; ".join(f"{t.kernel} ({t.node}) {t.seconds * 1e3:.2f} ms"
                            + (f" = {t.flops / t.seconds / 1e9:.0f} GFLOP/s" if t.flops else "")
                            for t in launches[:3])
            device = contract.reply_device(engine.device.engine, engine.device.name,
                                            engine.device.emulated)
            rows.append(f"| {name} | {device} | {batch} | {ours:,.0f} | "
                        f"{theirs:,.0f} | {ours / theirs:.3f} | {total * 1e3:.1f} ms: {top} |")
            print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu0",
                        help="OpenCL devices, comma-separated, e.g. cpu0 or cpu0,fpga0")
    parser.add_argument("--resnet", action="store_true", help="also ResNet-50 at batch 1, 8")
    parser.add_argument("--int8", action="store_true", help="also the int8 MNIST CNN")
    parser.add_argument("--fp16", action="store_true", help="also the MNIST CNN in fp16")
    parser.add_argument("--architectures", default="",
                        help=f"comma-separated, of {', '.join(ARCHITECTURES)}")
    parser.add_argument("--architecture-batches", default="1,8",
                        help="batch sizes for the architectures")
    parser.add_argument("--provider", default="CPUExecutionProvider",
                        help="onnxruntime's provider for the reference")
    parser.add_argument("--seconds", type=float, default=2.0, help="time per measurement")
    args = parser.parse_args()
    arch_batches = [int(b) for b in args.architecture_batches.split(",")]
    names = [n for n in args.architectures.split(",") if n] + ["resnet50"] * args.resnet
    devices = args.device.split(",")
    print("| model | OpenCL device | batch | OpenCL img/s | onnxruntime img/s | ratio | OpenCL "
          "device time per batch (on CPUs per slice, 12 samples on AVX2): top launches |\n"
          "|---|---|---|---|---|---|---|")
    mnist = ROOT / "models" / "mnist_cnn" / "1" / "model.onnx"
    compare("MNIST CNN", mnist, "image", (1, 28, 28), [1, 8, 64], devices, args.seconds,
            args.provider)
    if args.fp16:
        compare("MNIST CNN fp16", mnist, "image", (1, 28, 28), [1, 8, 64], devices,
                args.seconds, args.provider, "fp16")
    with tempfile.TemporaryDirectory() as tmp:
        if args.int8:
            calibration = mnist_digits.holdout_split()[0][:quantize_int8.CALIBRATION]
            path = quantize_int8.quantize(mnist, Path(tmp) / "mnist_int8.onnx", "image",
                                          calibration)
            compare("MNIST CNN int8", path, "image", (1, 28, 28), [1, 8, 64], devices,
                    args.seconds, args.provider)
        for name in names:
            path = Path(tmp) / f"{name}.onnx"
            onnx.save(ARCHITECTURES[name](), str(path))
            compare(name, path, "image", (3, 224, 224), arch_batches, devices,
                    args.seconds, args.provider)


if __name__ == "__main__":
    main()
