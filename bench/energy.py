"""Issue 26's figures, in one run:

1. Energy in every response: the daemon (one process, the example model on the null engine, so
   that the serving path is all its CPU does) at concurrency 64 with `--response-energy on` and
   `off`, alternating rounds: its CPU per answered request, and over the `on` rounds the sum of
   the responses' `energy_joules` against the increase of hetserve_model_energy_joules_total.
2. The power budget: two null-engine devices of fixed speeds with modelled powers, a fast,
   hungry `gpu0` (2 ms per batch, 10:100 W) and a slow, frugal `fpga0` (8 ms, 5:25 W), under
   saturating low-priority load (batches of at most 8, so that the devices, not this machine's
   CPU, set the pace) with `--power-budget-w` between their powers: node power (the
   devices' energy counters over the run) against the budget, and throughput against the
   frugal device's alone (no budget).

    .venv/bin/python -m bench.energy [--seconds 5] [--rounds 3] [--budget-seconds 30]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc.aio as aioclient

from accelerators import safe_files
from bench.serving import MODEL, model_repository, process_tree_cpu_s
from service import contract
from service.clients.top import fetch
from service.local_daemon import LocalDaemon, local_daemon

IMAGE = np.zeros((1, 1, 28, 28), np.float32)
BUDGET_DEVICES = {"gpu0": (0.002, "10:100"), "fpga0": (0.008, "5:25")}
BUDGET_W = 50.0


def _daemon(tmp: Path, name: str, models: Path, *flags: str
            ) -> contextlib.AbstractContextManager[LocalDaemon]:
    """One process (--workers 1) on the null engine."""
    return local_daemon(models, tmp / f"{name}-daemon", "--workers", "1", "--engine-modules",
                        "bench.null_engine", "--log-level", "WARNING", *flags)


async def _load(url: str, seconds: float, concurrency: int, priority: int = 0
                ) -> tuple[int, float]:
    """(answered requests, the sum of their energy_joules) of a closed loop."""
    async with aioclient.InferenceServerClient(url) as client:
        end, answered, joules = time.monotonic() + seconds, 0, 0.0

        async def loop() -> None:
            nonlocal answered, joules
            tensor = aioclient.InferInput("image", list(IMAGE.shape), "FP32")
            tensor.set_data_from_numpy(IMAGE)
            while time.monotonic() < end:
                result = await client.infer(MODEL, [tensor], priority=priority)
                parameters = result.get_response().parameters
                if contract.ENERGY_PARAMETER in parameters:
                    joules += parameters[contract.ENERGY_PARAMETER].double_param
                answered += 1

        await asyncio.gather(*(loop() for _ in range(concurrency)))
        return answered, joules


def response_energy(tmp: Path, seconds: float, rounds: int) -> dict:
    models = model_repository(tmp / "null", devices="null:cpu0")
    counter = "hetserve_model_energy_joules_total"
    with contextlib.ExitStack() as stack:
        daemons = {mode: stack.enter_context(_daemon(
            tmp, mode, models, "--response-energy", mode, "--power-sources", "cpu=model"))
            for mode in ("on", "off")}
        cpu = {mode: 0.0 for mode in daemons}
        answered = {mode: 0 for mode in daemons}
        joules = counted = 0.0
        for _ in range(rounds):
            for mode, daemon in daemons.items():
                before_j = fetch(daemon.metrics_url).total(counter)
                before_cpu = process_tree_cpu_s(daemon.pid)
                n, j = asyncio.run(_load(daemon.tcp_address, seconds, 64))
                cpu[mode] += process_tree_cpu_s(daemon.pid) - before_cpu
                answered[mode] += n
                if mode == "on":
                    joules += j
                    counted += fetch(daemon.metrics_url).total(counter) - before_j
    us = {mode: 1e6 * cpu[mode] / answered[mode] for mode in daemons}
    return {"cpu_us_on": us["on"], "cpu_us_off": us["off"], "cpu_ratio": us["on"] / us["off"],
            "requests_on": answered["on"], "joules_sum": joules, "joules_counter": counted,
            "joules_ratio": joules / counted if counted else float("nan")}


def power_budget(tmp: Path, seconds: float) -> dict:
    os.environ["NULL_ENGINE_BATCH_S"] = ",".join(f"{d}={s}" for d, (s, _) in
                                                 BUDGET_DEVICES.items())
    power = ["--power-sources", "gpu=model,fpga=model", "--power-model",
             ",".join(f"{d}={w}" for d, (_, w) in BUDGET_DEVICES.items())]

    def run(name: str, devices: str, *flags: str) -> dict:
        models = model_repository(tmp / name, devices=devices, latency_budget_ms="100")
        config = models / MODEL / "config.pbtxt"
        text = config.read_text().replace("max_batch_size: 128", "max_batch_size: 8")
        safe_files.write_file(config, text.replace(
            "dynamic_batching {", "dynamic_batching { priority_levels: 2 "
            "default_priority_level: 2"), flag=None)
        with _daemon(tmp, name, models, *power, *flags) as daemon:
            asyncio.run(_load(daemon.tcp_address, 1.0, 64, priority=2))  # past the overshoot
            before, start = fetch(daemon.metrics_url), time.monotonic()
            n, _ = asyncio.run(_load(daemon.tcp_address, seconds, 64, priority=2))
            after, wall = fetch(daemon.metrics_url), time.monotonic() - start
        energy = "hetserve_device_energy_joules_total"
        return {"rps": n / wall, "watts": (after.total(energy) - before.total(energy)) / wall}

    budgeted = run("budget", "null:gpu0,null:fpga0", "--power-budget-w", str(BUDGET_W))
    unbudgeted = run("free", "null:gpu0,null:fpga0")
    frugal = run("frugal", "null:fpga0")
    return {"budget_w": BUDGET_W, "watts": budgeted["watts"],
            "power_ratio": budgeted["watts"] / BUDGET_W, "rps": budgeted["rps"],
            "frugal_rps": frugal["rps"], "frugal_watts": frugal["watts"],
            "rps_ratio": budgeted["rps"] / frugal["rps"], "free_watts": unbudgeted["watts"],
            "free_rps": unbudgeted["rps"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="per round and mode")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget-seconds", type=float, default=30.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        energy = response_energy(Path(folder), args.seconds, args.rounds)
        budget = power_budget(Path(folder), args.budget_seconds)
    print(f"""| figure | value |
|---|---|
| daemon CPU per request, c64, energy parameters on / off | {energy['cpu_us_on']:.0f} / {energy['cpu_us_off']:.0f} µs = {energy['cpu_ratio']:.3f}x |
| Σ responses' energy_joules / model energy counter increase ({energy['requests_on']} requests) | {energy['joules_sum']:.3f} / {energy['joules_counter']:.3f} J = {energy['joules_ratio']:.6f} |
| node power under a {budget['budget_w']:g} W budget, {args.budget_seconds:g} s saturating | {budget['watts']:.1f} W = {budget['power_ratio']:.3f}x the budget (no budget: {budget['free_watts']:.1f} W) |
| throughput under the budget / the frugal device alone | {budget['rps']:.0f} / {budget['frugal_rps']:.0f} req/s = {budget['rps_ratio']:.2f}x (no budget: {budget['free_rps']:.0f} req/s) |""")  # noqa: E501


if __name__ == "__main__":
    main()
