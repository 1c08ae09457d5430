"""Chooses each device's power source from settings, or finds one: RAPL for CPUs, NVML for
GPUs, XRT then OPAE for FPGAs. Where none can be read the `model` estimate stands in, and says
why. Settings name a device (`cpu0`) or a kind (`cpu`); the device wins.

    power_sources: "gpu0=nvml:0,fpga0=hwmon:/sys/class/hwmon/hwmon3,cpu=model"
    power_model:   "cpu=10:65,fpga0=20:75"   (idle watts : busy watts)

Without a configured figure the CPU estimate scales with the CPUs this process may use (see
`cpu_model_watts`); GPUs and FPGAs get the placeholders of DEFAULT_MODEL_WATTS; an emulated
FPGA gets what it adds to the estimate of the CPU it runs on, and no FPGA sensor or placeholder.
Either way the source is `model`: an estimate, never a measurement.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from accelerators.engine import Device, parse_device_name
from accelerators.power.hwmon import hwmon_source
from accelerators.power.model import ModelEstimate
from accelerators.power.nvml import NvmlSource
from accelerators.power.opae import OpaeSource
from accelerators.power.rapl import RaplSource
from accelerators.power.source import PowerSource, SourceError
from accelerators.power.xrt import XrtSource

log = logging.getLogger(__name__)

# Typical boards' idle and busy watts (a GPU, an FPGA card): the estimate where no sensor reads
# and --power-model says nothing; marked `model` wherever shown, never taken for a reading.
DEFAULT_MODEL_WATTS = "gpu=30:250,fpga=20:75"
# Per logical CPU, plus the package's uncore: current server parts draw 4-9 W per core at full
# load (TDP / cores: EPYC 9354 8.8, Xeon 8480+ 6.3, EPYC 9654 3.8), i.e. ~3 W per SMT thread.
CPU_WATTS = {"idle": (10.0, 1.0), "busy": (20.0, 3.0)}  # (fixed, per logical CPU)


def cpu_model_watts(cpus: int | None = None) -> tuple[float, float]:
    """(idle, busy) watts of the CPU estimate for `cpus` logical CPUs (this process's by
    default): 2 CPUs 12:26 W, 32 CPUs (16 cores with SMT) 42:116 W."""
    cpus = cpus or len(os.sched_getaffinity(0))
    (idle_fixed, idle_per_cpu), (busy_fixed, busy_per_cpu) = CPU_WATTS["idle"], CPU_WATTS["busy"]
    return idle_fixed + idle_per_cpu * cpus, busy_fixed + busy_per_cpu * cpus

SENSORS: dict[str, Callable[[str], PowerSource]] = {
    "rapl": lambda arg: RaplSource(),
    "nvml": lambda arg: NvmlSource(int(arg or 0)),
    "hwmon": lambda arg: hwmon_source(arg),
    "xrt": lambda arg: XrtSource(arg),
    "opae": lambda arg: OpaeSource(arg),
}
AUTO = {"cpu": ["rapl"], "gpu": ["nvml"], "fpga": ["xrt", "opae"]}


def parse_map(text: str, setting: str) -> dict[str, str]:
    """`key=value,key=value` into a dict, with an error naming the setting and the entry."""
    out = {}
    for entry in filter(None, (e.strip() for e in text.split(","))):
        key, sep, value = entry.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{setting}: entry {entry!r} is not DEVICE=VALUE")
        out[key.strip()] = value.strip()
    return out


def parse_watts(text: str) -> dict[str, tuple[float, float]]:
    out = {}
    for key, value in parse_map(text, "power_model").items():
        idle, sep, busy = value.partition(":")
        try:
            out[key] = (float(idle), float(busy))
        except ValueError:
            sep = ""
        if not sep:
            raise ValueError(f"power_model: {key}={value!r} is not IDLE_W:BUSY_W, e.g. 10:65")
        if not 0 <= out[key][0] <= out[key][1]:
            raise ValueError(f"power_model: {key}={value!r}: expected 0 <= idle watts <= busy "
                             "watts, e.g. 10:65")
    return out


class SourcePicker:
    def __init__(self, sources: str = "", model_watts: str = DEFAULT_MODEL_WATTS) -> None:
        self.sources = parse_map(sources, "power_sources")
        for key, spec in self.sources.items():
            name = spec.partition(":")[0]
            if name not in (*SENSORS, "model", "auto"):
                raise ValueError(f"power_sources: {key}={spec!r}: source {name!r} is unknown; "
                                 f"expected one of {[*SENSORS, 'model', 'auto']}")
        self.watts = parse_watts(model_watts)

    def pick(self, device: Device) -> PowerSource:
        if device.emulated:
            return self._emulated(device)
        if device.engine == "simulated":  # it stands for a device and uses no real one's power
            return ModelEstimate(0.0, 0.0, "a simulated device: no watts of its own",
                                 priced=False)
        spec = self.sources.get(device.name) or self.sources.get(device.kind) or "auto"
        name, _, arg = spec.partition(":")
        if name == "model":
            return self._estimate(device, "configured")
        if name == "auto":
            tries = [(s, _index(device) if s == "nvml" else "") for s in AUTO.get(device.kind, [])]
        else:
            tries = [(name, arg)]
        reasons = []
        for sensor, sensor_arg in tries:
            try:
                source = SENSORS[sensor](sensor_arg)
                log.info("%s: power from %s", device.name, source.describe())
                return source
            except (SourceError, ValueError) as e:
                reasons.append(str(e))
        if name != "auto":
            log.error("%s: configured power source %r cannot be read: %s", device.name, spec,
                      "; ".join(reasons))
        return self._estimate(device, "; ".join(reasons) or f"no sensor known for {device.kind}")

    def _estimate(self, device: Device, reason: str) -> ModelEstimate:
        idle, busy = (self.watts.get(device.name) or self.watts.get(device.kind)
                      or parse_watts(DEFAULT_MODEL_WATTS).get(device.kind)
                      or (cpu_model_watts() if device.kind == "cpu" else (0.0, 0.0)))
        estimate = ModelEstimate(idle, busy, reason)
        log.warning("%s: no power sensor, using the %s", device.name, estimate.describe())
        return estimate


    def _emulated(self, device: Device) -> ModelEstimate:
        """An emulator runs on the host's CPU: no board sensor speaks for it and no FPGA
        placeholder applies. Figures configured for it (by its name or `fpga-emulator`) price
        it; without them its energy is what running it adds to the host CPU's estimate (no
        idle watts of its own), which routing by energy must not take for an FPGA's."""
        watts = self.watts.get(device.name) or self.watts.get(device.kind_label)
        if watts is not None:
            return ModelEstimate(*watts, "an emulated FPGA, configured")
        log.warning("%s is an emulated FPGA: its energy is the host CPU's estimated added watts, "
                    "and routing by energy ranks it last (--power-model %s=IDLE_W:BUSY_W prices "
                    "it)", device.name, device.kind_label)
        idle, busy = cpu_model_watts()  # the CPU's idle watts are cpu0's: not counted twice
        return ModelEstimate(0.0, busy - idle, "an emulated FPGA: the host CPU's added watts",
                             priced=False)


def _index(device: Device) -> str:
    parsed = parse_device_name(device.name)
    return str(parsed[1]) if parsed else "0"
