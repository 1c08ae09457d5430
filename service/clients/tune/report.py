"""What a sweep tells its user: the ranked table (terminal and Markdown), the comparison of the
written config with the shipped one, and the comment header of the written config."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from service.clients.tune import rank
from service.clients.tune.measure import LoadPoint, Measurement
from service.clients.tune.sweep import SweepResult
from service.clients.watts import source_label

COLUMNS = ("#", "candidate", "stage", "conc.", "req/s", "p50 ms", "p99 ms", "watts (source)",
           "GFLOP/s per W", "J per image", "note")


@dataclass(frozen=True)
class RunInfo:
    model: str
    model_dir: Path
    objective: str
    p99_ms: float | None
    budget_s: float
    command: str
    started: str  # UTC, ISO 8601 to the minute
    host: str
    client: str  # which load client measured
    candidate_devices: list[str]
    concurrencies: tuple[int, ...]
    seconds: float


@dataclass(frozen=True)
class Comparison:
    """The written config against the shipped one, measured in the same run."""
    written: LoadPoint
    shipped: LoadPoint | None
    how: str  # which measurements are compared

    def ratio(self, objective: str) -> float | None:
        theirs = self.shipped and rank.figure(self.shipped, objective)
        ours = rank.figure(self.written, objective)
        return ours / theirs if theirs and ours is not None else None


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:,.{digits}f}"


def sources_text(sources: dict[str, str]) -> str:
    return ", ".join(f"{device}: {source_label(s)}" for device, s in sorted(sources.items()))


def watts_text(point: LoadPoint) -> str:
    return "-" if point.watts is None else f"{point.watts:.1f} W ({sources_text(point.sources)})"


def _note(measurement: Measurement, point: LoadPoint | None, p99_ms: float | None) -> str:
    if measurement.error:
        return f"failed: {measurement.error}"
    if point is None and measurement.points:
        worst = min(measurement.points, key=lambda p: p.p99_ms)
        return (f"no point within p99 {p99_ms:g} ms (lowest {worst.p99_ms:.1f} ms)"
                if p99_ms and not worst.errors else
                f"errors: {worst.errors}" if worst.errors else "no answers")
    return ""


def rows(result: SweepResult, objective: str, p99_ms: float | None) -> list[list[str]]:
    """The ranked table's cells, best candidate first."""
    out = []
    for i, (m, point) in enumerate(rank.ranked(result.measurements, objective, p99_ms), 1):
        label = m.candidate.label() + (" (shipped)" if m is result.shipped else "")
        figures = ([str(point.concurrency), _num(point.rps, 0), _num(point.p50_ms, 2),
                    _num(point.p99_ms, 2), watts_text(point), _num(point.gflops_per_watt, 3),
                    _num(point.joules_per_image, 4)] if point else ["-"] * 7)
        out.append([str(i) if point else "-", label, m.stage, *figures,
                    _note(m, point, p99_ms)])
    return out


def print_table(result: SweepResult, info: RunInfo, console: Console) -> None:
    table = Table(title=f"{info.model}: candidates by {info.objective}"
                        + (f", p99 ≤ {info.p99_ms:g} ms" if info.p99_ms else "")
                        + " (each at its best concurrency)")
    for column in COLUMNS:
        table.add_column(column, overflow="fold")
    for row in rows(result, info.objective, info.p99_ms):
        table.add_row(*row)
    console.print(table)
    for stage, candidate in result.skipped:
        console.print(f"skipped ({stage}, over the budget): {candidate.label()}")


def compare(result: SweepResult, written: Measurement, objective: str,
            p99_ms: float | None) -> Comparison:
    best = rank.best_point(written, objective, p99_ms)
    assert best is not None, "the written config is sweep.winner's, which qualifies"
    shipped = rank.best_point(result.shipped, objective, p99_ms)
    if result.confirmation and written is not result.shipped:
        again_written, again_shipped = (rank.best_point(m, objective, p99_ms)
                                        for m in result.confirmation)
        if again_written is not None:
            return Comparison(again_written, again_shipped, "measured again one after the other "
                                                            "at the end of the sweep, each at "
                                                            "its best concurrency")
    if written is result.shipped:
        how = ("the shipped config won the sweep" if not result.confirmation else
               "the sweep's winner did not beat the shipped config when both were measured "
               "again, so the shipped config is kept")
        return Comparison(best, best, how)  # written is result.shipped: best is shipped's
    return Comparison(best, shipped, f"in the sweep ({result.note})")


def comparison_text(comparison: Comparison, objective: str) -> str:
    ratio = comparison.ratio(objective)
    unit = rank.UNITS[objective]
    digits = 4 if objective == "energy" else 1
    ours = _num(rank.figure(comparison.written, objective), digits)
    theirs = rank.figure(comparison.shipped, objective) if comparison.shipped else None
    if theirs is None or ratio is None:  # no point of the shipped config qualified
        return (f"{ours} {unit}, where the shipped config had no qualifying point "
                f"({comparison.how}; its row in the table says why)")
    return (f"{ours} {unit} against the shipped config's {_num(theirs, digits)}: "
            f"{_num(ratio, 2)}x ({comparison.how})")


