"""The summary table printed at the end of a run (the report has every figure)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from bench.models import TITLES
from service.clients.watts import watts_label


def print_summary(results: dict, console: Console) -> None:
    if runs := results.get("loadgen"):
        table = Table(title="LoadGen")
        for column in ("scenario", "model", "verdict", "result", "p99 ms", "samples"):
            table.add_column(column)
        for r in runs:
            if r["mode"] == "AccuracyOnly":
                verdict, result = "accuracy", f"{100 * r.get('accuracy', float('nan')):.1f}%"
            else:
                verdict = "VALID" if r["valid"] else "INVALID"
                result = (f"{r['result'] / 1e6:.2f} ms" if r["result_unit"] == "ns"
                          else f"{r['result'] or 0:,.1f} {r['result_unit']}")
            table.add_row(r["scenario"], TITLES.get(r["model"], r["model"]), verdict, result,
                          f"{r.get('latency_ms', {}).get('p99', float('nan')):.1f}",
                          f"{r.get('samples', 0):,}")
        console.print(table)
    if points := results.get("batch_table"):
        best: dict[tuple, dict] = {}
        for p in points:
            key = (p["model"], p["engine"], p["device"], p["path"])
            if p["images_per_s"] and (key not in best
                                      or p["images_per_s"] > best[key]["images_per_s"]):
                best[key] = p
        table = Table(title="Batch table: best batch per model and target")
        for column in ("model", "target", "batch", "images/s", "watts (source)",
                       "GFLOP/s per W", "J per image"):
            table.add_column(column)
        for (model, engine, device, path), p in best.items():
            table.add_row(TITLES.get(model, model), f"{engine}:{device} {path}", str(p["batch"]),
                          f"{p['images_per_s']:,.0f}", watts_label(p["watts"], p["power_source"]),
                          f"{p['gflops_per_watt'] or 0:.3f}", f"{p['joules_per_image'] or 0:.4f}")
        console.print(table)
    for bench in results.get("benches", []):
        console.print(f"{bench['name']}: exit status {bench['returncode']}")
