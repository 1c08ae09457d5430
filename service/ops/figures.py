"""Figures as PNG files (matplotlib on its Agg backend: no display needed), for `hetserve tune`'s
report and the benchmarks' (bench/plots.py). matplotlib comes with the `tune` and `bench`
extras; importing this module without it raises ImportError."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

DPI = 100
T = TypeVar("T")


def pareto(points: list[T], key: Callable[[T], tuple[float, float]]) -> list[T]:
    """The points that no other beats on both of key's coordinates (efficiency, speed), from the
    most efficient to the fastest; of equal points, one."""
    front: list[T] = []
    for point in sorted(points, key=lambda p: tuple(-v for v in key(p))):
        if not front or key(point)[1] > key(front[-1])[1]:
            front.append(point)
    return front


def save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path
