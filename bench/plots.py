"""The report's figures as PNG files (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
from matplotlib.ticker import FuncFormatter

from bench.models import TITLES
from service.clients.figures import pareto, plt
from service.clients.figures import save as _save

_PLAIN = FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 10 else f"{v:.2g}")


def _grid(count: int, width: float = 4.2, height: float = 3.4):
    cols = min(count, 2)
    rows = -(-count // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    for ax in axes.flat[count:]:
        ax.set_visible(False)
    return fig, list(axes.flat)


def throughput(points: list[dict], path: Path) -> Path:
    """Images/s against batch size, one panel per model, one line per device, engine and path."""
    models = list(dict.fromkeys(p["model"] for p in points))
    colors = _colors(points)
    fig, axes = _grid(len(models))
    for ax, model in zip(axes, models):
        rows = [p for p in points if p["model"] == model and p["images_per_s"]]
        for target in dict.fromkeys(_target(p) for p in rows):
            line = sorted((p["batch"], p["images_per_s"]) for p in rows if _target(p) == target)
            device, route = target.rsplit(" ", 1)
            ax.plot(*zip(*line), marker="o", label=target, color=colors[device],
                    linestyle="--" if route == "daemon" else "-")
        ax.set(title=TITLES.get(model, model), xlabel="batch size", ylabel="images/s",
               xscale="log", yscale="log")
        ax.set_xticks(sorted({p["batch"] for p in points}),
                      labels=map(str, sorted({p["batch"] for p in points})))
        ax.yaxis.set_major_formatter(_PLAIN)
        ax.yaxis.set_minor_formatter(_PLAIN)
        ax.tick_params(axis="y", which="minor", labelsize=7)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    return _save(fig, path)


def latency_cdf(runs: list[dict], path: Path) -> Path:
    """Per LoadGen run, the share of samples answered within each latency (as the SUT saw
    them: issue to completion of the sample's request)."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for run in runs:
        ms = np.asarray(run.get("sut_latency_ms") or [])
        if len(ms):
            ax.plot(np.sort(ms), np.arange(1, len(ms) + 1) / len(ms),
                    label=f"{run['scenario']}{' accuracy' * (run['mode'] == 'AccuracyOnly')} "
                          f"({TITLES.get(run['model'], run['model'])})")
    ax.set(xscale="log", xlabel="latency, ms (log)", ylabel="share of samples",
           title="Latency CDF per LoadGen run")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def efficiency(points: list[dict], path: Path) -> Path:
    """GFLOP/s per watt and joules per image per device, engine and path, at each model's
    best batch size there; the title says where the watts come from."""
    best: dict[tuple[str, str], dict] = {}
    for p in points:
        key = (p["model"], _target(p))
        if p["gflops_per_watt"] and (key not in best
                                     or p["gflops_per_watt"] > best[key]["gflops_per_watt"]):
            best[key] = p
    models = list(dict.fromkeys(m for m, _ in best))
    targets = list(dict.fromkeys(t for _, t in best))
    colors = _colors(points)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / max(1, len(targets))
    for ax, field, label in ((axes[0], "gflops_per_watt", "GFLOP/s per watt"),
                             (axes[1], "joules_per_image", "joules per image (log)")):
        for i, target in enumerate(targets):
            values = [best[(m, target)][field] if (m, target) in best else 0 for m in models]
            device, route = target.rsplit(" ", 1)
            ax.bar(np.arange(len(models)) + i * width, values, width, label=target,
                   color=colors[device], hatch="//" if route == "daemon" else None,
                   edgecolor="white")
        ax.set_xticks(np.arange(len(models)) + width * (len(targets) - 1) / 2,
                      labels=[TITLES.get(m, m) for m in models])
        ax.set(ylabel=label)
        if field == "joules_per_image":
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"At each model's best batch. {_watts_from(best.values())}", fontsize=10)
    return _save(fig, path)


def pareto_front(points: list[dict]) -> list[dict]:
    """The points that no other point beats on both images/s and GFLOP/s per watt, from the
    most efficient to the fastest."""
    return pareto(points, key=lambda p: (p["gflops_per_watt"], p["images_per_s"]))


def tradeoff(points: list[dict], path: Path) -> Path:
    """Images/s against GFLOP/s per watt, one panel per model, a point per device, engine, path
    and batch size (labelled with the batch), and each path's Pareto front (the trade there is
    to make) drawn through its points: solid in-process, dashed through the daemon."""
    measured = [p for p in points if p["images_per_s"] and p["gflops_per_watt"]]
    models = list(dict.fromkeys(p["model"] for p in measured))
    colors = _colors(points)
    fig, axes = _grid(len(models), width=4.8, height=3.8)
    for ax, model in zip(axes, models):
        rows = [p for p in measured if p["model"] == model]
        for target in dict.fromkeys(_target(p) for p in rows):
            mine = [p for p in rows if _target(p) == target]
            device, route = target.rsplit(" ", 1)
            ax.scatter([p["gflops_per_watt"] for p in mine], [p["images_per_s"] for p in mine],
                       color=colors[device], marker="s" if route == "daemon" else "o", s=22,
                       label=target, zorder=3)
            for p in mine:
                ax.annotate(str(p["batch"]), (p["gflops_per_watt"], p["images_per_s"]),
                            xytext=(3, 3), textcoords="offset points", fontsize=6)
        for route in dict.fromkeys(p["path"] for p in rows):
            front = pareto_front([p for p in rows if p["path"] == route])
            ax.plot([p["gflops_per_watt"] for p in front], [p["images_per_s"] for p in front],
                    color="black", linewidth=1, linestyle="--" if route == "daemon" else "-",
                    marker="o", markersize=9, markerfacecolor="none", zorder=2,
                    label=f"Pareto front, {route}")
        ax.set(title=TITLES.get(model, model), xlabel="GFLOP/s per watt", ylabel="images/s",
               yscale="log")
        ax.yaxis.set_major_formatter(_PLAIN)
        ax.yaxis.set_minor_formatter(_PLAIN)
        ax.tick_params(axis="y", which="minor", labelsize=7)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6)
    fig.suptitle(f"Throughput against efficiency, labelled by batch size. "
                 f"{_watts_from(measured)}", fontsize=9)
    return _save(fig, path)


def _watts_from(points: Iterable[dict]) -> str:
    """Where the figure's watts come from; the `model` estimate is never shown as measured."""
    named = [("`model` ESTIMATE (idle/busy watts x measured busy time), not a measurement"
              if s == "model" else s) for s in sorted({p["power_source"] for p in points})]
    return f"Watts: {'; '.join(named)}"


def _target(p: dict) -> str:
    return f"{p['engine']}:{p['device']} {p['path']}"


def _colors(points: list[dict]) -> dict[str, str]:
    """One colour per engine and device; the path (in-process, daemon) is the line style."""
    devices = dict.fromkeys(f"{p['engine']}:{p['device']}" for p in points)
    return {d: f"C{i % 10}" for i, d in enumerate(devices)}
