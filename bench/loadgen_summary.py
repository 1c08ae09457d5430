"""Reads what LoadGen wrote: mlperf_log_summary.txt (validity, the scenario's result, latency
percentiles) and mlperf_log_accuracy.json (each logged sample's response: here the predicted
class as an int32, checked against the library's labels)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

# The line that holds each scenario's result, and its unit.
RESULT_KEYS = {
    "SingleStream": ("90.0th percentile latency (ns)", "ns"),
    "MultiStream": ("99.0th percentile latency (ns)", "ns"),
    "Server": ("Completed samples per second", "samples/s"),
    "Offline": ("Samples per second", "samples/s"),
}
_LINE = re.compile(r"^\s*(?P<key>[^:*=][^:]*?)\s*:\s*(?P<value>.+?)\s*$")
_PERCENTILE = re.compile(r"^(\d+\.\d+) percentile latency \(ns\)$")


def parse_summary(path: Path) -> dict:
    """The summary's `key : value` lines (the first of each key), and from them: scenario,
    mode, valid, result and its unit, latency percentiles in ms, min/mean/max latency in ms."""
    fields: dict[str, str] = {}
    for line in path.read_text().splitlines():
        match = _LINE.match(line)
        if match and match["key"] not in fields:
            fields[match["key"]] = match["value"]
    scenario = fields.get("Scenario", "")
    key, unit = RESULT_KEYS.get(scenario, ("", ""))
    percentiles = {float(m[1]): int(v) / 1e6 for k, v in fields.items()
                   if (m := _PERCENTILE.match(k))}
    return {
        "scenario": scenario,
        "mode": fields.get("Mode", ""),
        "valid": fields.get("Result is") == "VALID",
        "result_field": key,
        "result": float(fields[key]) if key in fields else None,
        "result_unit": unit,
        "latency_ms": {f"p{q:g}": ms for q, ms in sorted(percentiles.items())},
        **{f"{name}_latency_ms": int(fields[f"{label} latency (ns)"]) / 1e6
           for name, label in (("min", "Min"), ("mean", "Mean"), ("max", "Max"))
           if f"{label} latency (ns)" in fields},
        "constraints": {k: v for k, v in fields.items() if k.endswith("satisfied")},
        "fields": fields,
    }


def accuracy(path: Path, labels: np.ndarray) -> tuple[float, int]:
    """Share of logged samples whose response (an int32 class) equals the label of its sample
    index, and how many samples were logged."""
    entries = json.loads(path.read_text() or "[]")
    if not entries:
        return float("nan"), 0
    predicted = np.array([np.frombuffer(bytes.fromhex(e["data"]), np.int32)[0] for e in entries])
    indices = np.array([e["qsl_idx"] for e in entries])
    return float(np.mean(predicted == labels[indices])), len(entries)
