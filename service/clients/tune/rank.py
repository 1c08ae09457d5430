"""Objectives: which load point of a candidate counts, and how candidates rank.

A load point qualifies when every request was answered and its p99 is within the bound (if one
is given). A candidate's figure is its best qualifying point: the most req/s (`throughput`), the
lowest p99 (`latency`) or the fewest joules per image (`energy`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # this module stays light: the command line reads OBJECTIVES from it
    from service.clients.tune.measure import LoadPoint, Measurement

OBJECTIVES = ("throughput", "latency", "energy")
UNITS = {"throughput": "req/s", "latency": "ms p99", "energy": "J per image"}


def figure(point: LoadPoint, objective: str) -> float | None:
    """The objective's figure at one point, in its own unit."""
    return {"throughput": point.rps, "latency": point.p99_ms,
            "energy": point.joules_per_image}[objective]


def better(a: float, b: float, objective: str) -> bool:
    return a > b if objective == "throughput" else a < b


def qualifies(point: LoadPoint, p99_ms: float | None) -> bool:
    return not point.errors and point.rps > 0 and (p99_ms is None or point.p99_ms <= p99_ms)


def best_point(measurement: Measurement, objective: str,
               p99_ms: float | None) -> LoadPoint | None:
    best, best_value = None, None
    for point in measurement.points:
        value = figure(point, objective)
        if qualifies(point, p99_ms) and value is not None and (
                best_value is None or better(value, best_value, objective)):
            best, best_value = point, value
    return best


def best_figure(point: LoadPoint, objective: str) -> float:
    """figure() of a point that best_point chose, which has one."""
    value = figure(point, objective)
    assert value is not None, "best_point chooses only points with a figure"
    return value


def ranked(measurements: list[Measurement], objective: str,
           p99_ms: float | None) -> list[tuple[Measurement, LoadPoint | None]]:
    """Best first; candidates without a qualifying point last, in the order measured."""
    scored = [(m, best_point(m, objective, p99_ms)) for m in measurements]
    good = [(m, p) for m, p in scored if p is not None]
    sign = -1 if objective == "throughput" else 1
    good.sort(key=lambda mp: sign * best_figure(mp[1], objective))
    return good + [(m, p) for m, p in scored if p is None]
