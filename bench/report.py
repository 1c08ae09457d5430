"""Writes a run's results as results.json, report.md and the PNG figures it shows.

`results` holds `meta` (when, where, the command), `loadgen` (parsed LoadGen summaries),
`batch_table` (Point.as_dict() rows) and `benches` (the older benches' outputs); any part may
be missing."""

from __future__ import annotations

import json
from pathlib import Path

from accelerators import safe_files
from bench import plots
from bench.models import TITLES
from service.clients.watts import watts_label


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def loadgen_section(runs: list[dict]) -> list[str]:
    offline = {r["model"]: r["result"] for r in runs
               if r["scenario"] == "Offline" and r["mode"] != "AccuracyOnly" and r["result"]}
    lines = ["## MLPerf LoadGen scenarios", "",
             "LoadGen's own verdict and figures (parsed from each run's `mlperf_log_summary.txt`; "
             "the logs are in the folder named in the last column). Latency percentiles are "
             "LoadGen's, in ms; for the Server scenario, × Offline is its throughput over the "
             "Offline scenario's in the same run.", "",
             "| scenario | model | verdict | result | × Offline | p50 ms | p90 ms | p99 ms "
             "| samples | errors | logs |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---|---|"]
    for r in runs:
        if r["mode"] == "AccuracyOnly":
            verdict = "accuracy run"
            result = (f"accuracy {100 * r['accuracy']:.1f}% of {r['accuracy_samples']}"
                      if "accuracy" in r else "accuracy logged")
        else:
            verdict = "VALID" if r["valid"] else "INVALID (" + ", ".join(
                k.removesuffix(" satisfied") for k, v in r["constraints"].items()
                if v.upper() != "YES") + ")"
            result = (f"{r['result'] / 1e6:.2f} ms" if r["result_unit"] == "ns"
                      else f"{_num(r['result'], 1)} {r['result_unit']}")
            if r["scenario"] == "Server":
                result += (f" at target {r['target_qps']:g}/s, p99 ≤ "
                           f"{r['target_latency_ms']:g} ms")
        ratio = (_num(r["result"] / offline[r["model"]], 2)
                 if r["scenario"] == "Server" and offline.get(r["model"]) else "")
        p = r.get("latency_ms", {})
        errors = ", ".join(f"{n} {k}" for k, n in r.get("errors", {}).items()) or "0"
        lines.append(f"| {r['scenario']} | {TITLES.get(r['model'], r['model'])} | {verdict} "
                     f"| {result} | {ratio} | {_num(p.get('p50'), 1)} | {_num(p.get('p90'), 1)} "
                     f"| {_num(p.get('p99'), 1)} | {r.get('samples', 0):,} | {errors} "
                     f"| `{Path(r['log_dir']).name}/` |")
    return lines + [""]


def _target(p: dict) -> str:
    return f"{p['engine']}:{p['device']} {p['path']}"


