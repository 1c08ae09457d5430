"""Exposes the device meters at scrape time from their last samples: reading sensors is the
power monitor thread's job, so a scrape never waits on hardware."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from accelerators.power.meter import PowerMonitor

_DEVICE = ["device", "kind"]
_SOURCE = ["device", "kind", "source"]


class PowerCollector(Collector):
    def __init__(self, monitor: PowerMonitor) -> None:
        self._monitor = monitor

    def collect(self) -> Iterator[Metric]:
        energy = CounterMetricFamily(
            "hetserve_device_energy_joules",
            "Energy a device drew; source says where it came from (model: an estimate)",
            labels=_SOURCE)
        power = GaugeMetricFamily(
            "hetserve_device_power_watts", "Power a device drew at the last sample",
            labels=_SOURCE)
        busy = CounterMetricFamily(
            "hetserve_device_busy_seconds", "Time a device spent running batches",
            labels=_DEVICE)
        up = GaugeMetricFamily(
            "hetserve_device_up", "1 when the device's power source answered its last sample",
            labels=_DEVICE)
        models = CounterMetricFamily(
            "hetserve_model_energy_joules",
            "A device's energy charged to a model's batches (their run time at the device's "
            "full-load watts): the sum of its responses' energy_joules",
            labels=["model", *_SOURCE])
        engines = CounterMetricFamily(
            "hetserve_engine_energy_joules",
            "A device's energy charged to the batches of each engine running on it (two can "
            "share a GPU)", labels=["engine", *_SOURCE])
        for meter in self._monitor.meters():
            r = meter.read()
            device = [r.device.name, r.device.kind_label]
            source = [*device, r.source]
            energy.add_metric(source, r.energy_j)
            power.add_metric(source, r.power_w)
            busy.add_metric(device, r.busy_s)
            up.add_metric(device, 1.0 if r.up else 0.0)
            for model, joules in sorted(r.model_energy_j.items()):
                models.add_metric([model, *source], joules)
            for engine, joules in sorted(r.engine_energy_j.items()):
                engines.add_metric([engine, *source], joules)
        yield from (energy, power, busy, up, models, engines)
