"""Power settings reach the daemon's metrics; bad ones stop it at start-up with a clear error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from service.local_daemon import free_port
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


def test_bad_power_settings_are_start_up_errors() -> None:
    for flag, text, message in (
            ("--power-model", "cpu=10", "--power-model: cpu='10' is not IDLE_W:BUSY_W"),
            ("--power-sources", "cpu=watts", "source 'watts' is unknown")):
        done = subprocess.run([sys.executable, "-m", "service", "serve", flag, text, "--port",
                               str(free_port()), "--socket", "", "--metrics-port", "0"], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and message in done.stderr, done.stderr