def batch_section(points: list[dict]) -> list[str]:
    """The classic table (images/s, a column per batch size), then each target's efficiency
    at its most efficient batch size."""
    batches = sorted({p["batch"] for p in points})
    reference = {(p["model"], p["engine"], p["device"], p["batch"]): p["images_per_s"]
                 for p in points if p["path"] == "in-process"}
    rows: dict[tuple[str, str], dict[int, dict]] = {}
    for p in points:
        rows.setdefault((p["model"], _target(p)), {})[p["batch"]] = p
    lines = ["## Images/s by batch size", "",
             "In-process: the engine alone. Daemon: the same engine behind `hetserve serve` "
             "(one instance, no batching window, two requests in flight, tensors in shared "
             "memory), in brackets over in-process at the same batch size; the two alternate "
             "in slices at each point. `-`: skipped, a batch expected to take longer than "
             "`--max-batch-s`.", "",
             "| model | target | " + " | ".join(f"batch {b}" for b in batches) + " |",
             "|---|---|" + "---:|" * len(batches)]
    failures = []
    for (model, target), by_batch in rows.items():
        cells = []
        for b in batches:
            p = by_batch.get(b)
            if p is None or not p["images_per_s"]:
                cells.append("failed" if p and p["note"].startswith("failed") else "-")
                if p and p["note"].startswith("failed"):
                    failures.append(f"- {TITLES.get(model, model)}, {target}, batch {b}: "
                                    f"{p['note']}")
                continue
            ref = reference.get((model, p["engine"], p["device"], b))
            ratio = f" ({p['images_per_s'] / ref:.2f}×)" if p["path"] == "daemon" and ref else ""
            cells.append(_num(p["images_per_s"], 1 if p["images_per_s"] < 10 else 0) + ratio)
        lines.append(f"| {TITLES.get(model, model)} | {target} | " + " | ".join(cells) + " |")
    lines += [""] + failures + ([""] if failures else [])
    lines += ["Efficiency at each target's most efficient batch size. GFLOP/s from the models' "
              "FLOPs per image (accelerators/flops.py). Watts say their source: `model "
              "estimate` is configured idle/busy watts blended by measured busy time, not a "
              "measurement.", "",
              "| model | target | batch | images/s | watts (source) | GFLOP/s | GFLOP/s per W "
              "| J per image |", "|---|---|---:|---:|---|---:|---:|---:|"]
    for (model, target), by_batch in rows.items():
        measured = [p for p in by_batch.values() if p["images_per_s"]]
        if not measured:
            continue
        p = max(measured, key=lambda p: p["gflops_per_watt"] or p["images_per_s"])
        lines.append(f"| {TITLES.get(model, model)} | {target} | {p['batch']} "
                     f"| {_num(p['images_per_s'], 1)} "
                     f"| {watts_label(p['watts'], p['power_source'])} "
                     f"| {_num(p['gflops'], 1)} | {_num(p['gflops_per_watt'], 3)} "
                     f"| {_num(p['joules_per_image'], 4)} |")
    return lines + [""]


def tradeoff_section(points: list[dict]) -> list[str]:
    """Per model and path, the Pareto front of images/s against GFLOP/s per watt: the device
    and batch sizes between which the trade is made (tradeoff.png draws it)."""
    measured = [p for p in points if p["images_per_s"] and p["gflops_per_watt"]]
    lines = ["## The trade: throughput against GFLOP/s per watt", "",
             "The points no other point of the same model and path beats on both images/s and "
             "GFLOP/s per watt, from the most efficient to the fastest (watts with their source "
             "as above).", "", "| model | path | Pareto front: target, batch (images/s, "
             "GFLOP/s per W) |", "|---|---|---|"]
    for model, path in dict.fromkeys((p["model"], p["path"]) for p in measured):
        front = plots.pareto_front([p for p in measured
                                    if (p["model"], p["path"]) == (model, path)])
        lines.append(f"| {TITLES.get(model, model)} | {path} | " + "; ".join(
            f"{p['engine']}:{p['device']}, {p['batch']} ({_num(p['images_per_s'], 1)}, "
            f"{_num(p['gflops_per_watt'], 3)})" for p in front) + " |")
    return lines + [""]


def write_report(results: dict, out: Path) -> Path:
    """results.json, the PNGs and report.md under `out`; returns report.md's path."""
    out.mkdir(parents=True, exist_ok=True)
    safe_files.write_file(out / "results.json", json.dumps(results, indent=2, default=str),
                          flag=None)
    meta = results.get("meta", {})
    lines = ["# hetserve benchmark report", ""]
    lines += [f"- {key}: {value}" for key, value in meta.items()] + [""]
    figures = []
    if runs := results.get("loadgen"):
        lines += loadgen_section(runs)
        figures.append(("Latency CDF per LoadGen run", plots.latency_cdf(
            runs, out / "latency_cdf.png")))
    if points := results.get("batch_table"):
        lines += batch_section(points)
        figures.append(("Images/s by batch size", plots.throughput(
            points, out / "throughput.png")))
        if any(p["gflops_per_watt"] for p in points):
            figures.append(("GFLOP/s per watt and joules per image", plots.efficiency(
                points, out / "efficiency.png")))
            lines += tradeoff_section(points)
            figures.append(("Throughput against GFLOP/s per watt, Pareto fronts marked",
                            plots.tradeoff(points, out / "tradeoff.png")))
    if figures:
        lines += ["## Figures", ""] + [f"![{title}]({path.name})\n" for title, path in figures]
    for bench in results.get("benches", []):
        lines += [f"## {bench['name']}", "", f"`{bench['command']}` (exit status "
                  f"{bench['returncode']})", "", "```", bench["output"].rstrip(), "```", ""]
    report = out / "report.md"
    safe_files.write_file(report, "\n".join(lines), flag=None)
    return report
