"""The report's figure: every load point measured, req/s against GFLOP/s per watt, with the
front of points no other beats on both (up and to the right is better). Points that miss the
p99 bound or had errors are hollow and left out of the front: they are not a choice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from service.clients.figures import pareto, plt, save
from service.clients.watts import source_label


def draw(series: dict[str, list[tuple[float, float, bool]]], shipped: str, winner: str | None,
         sources: set[str], title: str, hollow: str, path: Path, force: bool = False) -> Path:
    """`series`: candidate label -> its (req/s, GFLOP/s per W, qualifies) points; `hollow`
    says why a point does not qualify."""
    fig, ax = plt.subplots(figsize=(8, 5))
    choices = [(x, y) for points in series.values() for x, y, ok in points if ok]
    for label, points in series.items():
        style: dict[str, Any]  # matplotlib's keyword arguments
        style = ({"marker": "*", "s": 160, "color": "C3", "label": f"written: {label}"}
                 if label == winner else
                 {"marker": "s", "s": 60, "color": "C0", "label": f"shipped: {label}"}
                 if label == shipped else {"marker": "o", "s": 20, "color": "0.6"})
        for ok in (True, False):
            mine = [(x, y) for x, y, q in points if q == ok]
            if mine:
                ax.scatter(*zip(*mine), zorder=3, **(style if ok else {
                    **style, "facecolors": "none", "edgecolors": style["color"],
                    "color": None, "label": None}))
    if choices:
        front = pareto(choices, key=lambda p: (p[1], p[0]))  # (GFLOP/s per W, req/s)
        ax.plot(*zip(*front), color="C2", linestyle="--", marker="o", markersize=13,
                markerfacecolor="none", label="front")  # circled: one point can be the front
    estimate = "model" in sources
    named = ", ".join(sorted(source_label(s) for s in sources)) or "none"
    ax.set(xlabel="req/s (batch-1 requests)", title=title,
           ylabel=f"GFLOP/s per watt ({'ESTIMATE' if estimate else 'measured'})")
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # none when every point missed the bound
        ax.legend(fontsize=8)
    fig.text(0.01, 0.01, f"Hollow: {hollow}. Power sources: {named}"
             + (" (idle/busy watts x measured busy time, not a measurement)" if estimate else ""),
             fontsize=7)
    return save(fig, path, force, "--force")
