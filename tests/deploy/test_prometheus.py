"""The recording rules (Triton's names too), checked by promtool, and computed by a real
Prometheus scraping a real daemon under load: finite, and equal to what the daemon's own counters
give."""

from __future__ import annotations

import math
import subprocess
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import yaml
from tritonclient.utils import InferenceServerException

from tests.support.daemon import MODEL, image_input
from tests.support.metrics import samples, value
from tests.support.prometheus_stack import RULES, TRITON, Stack, prometheus_tool, scrape


def test_promtool_checks_the_rules_their_unit_tests_and_the_example_config() -> None:
    promtool = prometheus_tool("promtool")
    folder = RULES.parent
    for args in (["check", "rules", "rules.yml"], ["test", "rules", "rules_test.yml"],
                 ["check", "rules", "triton.yml"], ["test", "rules", "triton_test.yml"],
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
    node = f"127.0.0.1:{stack.daemon.metrics_port}"
    assert jpi["metric"] == {"__name__": "model_device:hetserve_joules_per_inference:ratio_rate1m",
                             "instance": node, "model": "mnist_cnn", "device": "cpu0",
                             "kind": "cpu", "source": "model"}
    assert gpw["metric"] == {"__name__": "device:hetserve_gflops_per_watt:ratio_rate1m",
                             "instance": node, "device": "cpu0", "kind": "cpu", "source": "model"}
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


def triton_names() -> set[str]:
    (group,) = yaml.safe_load(TRITON.read_text())["groups"]
    return {rule["record"] for rule in group["rules"]}


def test_every_triton_name_has_a_unit_test() -> None:
    tests = yaml.safe_load((TRITON.parent / "triton_test.yml").read_text())["tests"]
    tested = {case["expr"] for test in tests for case in test["promql_expr_test"]}
    assert triton_names() <= tested


def test_tritons_names_are_recorded_from_a_live_daemon(stack: Stack) -> None:
    """After real requests, one of them refused (Triton's reason OTHER): every name has its
    series, labelled model and version, with the values the daemon's counters give."""
    prom = stack.prometheus
    with grpcclient.InferenceServerClient(stack.daemon.url) as client, \
            pytest.raises(InferenceServerException, match="shape"):
        client.infer(MODEL, image_input(np.zeros((1, 3, 3, 1), np.float32)))
    deadline = time.monotonic() + 30
    while not prom.query('nv_inference_request_failure{reason="OTHER"}'):
        assert time.monotonic() < deadline, "the refusal was not recorded in 30 s"
        time.sleep(0.5)
    (stamp,) = prom.query("timestamp(nv_inference_count)")
    at = float(stamp["value"][1])  # when the rules were last evaluated: all from one scrape
    found = {}
    for r in prom.query('{__name__=~"nv_inference_.+"}', at):
        labels = dict(r["metric"])
        found[labels.pop("__name__")] = labels, float(r["value"][1])
    assert set(found) == triton_names()
    for name, (labels, _) in found.items():
        assert labels == {"job": "hetserve", "instance": f"127.0.0.1:{stack.daemon.metrics_port}",
                          "model": MODEL, "version": "1"} | (
            {"reason": "OTHER"} if name == "nv_inference_request_failure" else {}), name
    v = {name: value for name, (_, value) in found.items()}
    before, after = samples(stack.before), samples(scrape(stack.daemon.metrics_url))
    ok = {"model": MODEL, "code": "OK"}
    assert value(before, "hetserve_requests_total", **ok) <= v["nv_inference_request_success"] \
        <= value(after, "hetserve_requests_total", **ok)
    assert v["nv_inference_request_failure"] == 1
    # The load: one request of 4 images at a time, each its own batch; one may have run and
    # not been answered yet when Prometheus scraped.
    success = v["nv_inference_request_success"]
    assert success <= v["nv_inference_exec_count"] <= success + 1
    assert v["nv_inference_count"] == 4 * v["nv_inference_exec_count"]
    for total, count in (("nv_inference_compute_infer_duration_us", "nv_inference_exec_count"),
                         ("nv_inference_request_duration_us", "nv_inference_request_success"),
                         ("nv_inference_queue_duration_us", "nv_inference_request_success")):
        assert 0 < v[total] / v[count] < 10e6, (total, v)  # µs each, under 10 s
    assert v["nv_inference_request_duration_us"] > v["nv_inference_queue_duration_us"]
    assert v["nv_inference_pending_request_count"] in (0, 1)  # one client, one at a time
