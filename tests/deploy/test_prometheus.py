"""The recording rules, checked by promtool, and computed by a real Prometheus scraping a real
daemon under load: finite, and equal to what the daemon's own counters give."""

from __future__ import annotations

import math
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.conftest import RULES, Stack, prometheus_tool, scrape

Series = dict[tuple[str, frozenset], float]


def samples(text: str) -> Series:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(series: Series, name: str, **labels: str) -> float:
    found = [v for (n, ls), v in series.items() if n == name and set(labels.items()) <= ls]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def test_promtool_checks_the_rules_their_unit_tests_and_the_example_config() -> None:
    promtool = prometheus_tool("promtool")
    folder = RULES.parent
    for args in (["check", "rules", "rules.yml"], ["test", "rules", "rules_test.yml"],
                 ["check", "config", "prometheus.yml"]):
        done = subprocess.run([promtool, *args], cwd=folder, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr


def test_a_live_scrape_passes_promtool_check_metrics(stack: Stack) -> None:
    text = scrape(stack.daemon.metrics_url)
    for name in ("hetserve_flops_total", "hetserve_device_energy_joules_total",
                 "hetserve_device_power_watts", "hetserve_device_busy_seconds_total",
                 "hetserve_device_up", "hetserve_model_energy_joules_total"):
        assert f"\n{name}{{" in text, name
    done = subprocess.run([prometheus_tool("promtool"), "check", "metrics"], input=text,
                          capture_output=True, text=True)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def increase(prometheus, expr: str, at: float) -> dict[frozenset, tuple[float, float]]:
    """First and last raw sample of each series of `expr` over the minute before `at`."""
    out = {}
    for r in prometheus.query(f"{expr}[1m]", at):
        labels = frozenset((k, v) for k, v in r["metric"].items() if k != "__name__")
        out[labels] = (float(r["values"][0][1]), float(r["values"][-1][1]))
    return out


def test_recording_rules_agree_with_the_daemons_counters(stack: Stack) -> None:
    prom = stack.prometheus
    (stamp,) = prom.query("timestamp(model_device:hetserve_joules_per_inference:ratio_rate1m)")
    at = float(stamp["value"][1])  # when the rules were last evaluated
    (jpi,) = prom.query("model_device:hetserve_joules_per_inference:ratio_rate1m", at)
    (gpw,) = prom.query("device:hetserve_gflops_per_watt:ratio_rate1m", at)
    after = samples(scrape(stack.daemon.metrics_url))
    before = samples(stack.before)
    assert jpi["metric"] == {"__name__": "model_device:hetserve_joules_per_inference:ratio_rate1m",
                             "model": "mnist_cnn", "device": "cpu0", "kind": "cpu",
                             "source": "model"}
    assert gpw["metric"] == {"__name__": "device:hetserve_gflops_per_watt:ratio_rate1m",
                             "device": "cpu0", "kind": "cpu", "source": "model"}
    joules_per_inference, gflops_per_watt = float(jpi["value"][1]), float(gpw["value"][1])
    assert math.isfinite(joules_per_inference) and joules_per_inference > 0
    assert math.isfinite(gflops_per_watt) and gflops_per_watt > 0

    # The same figures from the daemon's counters as Prometheus scraped them in that minute,
    # which lie between two scrapes of our own.
    raw = {}
    for name in ("hetserve_model_energy_joules_total", "hetserve_inferences_total",
                 "hetserve_flops_total", "hetserve_device_energy_joules_total"):
        (first_last,) = increase(prom, name, at).values()
        assert value(before, name) <= first_last[0] <= first_last[1] <= value(after, name)
        raw[name] = first_last[1] - first_last[0]
    assert joules_per_inference == pytest.approx(
        raw["hetserve_model_energy_joules_total"] / raw["hetserve_inferences_total"], rel=0.02)
    assert gflops_per_watt == pytest.approx(
        raw["hetserve_flops_total"] / 1e9 / raw["hetserve_device_energy_joules_total"], rel=0.02)
