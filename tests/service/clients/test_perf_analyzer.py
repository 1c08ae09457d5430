"""Reading Triton perf_analyzer's report (the tool itself runs where it is installed)."""

from __future__ import annotations

from service.clients.perf_analyzer import parse_report


def test_perf_analyzer_report_is_read_in_milliseconds() -> None:
    # as perf_analyzer 2.41 writes it (-f) for a server without the statistics extension
    report = ("Concurrency,Inferences/Second,Client Send,Client Recv,p50 latency,p90 latency,"
              "p95 latency,p99 latency\n2,2099.58,3,1,918,1074,1257,2040\n")
    assert parse_report(report) == {"rps": 2099.58, "p50_ms": 0.918, "p99_ms": 2.04}
