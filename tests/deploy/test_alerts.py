"""The alerting rules: promtool's unit tests fire each alert and keep it quiet where it should
be; against a real daemon scraped by a real Prometheus every rule evaluates cleanly on metrics
the daemon exports; the Kubernetes scrape configuration finds the daemon by its pod annotations."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import yaml

from tests.deploy.manifests import daemonsets
from tests.support.prometheus_stack import ALERTS, RULES, Prometheus, Stack, prometheus_tool

KUBERNETES_CONFIG = RULES.parent / "prometheus-kubernetes.yml"


def alert_rules() -> list[dict]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"]
            for rule in group["rules"]]


def test_promtool_checks_the_alerts_and_runs_their_unit_tests() -> None:
    promtool = prometheus_tool("promtool")
    for args in (["check", "rules", ALERTS.name], ["test", "rules", "alerts_test.yml"]):
        done = subprocess.run([promtool, *args], cwd=RULES.parent, capture_output=True,
                              text=True)
        assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_unit_test() -> None:
    tested = {case["alertname"]
              for test in yaml.safe_load((RULES.parent / "alerts_test.yml").read_text())["tests"]
              for case in test.get("alert_rule_test", [])
              if case.get("exp_alerts")}
    assert tested == {rule["alert"] for rule in alert_rules()}


def test_the_alerts_read_metrics_the_daemon_exports(stack: Stack) -> None:
    exported = {m.group(1) for m in re.finditer(r"^(\w+)[{ ]", stack.before, re.MULTILINE)}
    for rule in alert_rules():
        for name in re.findall(r"\b(hetserve_\w+|\w+:hetserve_\w+:\w+)", rule["expr"]):
            assert name in exported or name in stack.rule_names, (rule["alert"], name)


def test_every_rule_evaluates_cleanly_on_a_live_daemons_metrics(stack: Stack) -> None:
    prom = stack.prometheus
    deadline = time.monotonic() + 30
    while True:  # until every rule has been evaluated once
        rules = [r for g in prom.api("rules")["groups"] for r in g["rules"]]
        if all(r["health"] != "unknown" for r in rules) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert {r["name"] for r in rules if r["type"] == "alerting"} == \
        {rule["alert"] for rule in alert_rules()}
    for r in rules:
        assert (r["name"], r["health"], r.get("lastError", "")) == (r["name"], "ok", "")
    # Nothing fires (each alert waits its `for:` first; pending ones depend on this machine's load).
    assert prom.query('ALERTS{alertname=~"Hetserve.*", alertstate="firing"}') == []
    # The rules see the daemon: the same expression without its threshold has series.
    assert prom.query('up{job="hetserve"} == 1')
    assert prom.query("hetserve_device_healthy == 1")


def test_the_kubernetes_scrape_config_finds_the_daemon_by_its_pod_annotations(
        stack: Stack, tmp_path: Path) -> None:
    """Debian's Prometheus lacks Kubernetes discovery: a file lists the pod with the labels
    Kubernetes discovery would give it, and the job's own relabelling does the rest."""
    (job,) = yaml.safe_load(KUBERNETES_CONFIG.read_text())["scrape_configs"]
    pod = daemonsets()["cpu"]["spec"]["template"]
    meta = {"__meta_kubernetes_pod_ip": "127.0.0.1",
            "__meta_kubernetes_pod_node_name": "node-7",
            "__meta_kubernetes_pod_name": "hetserve-cpu-x2f9q",
            "__meta_kubernetes_pod_label_hetserve_io_accelerator":
                pod["metadata"]["labels"]["hetserve.io/accelerator"]}
    for key, value in pod["metadata"]["annotations"].items():
        meta["__meta_kubernetes_pod_annotation_" + re.sub(r"\W", "_", key)] = value
    # The pod's metrics port is the daemon's, mapped to the one this test's daemon uses.
    assert meta["__meta_kubernetes_pod_annotation_prometheus_io_port"] == "8002"
    meta["__meta_kubernetes_pod_annotation_prometheus_io_port"] = \
        str(stack.daemon.metrics_port)
    other = dict(meta, __meta_kubernetes_pod_annotation_prometheus_io_scrape="false",
                 __meta_kubernetes_pod_name="not-annotated")
    targets = tmp_path / "pods.json"
    targets.write_text(json.dumps([{"targets": ["10.0.0.1:9999"], "labels": meta},
                                   {"targets": ["10.0.0.2:9999"], "labels": other}]))
    job = {k: v for k, v in job.items() if k != "kubernetes_sd_configs"} | {
        "file_sd_configs": [{"files": [str(targets)]}]}
    prometheus = Prometheus(tmp_path / "k8s", "", scrape_configs=[job])
    try:
        deadline = time.monotonic() + 30
        while not (found := prometheus.query('up{job="hetserve"} == 1')):
            assert time.monotonic() < deadline, "the pod was not scraped in 30 s"
            time.sleep(0.5)
        (target,) = [t for t in prometheus.api("targets")["activeTargets"]]
        assert target["labels"] == {
            "job": "hetserve", "instance": f"127.0.0.1:{stack.daemon.metrics_port}",
            "node": "node-7", "accelerator": "cpu", "pod": "hetserve-cpu-x2f9q"}
        assert target["scrapeUrl"] == \
            f"http://127.0.0.1:{stack.daemon.metrics_port}/metrics"
        assert found[0]["metric"]["node"] == "node-7"
    finally:
        prometheus.stop()
