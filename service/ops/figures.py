"""Figures as PNG files (matplotlib on its Agg backend: no display needed), for `hetserve tune`'s
report and the benchmarks' (bench/plots.py). matplotlib comes with the `tune` and `bench`
extras; importing this module without it raises ImportError."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

DPI = 100


def save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path
