"""What a device's batches leave of the GIL to a daemon's other threads: a pure-Python loop counts
in a thread while the main thread runs batches on the engine, as a share of what it counts in the
same run while the main thread sleeps. An engine that holds the GIL while its device computes
starves the event loop and the other devices' instance threads (on 2 vCPUs the FPGA emulator did,
until the OpenCL executor waited for its stages with the GIL released).

    .venv/bin/python -m bench.gil_share [--device opencl:fpga0] [--batch 16] [--seconds 3]

The example MNIST model, on holdout digits."""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable

import numpy as np

from accelerators.engine_factory import DeviceSpec, create_engine
from bench import ROOT
from bench.models import MNIST
from tools import mnist_digits


def counted_per_s(main: Callable[[], object], seconds: float) -> tuple[float, int]:
    """A counting thread's rate while the main thread repeats `main`; and how often it ran."""
    stop, counts = threading.Event(), [0]

    def count() -> None:
        n = 0
        while not stop.is_set():
            n += 1
        counts[0] = n
    thread = threading.Thread(target=count)
    start = time.perf_counter()
    thread.start()
    runs = 0
    while time.perf_counter() - start < seconds:
        main()
        runs += 1
    stop.set()
    thread.join()
    return counts[0] / (time.perf_counter() - start), runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="opencl:fpga0", help="ENGINE:DEVICE")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    engine_name, _, device = args.device.partition(":")
    engine = create_engine(DeviceSpec(engine_name, device),
                           ROOT / "models" / MNIST / "1" / "model.onnx")
    inputs = {engine.inputs[0].name:
              np.ascontiguousarray(mnist_digits.holdout_split()[0][:args.batch])}
    engine.run(inputs, ["logits"])  # plans built before the clock starts
    idle, _ = counted_per_s(lambda: time.sleep(0.01), args.seconds)
    busy, runs = counted_per_s(lambda: engine.run(inputs, ["logits"]), args.seconds)
    print(f"{args.device}, batch {args.batch}: {runs} batches in {args.seconds:g} s; a Python "
          f"thread beside them counted {busy / idle:.3f} of its rate beside a sleeping main "
          f"thread ({busy:,.0f} against {idle:,.0f} per s)")


if __name__ == "__main__":
    main()
