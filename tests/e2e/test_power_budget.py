"""The node power budget against a real daemon with two devices of different speeds and power
(the faulty test engine; the `model` estimate gives each its watts): a fast, hungry `gpu0` and a
slow, frugal `fpga0`, preferred in that order, under saturating low-priority load and a trickle
of high-priority requests. Bad budgets are start-up errors."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc.aio as aioclient

from tests.support.daemon import MODEL, ROOT, image_input
from tests.support.metrics import scrape, total

POWER = ["--power-sources", "gpu=model,fpga=model",
         "--power-model", "gpu0=10:100,fpga0=5:25"]  # idle:busy watts
BATCHING = "max_queue_delay_microseconds: 1000 priority_levels: 2 default_priority_level: 2"
LATENCY_BUDGET_MS = 250  # the model's; the test client shares 2 busy cores
BUDGET_W = 50.0  # the frugal device flat out and the other idle: 35 W; the hungry one: 105 W
SECONDS = 10.0
TOLERANCE = 0.1  # scrapes fall up to a sampling interval (0.25 s) from the samples they show


def _load(daemon, image: np.ndarray) -> tuple[float, list[float]]:
    """Node watts over SECONDS of saturating low-priority load (from the devices' energy
    counters), and the high-priority requests' latencies meanwhile."""
    async def main():
        async with aioclient.InferenceServerClient(daemon.url) as client:
            stop = asyncio.Event()
            high: list[float] = []

            async def flood() -> None:
                while not stop.is_set():
                    await client.infer(MODEL, image_input(image), priority=2)

            async def trickle() -> None:
                while not stop.is_set():
                    start = time.monotonic()
                    await client.infer(MODEL, image_input(image), priority=1)
                    high.append(time.monotonic() - start)
                    await asyncio.sleep(0.02)

            tasks = [asyncio.create_task(flood()) for _ in range(16)]
            tasks.append(asyncio.create_task(trickle()))
            await asyncio.sleep(1.0)  # past the first overshoot
            before, start = scrape(daemon.metrics_url), time.monotonic()
            await asyncio.sleep(SECONDS)
            after, end = scrape(daemon.metrics_url), time.monotonic()
            stop.set()
            await asyncio.gather(*tasks)
            joules = (total(after, "hetserve_device_energy_joules_total")
                      - total(before, "hetserve_device_energy_joules_total"))
            return joules / (end - start), high, after
    return asyncio.run(main())


def _start(serve, *flags: str):
    daemon, control = serve(8, BATCHING, *POWER, *flags, devices="faulty:gpu0,faulty:fpga0",
                            latency_budget_ms=str(LATENCY_BUDGET_MS))
    control.set(delays={"gpu0": 0.002, "fpga0": 0.008})
    return daemon


def test_the_node_stays_within_its_power_budget(serve, holdout) -> None:
    daemon = _start(serve, "--power-budget-w", str(BUDGET_W))
    watts, high, after = _load(daemon, holdout[0][:1])
    assert watts <= BUDGET_W * (1 + TOLERANCE), f"{watts:.1f} W over {BUDGET_W} W"
    assert watts >= 35.0 * (1 - TOLERANCE)  # at least the frugal device's work went on
    assert np.percentile(high, 99) < LATENCY_BUDGET_MS / 1e3, sorted(high)[-5:]
    assert total(after, "hetserve_power_budget_watts") == BUDGET_W
    assert total(after, "hetserve_power_throttled_seconds_total") > 0
    assert total(after, "hetserve_node_power_watts", source="model") > 0


def test_without_a_budget_the_hungry_device_runs_flat_out(serve, holdout) -> None:
    daemon = _start(serve)
    watts, high, after = _load(daemon, holdout[0][:1])
    assert watts > BUDGET_W * 1.5  # what the budget above held back
    assert np.percentile(high, 99) < LATENCY_BUDGET_MS / 1e3
    assert not any(k.startswith("hetserve_power_budget") for k in after)


@pytest.mark.parametrize("flags, message", [
    (["--power-budget-w", "0"], "--power-budget-w: 0 W received, expected watts above the node's "
                                "idle power"),
    (["--power-budget-w", "4", "--power-sources", "cpu=model", "--power-model", "cpu=5:20"],
     "--power-budget-w: 4 W is not above the node's idle power, 5.0 W (cpu0 5.0 W"),
    (["--power-budget-w", "100", "--power-sources", "cpu=model", "--power-model", "cpu=0:0"],
     "no power sensor and no estimate for cpu0: give each idle and busy watts with "
     "--power-model (e.g. --power-model cpu0=20:75)"),
])
def test_bad_budgets_are_start_up_errors(flags: list[str], message: str,
                                        tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "service", "serve", *flags, "--port", "0",
                           "--socket", str(tmp_path / "grpc.sock"), "--metrics-port", "0",
                           "--workers", "1"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and message in done.stderr, done.stderr
