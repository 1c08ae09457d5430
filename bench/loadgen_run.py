"""Runs LoadGen's scenarios (SingleStream, MultiStream, Server, Offline) against a daemon and
keeps LoadGen's logs, one folder per scenario, with the parsed summary beside them.

Durations and query counts are far below MLPerf's submission rules (600 s, 24,576 queries):
they are set from the command line, and LoadGen judges each run VALID or INVALID against
them and against its early-stopping criteria as it would any other."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import mlperf_loadgen as lg
import numpy as np

from accelerators import safe_files
from bench.loadgen_summary import accuracy, parse_summary
from bench.loadgen_sut import DaemonSUT, SampleLibrary

SCENARIOS = ("SingleStream", "MultiStream", "Server", "Offline")
# The fewest queries with which LoadGen's early stopping can accept a run (its own messages).
MIN_QUERIES = {"SingleStream": 64, "MultiStream": 662, "Server": 100, "Offline": 1}


@dataclass
class ScenarioSettings:
    seconds: float = 10.0  # LoadGen's min_duration
    min_queries: int = 0  # 0: MIN_QUERIES of the scenario
    server_qps: float = 200.0
    server_latency_ms: float = 15.0  # at the 99th percentile (MLPerf's ResNet-50 bound)
    offline_qps: float = 0.0  # expected; 0: calibrated by a one-second Offline run first
    multistream_samples: int = 8
    expected_latency_ms: float = 5.0  # SingleStream / MultiStream: LoadGen's first guess
    max_batch: int = 128  # samples per request
    inflight: int = 0  # requests in flight; 0: 4 for Offline, 512 for the others


def test_settings(scenario: str, s: ScenarioSettings, accuracy_mode: bool) -> lg.TestSettings:
    t = lg.TestSettings()
    t.scenario = getattr(lg.TestScenario, scenario)
    t.mode = lg.TestMode.AccuracyOnly if accuracy_mode else lg.TestMode.PerformanceOnly
    t.min_duration_ms = int(s.seconds * 1000)
    t.min_query_count = s.min_queries or MIN_QUERIES[scenario]
    t.single_stream_expected_latency_ns = int(s.expected_latency_ms * 1e6)
    t.multi_stream_expected_latency_ns = int(s.expected_latency_ms * 1e6)
    t.multi_stream_samples_per_query = s.multistream_samples
    t.server_target_qps = s.server_qps
    t.server_target_latency_ns = int(s.server_latency_ms * 1e6)
    t.server_target_latency_percentile = 0.99
    t.offline_expected_qps = s.offline_qps
    return t


def run_scenario(address: str, model: str, library: SampleLibrary, scenario: str,
                 settings: ScenarioSettings, out: Path, accuracy_mode: bool = False,
                 progress: Callable[[int], None] | None = None) -> dict:
    """One LoadGen test; its logs and summary.json go to `out`. `progress(n)` is called as
    n more samples complete (for a progress display).

    Offline without an expected rate first probes one with a few requests' worth of samples
    (logs under out/calibration); where the run then still ends before its minimum duration,
    it is run once more at the rate it reached, as LoadGen's own recommendation says."""
    if scenario not in SCENARIOS:
        raise ValueError(f"scenario {scenario!r} is unknown; expected one of {SCENARIOS}")
    if scenario != "Offline" or settings.offline_qps or accuracy_mode:
        return _run(address, model, library, scenario, settings, out, accuracy_mode, progress)
    probe = _run(address, model, library, scenario, replace(
        settings, seconds=1.0, offline_qps=4 * settings.max_batch / 1.1), out / "calibration")
    run = _run(address, model, library, scenario,
               replace(settings, offline_qps=1.1 * probe["result"]), out, False, progress)
    if run["constraints"].get("Min duration satisfied", "").upper() == "NO":
        run = _run(address, model, library, scenario,
                   replace(settings, offline_qps=1.25 * run["result"]), out, False, progress)
    return run


def _run(address: str, model: str, library: SampleLibrary, scenario: str,
         settings: ScenarioSettings, out: Path, accuracy_mode: bool = False,
         progress: Callable[[int], None] | None = None) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    log_settings = lg.LogSettings()
    log_settings.log_output.outdir = str(out)
    log_settings.log_output.copy_summary_to_stdout = False
    log_settings.enable_trace = False  # megabytes per second of run; the summary suffices
    inflight = settings.inflight or (4 if scenario == "Offline" else 512)
    with library as qsl, DaemonSUT(address, model, library, settings.max_batch,
                                   inflight) as sut:
        sut.on_complete = progress
        lg.StartTestWithLogSettings(sut.handle, qsl.handle,
                                    test_settings(scenario, settings, accuracy_mode),
                                    log_settings)
    summary = parse_summary(out / "mlperf_log_summary.txt")
    summary.update(scenario=scenario, mode="AccuracyOnly" if accuracy_mode else summary["mode"],
                   model=model, library=library.name, log_dir=str(out), errors=sut.errors,
                   samples=sut.completed,
                   sut_latency_ms=np.sort(np.array(sut.latencies_s) * 1e3).tolist())
    if scenario == "Server":
        summary["target_qps"] = settings.server_qps
        summary["target_latency_ms"] = settings.server_latency_ms
    if scenario == "Offline":
        summary["expected_qps"] = settings.offline_qps
    if accuracy_mode and library.labels is not None:
        summary["accuracy"], summary["accuracy_samples"] = accuracy(
            out / "mlperf_log_accuracy.json", library.labels)
    safe_files.write_file(out / "summary.json", json.dumps(
        {k: v for k, v in summary.items() if k != "sut_latency_ms"}, indent=2), flag=None)
    return summary
