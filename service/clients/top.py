"""`hetserve top`: the node's figures in a terminal, for people without Grafana. It reads the
daemon's /metrics twice and shows the rates in between: the same arithmetic as the recording
rules in deploy/prometheus (watts = joules counter rate, GFLOP/s per watt, joules per inference),
and joules per request per model and device."""

from __future__ import annotations

import math
import sys
import time
import urllib.request
from dataclasses import dataclass
from typing import TextIO

from prometheus_client.parser import text_string_to_metric_families

Labels = frozenset[tuple[str, str]]
ESTIMATE_NOTE = ("model* and model (est.): an estimate, from configured idle/busy watts blended "
                 "by measured busy time")


@dataclass(frozen=True)
class Snapshot:
    time: float
    samples: dict[tuple[str, Labels], float]

    def series(self, name: str) -> dict[Labels, float]:
        return {labels: v for (n, labels), v in self.samples.items() if n == name}

    def total(self, name: str) -> float:
        """A metric summed over all its label sets."""
        return sum(self.series(name).values())


def fetch(url: str, timeout_s: float = 5.0) -> Snapshot:
    with urllib.request.urlopen(url, timeout=timeout_s) as reply:
        text = reply.read().decode()
    return Snapshot(time.monotonic(), {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text) for s in family.samples})


def rate(prev: Snapshot, cur: Snapshot, name: str, by: tuple[str, ...]) -> dict[tuple, float]:
    """Per-second increase of a counter between two snapshots, summed by the labels `by`."""
    elapsed = cur.time - prev.time
    before = prev.series(name)
    out: dict[tuple, float] = {}
    for labels, value in cur.series(name).items():
        key = tuple(dict(labels).get(k, "") for k in by)
        out[key] = out.get(key, 0.0) + max(0.0, value - before.get(labels, 0.0)) / elapsed
    return out


def quantile(q: float, buckets: dict[float, float]) -> float:
    """Prometheus' histogram_quantile over cumulative bucket counts keyed by upper bound."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0.0
    if total <= 0:
        return math.nan
    rank, lower, below = q * total, 0.0, 0.0
    for upper in bounds:
        count = buckets[upper]
        if count >= rank:
            if math.isinf(upper):
                return lower
            return lower + (upper - lower) * (rank - below) / max(count - below, 1e-12)
        lower, below = upper, count
    return lower


def latency(prev: Snapshot, cur: Snapshot, q: float) -> dict[str, float]:
    per_model: dict[str, dict[float, float]] = {}
    before = prev.series("hetserve_request_duration_seconds_bucket")
    for labels, value in cur.series("hetserve_request_duration_seconds_bucket").items():
        d = dict(labels)
        buckets = per_model.setdefault(d["model"], {})
        buckets[float(d["le"])] = buckets.get(float(d["le"]), 0.0) + value - before.get(labels, 0)
    return {model: quantile(q, buckets) for model, buckets in per_model.items()}


# The servicer counts a request that names no served model under model="".
_NO_MODEL = "(no model)"


def _fmt(value: float, digits: int = 1) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:,.{digits}f}"


def render(prev: Snapshot, cur: Snapshot, url: str) -> str:
    requests = rate(prev, cur, "hetserve_requests_total", ("model",))
    by_code = rate(prev, cur, "hetserve_requests_total", ("model", "code"))
    failed = {k: v for k, v in by_code.items() if k[1] != "OK"}
    queue = rate(prev, cur, "hetserve_queue_duration_seconds_sum", ("model",))
    p50, p99 = latency(prev, cur, 0.5), latency(prev, cur, 0.99)
    lines = [f"hetserve top  {url}  over {cur.time - prev.time:.1f} s", "",
             f"{'MODEL':<20} {'REQ/S':>9} {'FAILED/S':>9} {'P50 MS':>8} {'P99 MS':>8} "
             f"{'QUEUE':>7}"]
    for (model,), rps in sorted(requests.items()):
        fails = sum(v for k, v in failed.items() if k[0] == model)
        lines.append(f"{model or _NO_MODEL:<20} {_fmt(rps):>9} {_fmt(fails):>9} "
                     f"{_fmt(p50.get(model, math.nan) * 1e3, 2):>8} "
                     f"{_fmt(p99.get(model, math.nan) * 1e3, 2):>8} "
                     f"{_fmt(queue.get((model,), 0.0), 2):>7}")

    watts = rate(prev, cur, "hetserve_device_energy_joules_total", ("device", "kind", "source"))
    busy = rate(prev, cur, "hetserve_device_busy_seconds_total", ("device",))
    flops = rate(prev, cur, "hetserve_flops_total", ("device",))
    inferences = rate(prev, cur, "hetserve_inferences_total", ("device",))
    up = {dict(k)["device"]: v for k, v in cur.series("hetserve_device_up").items()}
    lines += ["", f"{'DEVICE':<10} {'KIND':<5} {'SOURCE':<9} {'UP':>3} {'BUSY %':>7} "
                  f"{'WATTS':>8} {'INF/S':>9} {'GFLOP/S':>9} {'GFLOP/S/W':>10}"]
    estimated = False
    for (device, kind, source), w in sorted(watts.items()):
        estimated |= source == "model"
        gflops = flops.get((device,), 0.0) / 1e9
        lines.append(
            f"{device:<10} {kind:<5} {'model*' if source == 'model' else source:<9} "
            f"{int(up.get(device, 0)):>3} {_fmt(100 * busy.get((device,), 0.0)):>7} "
            f"{_fmt(w):>8} {_fmt(inferences.get((device,), 0.0)):>9} {_fmt(gflops, 2):>9} "
            f"{_fmt(gflops / w if w > 0 else math.nan, 3):>10}")

    model_joules = rate(prev, cur, "hetserve_model_energy_joules_total",
                        ("model", "device", "source"))
    per_model = rate(prev, cur, "hetserve_inferences_total", ("model", "device"))
    # Requests are counted per model, and all of a request's rows run on one device: its
    # joules there are the device's joules per inference times the model's rows per request.
    rows = rate(prev, cur, "hetserve_inferences_total", ("model",))
    answered = {model: v for (model, code), v in by_code.items() if code == "OK"}
    lines += ["", f"{'MODEL':<20} {'DEVICE':<10} {'INF/S':>9} {'mJ/INFERENCE':>13} "
                  f"{'mJ/REQUEST':>11} SOURCE"]
    for (model, device, source), joules in sorted(model_joules.items()):
        estimated |= source == "model"
        n = per_model.get((model, device), 0.0)
        per_inference = 1e3 * joules / n if n > 0 else math.nan
        ok = answered.get(model, 0.0)
        rows_per_request = rows.get((model,), 0.0) / ok if ok > 0 else math.nan
        lines.append(f"{model:<20} {device:<10} {_fmt(n):>9} {_fmt(per_inference, 3):>13} "
                     f"{_fmt(per_inference * rows_per_request, 3):>11} "
                     f"{'model (est.)' if source == 'model' else source}")
    if estimated:
        lines += ["", ESTIMATE_NOTE]
    return "\n".join(lines)


def run(url: str, interval_s: float, once: bool, out: TextIO = sys.stdout) -> int:
    live = not once and out.isatty()
    try:
        prev = fetch(url)
        while True:
            time.sleep(interval_s)
            cur = fetch(url)
            frame = render(prev, cur, url)
            out.write(("\x1b[H\x1b[2J" if live else "") + frame + "\n")
            out.flush()
            if once:
                return 0
            prev = cur
    except OSError as e:
        print(f"hetserve top: cannot read {url}: {getattr(e, 'reason', e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
