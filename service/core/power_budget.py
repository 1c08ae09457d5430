"""The node's power budget (`--power-budget-w`): held as an energy account, so that the node's
power averages at most the budget over any stretch of sustained load.

After each power sample (the power monitor's thread, every BUDGET_SAMPLE_S) the account is
credited the budget's joules for the interval and debited what the node's devices drew (sensors,
or the `model` estimate: the exported source says which); it never banks more than it spent, so
idle time buys no burst. The deeper the account is in debt, the more the daemon gives up:

    stage 1  route every batch to the device with the fewest joules per inference that meets
             the model's latency budget (the router's `efficiency` order);
    stage 2  also hold back every priority level but the first (Spark's jobs ask for the
             lowest): their requests stay queued, within max_queue_size and their deadlines;
    stage 3  hold back every level.

Stages 2 and 3 start when the debt passes DEBT_STEP_S (then twice that) of the budget's energy;
as the account recovers, the held schedulers are woken.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge

from accelerators.power.meter import PowerMonitor
from accelerators.power.model import ModelEstimate

BUDGET_SAMPLE_S = 0.25  # between power samples while a budget is set
DEBT_STEP_S = 0.5


class PowerBudget:
    def __init__(self, budget_w: float, monitor: PowerMonitor,
                 registry: CollectorRegistry) -> None:
        self.budget_w = budget_w
        self.stage = 0
        self._monitor = monitor
        self._account_j = 0.0  # <= 0: the debt
        self._last: float | None = None
        self._wake: set[Callable[[], None]] = set()
        self._lock = threading.Lock()  # _wake: changed on the loop, read on the monitor's thread
        self._loop = asyncio.get_running_loop()
        Gauge("hetserve_power_budget_watts", "The node's power budget (--power-budget-w)",
              registry=registry).set(budget_w)
        self._node_power = Gauge(
            "hetserve_node_power_watts",
            "The node's devices' power the budget is held against, at the last sample; source "
            "lists where it came from (model: an estimate)", ["source"], registry=registry)
        self._throttled = Counter(
            "hetserve_power_throttled_seconds",
            "Time the node spent over its power budget: batches routed by energy and, deeper in "
            "debt, priority levels held back", registry=registry)
        self._stage = Gauge("hetserve_power_budget_stage",
                            "0: within the budget; 1: routing by energy; 2: low priority held; "
                            "3: all held", registry=registry)
        monitor.add_listener(self.account)

    @property
    def by_energy(self) -> bool:
        return self.stage >= 1

    def holds(self, level: int) -> bool:
        """Whether priority level `level` (0 the first) is held back now."""
        return self.stage >= 3 or (self.stage == 2 and level > 0)

    def subscribe(self, wake: Callable[[], None]) -> None:
        """`wake` (on the event loop) whenever fewer levels are held than before."""
        with self._lock:
            self._wake.add(wake)

    def unsubscribe(self, wake: Callable[[], None]) -> None:
        with self._lock:
            self._wake.discard(wake)

    def account(self, now: float) -> None:
        """After a power sample: the interval's budget in, the node's energy out."""
        readings = [m.read() for m in self._monitor.meters()]
        power = sum(r.power_w for r in readings)
        self._node_power.labels(",".join(sorted({r.source for r in readings}))).set(power)
        if self._last is not None:
            elapsed = now - self._last
            if self.stage:
                self._throttled.inc(elapsed)
            self._account_j = min(0.0, self._account_j + (self.budget_w - power) * elapsed)
        self._last = now
        debt_steps = -self._account_j / (self.budget_w * DEBT_STEP_S)
        stage = 0 if self._account_j >= 0 else 1 + min(2, int(debt_steps))
        lower, self.stage = stage < self.stage, stage
        self._stage.set(stage)
        if lower:
            with self._lock:
                wakes = list(self._wake)
            for wake in wakes:
                self._loop.call_soon_threadsafe(wake)


def check_budget(budget_w: float, monitor: PowerMonitor) -> None:
    """At start-up, with the models loaded: every device serving them needs a power figure, and
    the budget must lie above their idle power (a sensor's: its reading now); ValueError says
    which and how to fix it."""
    monitor.sample_all()
    meters = monitor.meters()
    unknown = [m.device.name for m in meters
               if isinstance(m.source, ModelEstimate) and m.source.busy_w == 0]
    if unknown:
        raise ValueError(
            f"power_budget_w: no power sensor and no estimate for {', '.join(unknown)}: give "
            f"each idle and busy watts with --power-model (e.g. --power-model "
            f"{unknown[0]}=20:75), or a sensor with --power-sources")
    idle = {m.device.name: m.idle_power_w() for m in meters}
    if budget_w <= sum(idle.values()):
        raise ValueError(
            f"power_budget_w: {budget_w:g} W is not above the node's idle power, "
            f"{sum(idle.values()):.1f} W (" + ", ".join(
                f"{name} {watts:.1f} W" for name, watts in sorted(idle.items())) + ")")
