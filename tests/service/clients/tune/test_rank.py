"""Objectives: the point of a candidate that counts, the ranking, and the front in the figure."""

from __future__ import annotations

from service.clients.figures import pareto
from service.clients.tune import rank, report
from service.clients.tune.measure import LoadPoint, Measurement
from service.clients.tune.space import Candidate


def _point(concurrency: int, rps: float, p99_ms: float, watts: float | None = 20.0,
           errors: dict | None = None) -> LoadPoint:
    return LoadPoint(concurrency, rps, p99_ms / 2, p99_ms, errors or {}, watts,
                     {"cpu0": "model"}, 24e6)


def _measurement(instances: int, *points: LoadPoint) -> Measurement:
    return Measurement(Candidate("onnxruntime:cpu0", instances, 500, ()), "instances",
                       list(points))


def test_each_objective_takes_its_best_point_within_the_bound_and_without_errors() -> None:
    m = _measurement(1, _point(1, 500, 2), _point(8, 1500, 20), _point(32, 1800, 80),
                     _point(64, 2500, 30, errors={"UNAVAILABLE": 1}))
    assert rank.best_point(m, "throughput", None).concurrency == 32
    assert rank.best_point(m, "throughput", 50).concurrency == 8
    assert rank.best_point(m, "latency", None).concurrency == 1
    assert rank.best_point(m, "energy", 50).concurrency == 8  # 20 W / 1500 req/s
    assert rank.best_point(m, "throughput", 1) is None


def test_energy_is_joules_per_image_and_gflops_per_watt_from_the_points_own_rate() -> None:
    point = _point(8, 1000, 10, watts=25.0)
    assert point.joules_per_image == 0.025
    assert point.gflops_per_watt == 1000 * 24e6 / 1e9 / 25.0
    assert _point(8, 1000, 10, watts=None).joules_per_image is None


def test_ranking_puts_candidates_without_a_qualifying_point_last_in_measured_order() -> None:
    slow, fast = _measurement(1, _point(8, 900, 10)), _measurement(2, _point(8, 1200, 10))
    late, failed = _measurement(3, _point(8, 5000, 90)), _measurement(4)
    order = [m for m, _ in rank.ranked([slow, late, fast, failed], "throughput", 50)]
    assert order == [fast, slow, late, failed]
    assert [m for m, _ in rank.ranked([slow, fast], "latency", None)][0] is slow  # a tie: first


def test_the_front_keeps_the_points_nothing_beats_on_both_axes() -> None:
    points = [(100, 1.0), (200, 0.5), (150, 0.4), (50, 1.2), (200, 0.3)]
    assert pareto(points, key=lambda p: (p[1], p[0])) == [(50, 1.2), (100, 1.0), (200, 0.5)]


def test_the_comparison_says_so_where_the_shipped_config_had_no_qualifying_point() -> None:
    written = _point(4, 800.0, 20.0)
    against = report.comparison_text(report.Comparison(written, _point(4, 400.0, 25.0), "x"),
                                     "throughput")
    assert against == "800.0 req/s against the shipped config's 400.0: 2.00x (x)"
    alone = report.comparison_text(report.Comparison(written, None, "in the sweep"),
                                   "throughput")
    assert alone.startswith("800.0 req/s, where the shipped config had no qualifying point")
    assert "-" not in alone.split("(")[0]
