"""Energy of a load window from a daemon's Prometheus counters.

A daemon samples every power source once a second and its joules counters move only then, so two
scrapes at arbitrary times would count up to a second of idle power at either end. Instead the
window is cut at power samples: the counters are read until they move (every 20 ms, which bounds
the error at each end), then again about a second later, and so on until the window ends; the
energy between the first and the last move was drawn entirely under load."""

from __future__ import annotations

import time
from dataclasses import dataclass

from accelerators.power.meter import SAMPLE_S
from service.clients.top import Snapshot, fetch

_POLL_S = 0.02
JOULES = "hetserve_device_energy_joules_total"


@dataclass(frozen=True)
class EnergyWindow:
    joules: float  # every device the daemon meters
    seconds: float
    flops: float
    inferences: float
    sources: dict[str, str]  # device -> power source (`model`: an estimate)

    @property
    def watts(self) -> float:
        return self.joules / self.seconds

    @property
    def flops_per_inference(self) -> float | None:
        return self.flops / self.inferences if self.inferences else None


def sources(snapshot: Snapshot) -> dict[str, str]:
    return {dict(labels)["device"]: dict(labels)["source"] for labels in snapshot.series(JOULES)}


def watch(url: str, start: float, end: float) -> EnergyWindow | None:
    """The energy between the first and the last power sample that fall in [start, end]
    (time.monotonic()); None when fewer than two do (a window under about a second)."""
    time.sleep(max(0.0, start - time.monotonic()))
    moves: list[Snapshot] = []
    last = fetch(url).total(JOULES)
    while time.monotonic() < end:
        snapshot = fetch(url)
        joules = snapshot.total(JOULES)
        if joules == last:
            time.sleep(_POLL_S)
            continue
        moves.append(snapshot)
        last = joules
        # the next sample is about a second away: wait for most of it
        time.sleep(max(0.0, min(0.9 * SAMPLE_S, end - time.monotonic())))
    if len(moves) < 2:
        return None
    first, final = moves[0], moves[-1]
    return EnergyWindow(
        final.total(JOULES) - first.total(JOULES), final.time - first.time,
        final.total("hetserve_flops_total") - first.total("hetserve_flops_total"),
        final.total("hetserve_inferences_total") - first.total("hetserve_inferences_total"),
        sources(final))
