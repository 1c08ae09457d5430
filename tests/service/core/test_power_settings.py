"""Power settings reach the daemon's metrics; bad ones stop it at start-up with a clear error."""

from __future__ import annotations

import subprocess
import sys

from service.local_daemon import free_port
from tests.support.daemon import ROOT


def test_bad_power_settings_are_start_up_errors() -> None:
    for flag, text, message in (
            ("--power-model", "cpu=10", "--power-model: cpu='10' is not IDLE_W:BUSY_W"),
            ("--power-sources", "cpu=watts", "source 'watts' is unknown")):
        done = subprocess.run([sys.executable, "-m", "service", "serve", flag, text, "--port",
                               str(free_port()), "--socket", "", "--metrics-port", "0"], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and message in done.stderr, done.stderr
