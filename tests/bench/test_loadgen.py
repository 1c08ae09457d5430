"""LoadGen's scenarios against a real daemon: the SUT answers every query, LoadGen's summary
is parsed, its logs are kept, and accuracy mode checks the predictions against the labels."""

from __future__ import annotations

import json
from pathlib import Path

from bench.loadgen_run import ScenarioSettings, run_scenario
from bench.loadgen_sut import SampleLibrary
from tests.support.daemon import MODEL, Daemon

SHORT = ScenarioSettings(seconds=1.0, server_qps=100.0, server_latency_ms=50.0)


def test_server_scenario_summary_is_parsed(daemon: Daemon, digits: SampleLibrary,
                                           tmp_path: Path) -> None:
    run = run_scenario(daemon.url, MODEL, digits, "Server", SHORT, tmp_path)
    assert run["scenario"] == "Server" and run["mode"] == "PerformanceOnly"
    assert isinstance(run["valid"], bool)
    assert run["result_field"] == "Completed samples per second"
    assert run["result_unit"] == "samples/s" and run["result"] > 0
    assert set(run["constraints"]) >= {"Min duration satisfied", "Min queries satisfied"}
    assert run["latency_ms"]["p50"] <= run["latency_ms"]["p99"] <= run["max_latency_ms"]
    assert run["errors"] == {}
    assert run["samples"] >= 100 and len(run["sut_latency_ms"]) == run["samples"]
    for log in ("mlperf_log_summary.txt", "mlperf_log_detail.txt", "summary.json"):
        assert (tmp_path / log).stat().st_size > 0
    assert json.loads((tmp_path / "summary.json").read_text())["result"] == run["result"]


def test_offline_accuracy_checks_predictions_against_labels(
        daemon: Daemon, digits: SampleLibrary, tmp_path: Path) -> None:
    run = run_scenario(daemon.url, MODEL, digits, "Offline", SHORT, tmp_path,
                       accuracy_mode=True)
    assert run["mode"] == "AccuracyOnly"
    assert run["accuracy_samples"] == len(digits.images) == run["samples"]
    assert run["accuracy"] > 0.95  # the example model scores 97.9% on these digits


def test_single_and_multi_stream_send_one_request_per_query(
        daemon: Daemon, digits: SampleLibrary, tmp_path: Path) -> None:
    settings = ScenarioSettings(seconds=0.5, min_queries=20, multistream_samples=4)
    single = run_scenario(daemon.url, MODEL, digits, "SingleStream", settings, tmp_path / "s")
    multi = run_scenario(daemon.url, MODEL, digits, "MultiStream", settings, tmp_path / "m")
    assert single["result_unit"] == multi["result_unit"] == "ns"
    assert single["result"] > 0 and multi["result"] > 0
    assert multi["fields"]["samples_per_query"] == "4"
    assert single["samples"] >= 20 and multi["samples"] >= 4 * 20


def test_failed_requests_complete_and_are_counted(daemon: Daemon, digits: SampleLibrary,
                                                  tmp_path: Path) -> None:
    settings = ScenarioSettings(seconds=0.2, min_queries=10)
    run = run_scenario(daemon.url, "no_such_model", digits, "SingleStream", settings, tmp_path)
    assert run["errors"] == {"StatusCode.NOT_FOUND": run["samples"]}
    assert run["samples"] >= 10


def test_offline_probes_its_expected_rate(daemon: Daemon, digits: SampleLibrary,
                                          tmp_path: Path) -> None:
    run = run_scenario(daemon.url, MODEL, digits, "Offline", SHORT, tmp_path)
    probe = json.loads((tmp_path / "calibration" / "summary.json").read_text())
    assert probe["scenario"] == "Offline" and probe["result"] > 0
    assert run["result_unit"] == "samples/s" and run["result"] > 0
    assert run["expected_qps"] > 0 and run["errors"] == {}
    assert run["samples"] >= run["expected_qps"] * SHORT.seconds  # LoadGen's query size
