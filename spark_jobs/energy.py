"""What a Spark job's scoring cost. Each reply's energy, power source and FLOPs (spark_jobs.cost)
are tallied per task by (device, power source) and summed across executors in a Spark
accumulator; at the end the job reports rows, joules, joules per row and GFLOP/s per watt, by
device and by power source, and writes them into its output (ENERGY_FILE).

An accumulator counts a task's additions once when the scoring runs in the stage that writes
the output, as in score.py and stream.py: a failed or speculative task attempt's additions are
dropped (the energy a failed attempt spent on the daemon is not in the figures, nor are its
rows in the output). A frame scored by a stage that runs again (a shuffle stage recomputed, an
uncached frame written twice) adds its energy again; the per-row column (ScoreOptions.
energy_column) then holds the energy of the rows actually written."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable

from pyspark import Accumulator
from pyspark.accumulators import AccumulatorParam
from pyspark.sql import DataFrame, SparkSession

from service import contract
from spark_jobs import output
from spark_jobs.cost import Cost

ENERGY_FILE = "_hetserve_energy.json"  # inside the output folder: Spark and pyarrow skip `_*`
ESTIMATE = "model"  # the power source that is an estimate, not a sensor
ESTIMATE_NOTE = ("figures from power source `model` are estimates (the configured busy watts "
                 "times the batches' run time), not measurements")
EMULATED_NOTE = ("an FPGA emulator ran these rows on the host's CPU: their speed and energy "
                 "are not an FPGA's")
COUNTING = ("summed by a Spark accumulator: a failed or speculative task attempt's share is "
            "dropped; a scoring stage that runs again would add its share again")

# (device, power source) -> (rows, joules, FLOPs); "" where a reply did not say.
Tally = dict[tuple[str, str], tuple[int, float, float]]


class TallyParam(AccumulatorParam):
    """Sums tallies key by key: what the job's energy accumulator adds."""

    def zero(self, value: Tally) -> Tally:
        return {}

    def addInPlace(self, value1: Tally, value2: Tally) -> Tally:
        for key, figures in value2.items():
            rows, joules, flops = value1.get(key, (0, 0.0, 0.0))
            value1[key] = (rows + figures[0], joules + figures[1], flops + figures[2])
        return value1


def meter(spark: SparkSession) -> Accumulator:
    """An energy accumulator for ScoreOptions.energy (score_dataframe(..., energy=...)); its
    value is a Tally of what the scoring tasks have run."""
    return spark.sparkContext.accumulator({}, TallyParam())


def tally(costs: Iterable[Cost]) -> Tally:
    total: Tally = {}
    for c in costs:
        TallyParam().addInPlace(total, {(c.device or "", c.source or ""): (
            c.rows, c.joules or 0.0, float(c.flops or 0))})
    return total


def _figures(rows: int, joules: float, flops: float, estimate: bool) -> dict:
    return {"rows": rows, "joules": joules, "joules_per_row": joules / rows if rows else None,
            "flops": flops, "gflops_per_watt": flops / joules / 1e9 if joules else None,
            "estimate": estimate}


def _grouped(value: Tally, name: Callable[[tuple[str, str]], str]) -> dict[str, dict]:
    """Figures per name(key); a group's `estimate` says whether any of it is one."""
    groups: dict[str, tuple[int, float, float, bool]] = {}
    for key, figures in sorted(value.items()):
        had = groups.get(name(key), (0, 0.0, 0.0, False))
        groups[name(key)] = (had[0] + figures[0], had[1] + figures[1], had[2] + figures[2],
                             had[3] or key[1] == ESTIMATE)
    return {group: _figures(*sums) for group, sums in groups.items()}


def summarize(value: Tally) -> dict:
    """The job's figures over the rows whose replies carried energy, in all, by device and by
    power source; `estimate` marks figures that include the `model` source's estimates."""
    metered = {key: figures for key, figures in value.items() if key[1]}
    total = _grouped(metered, lambda key: "").get("", _figures(0, 0.0, 0.0, False))
    return {**total, "estimate_note": ESTIMATE_NOTE if total["estimate"] else None,
            "by_device": _grouped(metered, lambda key: key[0]),
            "by_source": _grouped(metered, lambda key: key[1]),
            "unmetered_rows": sum(rows for key, (rows, _, _) in value.items() if not key[1]),
            "counting": COUNTING}


def _line(name: str, figures: dict) -> str:
    def shown(value: float | None) -> str:
        return "-" if value is None else f"{value:.4g}"

    per_row = figures["joules_per_row"]
    return (f"{name}: {figures['rows']:,} rows, {shown(figures['joules'])} J, "
            f"{shown(None if per_row is None else 1e3 * per_row)} mJ per row, "
            f"{shown(figures['gflops_per_watt'])} GFLOP/s per W"
            + (" (estimate)" if figures["estimate"] else ""))


def describe(summary: dict) -> list[str]:
    """The summary as the job prints it: the whole, then each device and power source."""
    unmetered = summary["unmetered_rows"]
    if not summary["rows"]:
        return [f"energy: none in the replies to the job's {unmetered:,} rows" if unmetered
                else "energy: no rows scored"]
    lines = [_line("energy", summary)]
    lines += [_line(f"  device {device}", f) for device, f in summary["by_device"].items()]
    lines += [_line(f"  source {source}", f) for source, f in summary["by_source"].items()]
    if unmetered:
        lines.append(f"  and {unmetered:,} rows whose replies carried no energy")
    if summary["estimate"]:
        lines.append(f"  (estimate): {ESTIMATE_NOTE}")
    if any(device.endswith(contract.EMULATED) for device in summary["by_device"]):
        lines.append(f"  {contract.EMULATED}: {EMULATED_NOTE}")
    return lines


def write_parquet(spark: SparkSession, frame: DataFrame, path: str,
                  energy: Accumulator | None) -> dict | None:
    """output.write_parquet; with `energy`, its summary once the frame is written (its scoring
    done) goes into ENERGY_FILE inside the output, which it appears with, and is returned."""
    if energy is None:
        output.write_parquet(spark, frame, path)
        return None
    summary: dict = {}

    def beside() -> dict[str, str]:
        summary.update(summarize(energy.value))
        return {ENERGY_FILE: json.dumps(summary, indent=2) + "\n"}

    output.write_parquet(spark, frame, path, beside)
    return summary
