"""Power settings end to end: a configured estimate is exported as the model source of a
serving daemon's watts."""

from __future__ import annotations

from pathlib import Path

from tests.support.daemon import ROOT, Daemon
from tests.support.metrics import samples, value
from tests.support.prometheus_stack import scrape
from tests.support.served import node_devices


def test_a_configured_estimate_is_exported_as_the_model_source(tmp_path: Path) -> None:
    device = node_devices()[0]  # the example model's device on this node
    daemon = Daemon(tmp_path, ROOT / "models", "--power-sources", "cpu=model,gpu=model",
                    "--power-model", f"{device}=2:4")
    try:
        series = samples(scrape(daemon.metrics_url))
    finally:
        assert daemon.stop() == 0
    watts = value(series, "hetserve_device_power_watts", device=device, source="model")
    assert 2.0 <= watts <= 4.0
    assert value(series, "hetserve_device_up", device=device) == 1.0
    assert value(series, "hetserve_model_energy_joules_total", model="mnist_cnn",
                 device=device, source="model") == 0.0  # exported before the first inference
