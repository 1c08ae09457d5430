"""Figures as PNG files (matplotlib on its Agg backend: no display needed), for `hetserve tune`'s
report and the benchmarks' (bench/plots.py). matplotlib comes with the `tune` and `bench`
extras; importing this module without it raises ImportError."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import matplotlib

from accelerators import safe_files

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


def save(fig, path: Path, force: bool = False, flag: str | None = None) -> Path:
    """The figure as the PNG `path`, written as every file for a user is (safe_files; `flag`
    names the command's --force where it has one)."""
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=DPI)
    plt.close(fig)
    return safe_files.write_file(path, png.getvalue(), force, flag)
