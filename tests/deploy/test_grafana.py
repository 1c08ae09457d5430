"""The provisioned Grafana dashboard: every metric its PromQL names is in a live scrape of the
daemon or is one of our recording rules, and every panel draws data from a real Prometheus."""

from __future__ import annotations

import json
import re

import yaml

from tests.conftest import ROOT
from tests.deploy.conftest import Stack
from tests.deploy.test_prometheus import samples

GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARD = json.loads((GRAFANA / "dashboards" / "hetserve.json").read_text())
PANELS = DASHBOARD["panels"]

# Parts of PromQL that hold no metric names: strings, label matchers, ranges, label lists.
_NOT_NAMES = re.compile(r'"[^"]*"|\{[^}]*\}|\[[^\]]*\]|'
                        r'\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)')
_IDENT = re.compile(r"(?<![\w:.])([a-zA-Z_:][\w:]*)(?![\w:]|\s*\()")
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and",
             "or", "unless", "offset"}


def metric_names(expr: str) -> set[str]:
    return {m for m in _IDENT.findall(_NOT_NAMES.sub(" ", expr)) if m not in _KEYWORDS}


def test_metric_names_are_read_from_promql() -> None:
    assert metric_names('histogram_quantile(0.5, sum by (model, le) (rate(a_bucket{x="y"}[1m])))'
                        ' / on (device) group_left b:c:d * 1e9') == {"a_bucket", "b:c:d"}


def test_provisioning_points_the_dashboard_at_its_datasource() -> None:
    source = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yml").read_text())
    provider = yaml.safe_load((GRAFANA / "provisioning/dashboards/hetserve.yml").read_text())
    (datasource,) = source["datasources"]
    assert datasource["type"] == "prometheus"
    assert provider["providers"][0]["type"] == "file"
    uids = {t["datasource"]["uid"] for p in PANELS for t in p["targets"]}
    assert uids == {datasource["uid"]}
    assert len({p["id"] for p in PANELS}) == len(PANELS)


def test_the_issue_panels_are_there_and_estimates_are_marked() -> None:
    titles = {p["title"] for p in PANELS}
    assert {"Requests/s by model", "Latency p50 / p99 by model", "Batch size distribution",
            "Throughput by device", "Watts by device", "Joules per inference",
            "GFLOP/s per watt by device kind", "Queue depth", "Failovers"} <= titles
    for p in PANELS:
        if any(w in p["title"] for w in ("Watts", "Joules", "per watt")):
            assert "estimate" in p["description"], p["title"]


def test_every_metric_exists_in_a_live_scrape_or_the_rules(stack: Stack) -> None:
    live = {name for name, _ in samples(stack.before)}
    names = {n for p in PANELS for t in p["targets"] for n in metric_names(t["expr"])}
    assert {"hetserve_requests_total", "hetserve_inferences_total",
            "kind:hetserve_gflops_per_watt:ratio_rate1m"} <= names
    missing = names - live - stack.rule_names
    assert not missing, f"dashboard metrics neither scraped nor recorded: {sorted(missing)}"


def test_every_panel_draws_data_from_prometheus(stack: Stack) -> None:
    for p in PANELS:
        results = [stack.prometheus.query(t["expr"].replace("$__rate_interval", "1m"))
                   for t in p["targets"]]
        assert any(results), f"panel {p['title']!r} has no data"
