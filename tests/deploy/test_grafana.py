"""The provisioned Grafana dashboard: every metric its PromQL names is in a live scrape of the
daemon or is one of our recording rules, every query is limited to the chosen datasource, nodes
and models, and every panel draws data from a real Prometheus."""

from __future__ import annotations

import json
import re

import yaml

from tests.support.daemon import MODEL, ROOT
from tests.support.metrics import samples
from tests.support.prometheus_stack import Stack

GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARD = json.loads((GRAFANA / "dashboards" / "hetserve.json").read_text())
PANELS = DASHBOARD["panels"]
VARIABLES = {v["name"]: v for v in DASHBOARD["templating"]["list"]}
CHOSEN = {"instance": '=~"$node"', "model": '=~"$model"'}  # label: the matcher every query has

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


def selectors(expr: str) -> list[tuple[str, str]]:
    """Each metric named in `expr`, with its label matchers ("" where it has none)."""
    plain = re.sub(r'"[^"]*"', lambda m: "_" * len(m.group()), expr)  # positions kept
    found = []
    for name in sorted(metric_names(expr)):
        for at in re.finditer(rf"(?<![\w:]){re.escape(name)}(?![\w:])", plain):
            end = plain.find("}", at.end()) if plain.startswith("{", at.end()) else at.end()
            found.append((name, expr[at.end() + 1:end]))
    return found


def test_provisioning_points_the_dashboard_at_its_datasource() -> None:
    source = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yml").read_text())
    provider = yaml.safe_load((GRAFANA / "provisioning/dashboards/hetserve.yml").read_text())
    (datasource,) = source["datasources"]
    assert datasource["type"] == "prometheus"
    assert provider["providers"][0]["type"] == "file"
    # Every query goes to the datasource chosen, by default the provisioned one.
    chosen = {"type": "prometheus", "uid": "${datasource}"}
    assert all(p["datasource"] == chosen and all(t["datasource"] == chosen for t in p["targets"])
               for p in PANELS)
    assert VARIABLES["datasource"]["type"] == "datasource"
    assert VARIABLES["datasource"]["query"] == "prometheus"
    assert VARIABLES["datasource"]["current"]["value"] == datasource["uid"]
    assert len({p["id"] for p in PANELS}) == len(PANELS)


def test_nodes_and_models_are_chosen_by_variables() -> None:
    assert list(VARIABLES) == ["datasource", "node", "model"]
    for name, label in (("node", "instance"), ("model", "model")):
        variable = VARIABLES[name]
        assert variable["type"] == "query" and variable["datasource"]["uid"] == "${datasource}"
        assert variable["query"]["query"].endswith(f", {label})")
        assert variable["multi"] and variable["includeAll"] and variable["allValue"] == ".*"
    assert '{instance=~"$node"}' in VARIABLES["model"]["query"]["query"]  # the nodes' models


def test_selectors_are_read_from_promql() -> None:
    assert selectors('sum(a{x="b{c}"}) / b:c:d / a') == [("a", 'x="b{c}"'), ("a", ""),
                                                        ("b:c:d", "")]


def test_every_query_keeps_to_the_chosen_nodes_and_models(stack: Stack) -> None:
    """Each metric of each query matches `instance` on $node, and `model` on $model where its
    series have a model label (in the live Prometheus)."""
    labelled = {r["metric"]["__name__"] for r in stack.prometheus.query(
        '{__name__=~"hetserve_.+|.+:hetserve_.+", model!=""}')}
    for p in PANELS:
        for t in p["targets"]:
            for name, matchers in selectors(t["expr"]):
                wanted = ["instance"] + (["model"] if name in labelled else [])
                for label in wanted:
                    assert f"{label}{CHOSEN[label]}" in matchers, (p["title"], name, label)


def test_the_issue_panels_are_there_and_estimates_are_marked() -> None:
    titles = {p["title"] for p in PANELS}
    assert {"Requests/s by model", "Latency p50 / p99 by model", "Batch size distribution",
            "Throughput by device", "Watts by device", "Joules per inference",
            "GFLOP/s per watt by device kind", "Queue depth", "Failovers",
            "Pending requests"} <= titles
    for p in PANELS:
        if any(w in p["title"] for w in ("Watts", "Joules", "per watt")):
            assert "estimate" in p["description"], p["title"]


def test_every_metric_exists_in_a_live_scrape_or_the_rules(stack: Stack) -> None:
    live = {name for name, _ in samples(stack.before)}
    names = {n for p in PANELS for t in p["targets"] for n in metric_names(t["expr"])}
    assert {"hetserve_requests_total", "hetserve_inferences_total",
            "device:hetserve_gflops_per_watt:ratio_rate1m"} <= names
    missing = names - live - stack.rule_names
    assert not missing, f"dashboard metrics neither scraped nor recorded: {sorted(missing)}"


def grafana_expanded(expr: str, node: str = ".*", model: str = ".*") -> str:
    """A query as Grafana sends it, with every node and model chosen (the variables' "All")
    or one of each."""
    return expr.replace("$__rate_interval", "1m").replace("$node", node).replace(
        "$model", model)


def test_every_panel_draws_data_from_prometheus(stack: Stack) -> None:
    node = f"127.0.0.1:{stack.daemon.metrics_port}"
    for chosen in ({}, {"node": node, "model": MODEL}):
        for p in PANELS:
            results = [stack.prometheus.query(grafana_expanded(t["expr"], **chosen))
                       for t in p["targets"]]
            assert any(results), f"panel {p['title']!r} has no data for {chosen}"
    assert not stack.prometheus.query(grafana_expanded(PANELS[0]["targets"][0]["expr"],
                                                       model="no-such-model"))


def test_the_variables_find_the_node_and_its_model(stack: Stack) -> None:
    (series,) = stack.prometheus.query("hetserve_device_healthy")  # what both list labels of
    assert series["metric"]["instance"] == f"127.0.0.1:{stack.daemon.metrics_port}"
    assert series["metric"]["model"] == MODEL
