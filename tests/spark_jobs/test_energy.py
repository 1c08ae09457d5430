"""A job's energy without Spark: what a reply's parameters say, tallies merged as Spark merges
accumulator updates, and the summary's figures, groups and estimate labels."""

from __future__ import annotations

import pytest
from tritonclient.grpc import service_pb2

from service import contract
from spark_jobs.cost import Cost
from spark_jobs.energy import ESTIMATE_NOTE, TallyParam, describe, summarize, tally


def test_a_reply_says_its_device_energy_source_and_flops_or_nothing() -> None:
    reply = service_pb2.ModelInferResponse()
    assert Cost.of(reply, 4) == Cost(4)  # another KServe server: nothing said
    reply.parameters[contract.DEVICE_PARAMETER].string_param = "fpga0"
    assert Cost.of(reply, 4) == Cost(4, "fpga0")  # a daemon sending no energy
    reply.parameters[contract.ENERGY_PARAMETER].double_param = 0.25
    reply.parameters[contract.POWER_SOURCE_PARAMETER].string_param = "xrt"
    reply.parameters[contract.FLOPS_PARAMETER].int64_param = 4_000
    assert Cost.of(reply, 4) == Cost(4, "fpga0", "xrt", 0.25, 4_000)


def test_tallies_merge_key_by_key_as_executors_updates_arrive() -> None:
    first = tally([Cost(128, "cpu0", "model", 1.0, 128_000), Cost(72, "cpu0", "model", 0.5,
                                                                   72_000)])
    second = tally([Cost(10, "gpu0", "nvml", 0.1, 10_000), Cost(5, "cpu0")])
    merged = TallyParam().addInPlace(TallyParam().addInPlace({}, first), second)
    assert merged == {("cpu0", "model"): (200, 1.5, 200_000.0),
                      ("gpu0", "nvml"): (10, 0.1, 10_000.0), ("cpu0", ""): (5, 0.0, 0.0)}


def test_the_summary_gives_figures_by_device_and_source_and_says_what_is_estimated() -> None:
    summary = summarize(tally([Cost(200, "cpu0", "model", 2.0, 4 * 10**9),
                               Cost(100, "gpu0", "nvml", 0.5, 2 * 10**9),
                               Cost(100, "gpu1", "nvml", 0.5, 2 * 10**9), Cost(7, "cpu0")]))
    assert (summary["rows"], summary["joules"], summary["unmetered_rows"]) == (400, 3.0, 7)
    assert summary["joules_per_row"] == pytest.approx(3.0 / 400)
    assert summary["gflops_per_watt"] == pytest.approx(8 / 3.0)  # FLOPs / joules / 1e9
    assert summary["estimate"] and summary["estimate_note"] == ESTIMATE_NOTE
    assert summary["by_device"]["cpu0"]["estimate"] and not summary["by_device"]["gpu0"][
        "estimate"]
    nvml = summary["by_source"]["nvml"]
    assert (nvml["rows"], nvml["joules"], nvml["gflops_per_watt"]) == (200, 1.0, 4.0)
    lines = describe(summary)
    assert lines[0] == "energy: 400 rows, 3 J, 7.5 mJ per row, 2.667 GFLOP/s per W (estimate)"
    assert "  device gpu1: 100 rows, 0.5 J, 5 mJ per row, 4 GFLOP/s per W" in lines
    assert "  source model: 200 rows, 2 J, 10 mJ per row, 2 GFLOP/s per W (estimate)" in lines
    assert "  and 7 rows whose replies carried no energy" in lines
    assert lines[-1] == f"  (estimate): {ESTIMATE_NOTE}"


def test_a_job_whose_replies_carried_no_energy_says_so() -> None:
    summary = summarize(tally([Cost(3, "cpu0"), Cost(2)]))
    assert summary["rows"] == 0 and summary["joules_per_row"] is None
    assert not summary["estimate"] and summary["estimate_note"] is None
    assert describe(summary) == ["energy: none in the replies to the job's 5 rows"]
    assert describe(summarize({})) == ["energy: no rows scored"]  # e.g. an empty micro-batch
