"""Quantizes an fp32 ONNX CNN to int8 QDQ ONNX with onnxruntime's static quantization: int8
weights with one scale per output channel, activations calibrated (MinMax) on sample inputs.
The OpenCL engine runs the result with its int8 kernels (docs/opencl.md).

    .venv/bin/python -m tools.quantize_int8 models/mnist_cnn/1/model.onnx mnist_int8.onnx

calibrates the MNIST example on the first CALIBRATION held-out digits (tools/mnist_digits.py);
accuracy is then measured on the other hold-out digits."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

CALIBRATION = 200  # held-out digits used for calibration, never for measuring accuracy


class _Batches(CalibrationDataReader):
    def __init__(self, name: str, samples: np.ndarray, batch: int = 20) -> None:
        self._batches = iter([{name: samples[i:i + batch]} for i in range(0, len(samples), batch)])

    def get_next(self) -> dict | None:
        return next(self._batches, None)


def quantize(src: Path, dst: Path, input_name: str, samples: np.ndarray,
             activations: QuantType = QuantType.QUInt8, per_channel: bool = True) -> Path:
    """Writes `src` quantized to QDQ int8 at `dst`, calibrated on `samples`."""
    quantize_static(str(src), str(dst), _Batches(input_name, samples),
                    quant_format=QuantFormat.QDQ, per_channel=per_channel,
                    activation_type=activations, weight_type=QuantType.QInt8)
    return dst


def main() -> None:
    from tools import mnist_digits
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("src", type=Path)
    parser.add_argument("dst", type=Path)
    parser.add_argument("--int8-activations", action="store_true",
                        help="int8 instead of uint8 activations")
    args = parser.parse_args()
    images = mnist_digits.holdout_split()[0][:CALIBRATION]
    quantize(args.src, args.dst, "image", images,
             QuantType.QInt8 if args.int8_activations else QuantType.QUInt8)


if __name__ == "__main__":
    main()