def header(info: RunInfo, written: Measurement, comparison: Comparison) -> str:
    """The comment block at the top of the written config."""
    point = comparison.written
    lines = [
        f"Written by `{info.command}` on {info.started} UTC ({info.host}).",
        f"Objective: {info.objective}"
        + (f" with p99 <= {info.p99_ms:g} ms" if info.p99_ms else "")
        + f"; batch-1 requests from {info.client}, {info.seconds:g} s per concurrency.",
        f"Measured: {point.rps:,.0f} req/s at concurrency {point.concurrency}, p50 "
        f"{point.p50_ms:.2f} ms, p99 {point.p99_ms:.2f} ms, {watts_text(point)}, "
        f"{_num(point.gflops_per_watt, 3)} GFLOP/s per W, {_num(point.joules_per_image, 4)} J "
        "per image.",
        f"Against the shipped config.pbtxt: {comparison_text(comparison, info.objective)}.",
        f"Devices: {written.served_devices or written.candidate.devices}; power sources: "
        f"{sources_text(point.sources) or 'none'}.",
    ]
    if any(s == "model" for s in point.sources.values()):
        lines.append("A `model` power source is an estimate (idle/busy watts x measured busy "
                     "time), not a measurement.")
    return "".join(f"# {line}\n" for line in lines)


def markdown(info: RunInfo, result: SweepResult, written: Measurement | None,
             comparison: Comparison | None, written_path: Path | None,
             figure: Path | None, figure_note: str) -> str:
    lines = [f"# hetserve tune: {info.model}", "",
             f"- command: `{info.command}`",
             f"- started: {info.started} UTC on {info.host}",
             f"- objective: {info.objective}"
             + (f", p99 ≤ {info.p99_ms:g} ms" if info.p99_ms else ""),
             f"- budget: {info.budget_s:g} s; {len(result.measurements)} candidates measured, "
             f"{len(result.skipped)} skipped",
             f"- load: batch-1 requests from {info.client} at concurrency "
             f"{', '.join(map(str, info.concurrencies))}, {info.seconds:g} s each",
             f"- candidate devices: {', '.join(info.candidate_devices)}", ""]
    if written is not None and comparison is not None:
        lines += ["## Written config", "",
                  f"`{written_path}`: {written.candidate.label()}.", "",
                  f"Against the shipped config: {comparison_text(comparison, info.objective)}.",
                  ""]
    else:
        lines += ["## No config written", "", "No candidate met the objective's bound.", ""]
    lines += ["## Candidates", "",
              "Each at its best concurrency for the objective. Watts are every device the "
              "daemon meters, under that load, with their source.", "",
              "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |"
              for row in rows(result, info.objective, info.p99_ms)]
    if result.skipped:
        lines += ["", "Skipped, over the budget:", ""]
        lines += [f"- {stage}: {candidate.label()}" for stage, candidate in result.skipped]
    if result.confirmation:
        lines += ["", "Measured again at the end (winner, then shipped):", ""]
        for m in result.confirmation:
            lines += [f"- {m.candidate.label()}: " + "; ".join(
                f"concurrency {p.concurrency}: {p.rps:,.0f} req/s, p99 {p.p99_ms:.2f} ms, "
                f"{_num(p.joules_per_image, 4)} J per image" for p in m.points)
                + (f" (failed: {m.error})" if m.error else "")]
    lines += ["", "## Every load point", "",
              "| candidate | concurrency | req/s | p50 ms | p99 ms | watts (source) "
              "| GFLOP/s per W | J per image | errors |",
              "|---|---:|---:|---:|---:|---|---:|---:|---|"]
    for m in result.measurements:
        for p in m.points:
            lines.append(f"| {m.candidate.label()} | {p.concurrency} | {p.rps:,.0f} "
                         f"| {p.p50_ms:.2f} | {p.p99_ms:.2f} | {watts_text(p)} "
                         f"| {_num(p.gflops_per_watt, 3)} | {_num(p.joules_per_image, 4)} "
                         f"| {p.errors or ''} |")
    lines += ["", "## Throughput against GFLOP/s per watt", ""]
    lines += [f"![req/s against GFLOP/s per watt]({figure.name})" if figure else figure_note]
    return "\n".join(lines) + "\n"


def results_json(info: RunInfo, result: SweepResult, written: Measurement | None,
                 comparison: Comparison | None) -> str:
    """Every measurement of a session as JSON, for scripts and the docs' figures."""
    def measurement(m: Measurement) -> dict:
        return {**asdict(m), "points": [
            {**asdict(p), "gflops_per_watt": p.gflops_per_watt,
             "joules_per_image": p.joules_per_image} for p in m.points]}
    return json.dumps({
        "command": info.command, "started_utc": info.started, "host": info.host,
        "objective": info.objective, "p99_ms": info.p99_ms, "budget_s": info.budget_s,
        "client": info.client,
        "measurements": [measurement(m) for m in result.measurements],
        "skipped": [{"stage": s, **asdict(c)} for s, c in result.skipped],
        "confirmation": [measurement(m) for m in result.confirmation or ()],
        "written": written and {"stage": written.stage, **asdict(written.candidate)},
        "comparison": comparison and {
            "written": asdict(comparison.written),
            "shipped": comparison.shipped and asdict(comparison.shipped),
            "ratio": comparison.ratio(info.objective), "how": comparison.how},
    }, indent=2)
