"""The search space: a candidate config is the shipped one with its devices, engine instances
per device, queue delay and preferred batch sizes replaced. The sweep varies one of them at a
time around the best candidate so far (stages), so a few dozen points cover it instead of the
full grid."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from accelerators.engine_factory import DEFAULT_DEVICES, DeviceSpec, parse_devices
from service.core.model_settings import InstanceGroups

_Group = model_config_pb2.ModelInstanceGroup
# Queue delays tried (µs): no window, and windows up to a few ms; only those well under a p99
# bound are kept, since a request may wait the whole window.
QUEUE_DELAYS_US = (0, 100, 500, 2000)
# Preferred batch size sets tried (also the batch buckets of GPUs and FPGAs), cut to
# max_batch_size; () is none (a batch leaves at max_batch_size, buckets are powers of two).
PREFERRED_SETS = ((), (8,), (4, 16), (16, 64))
INSTANCES = {"cpu": (1, 2, 4), "gpu": (1, 2, 4), "fpga": (1, 2)}


@dataclass(frozen=True)
class Candidate:
    devices: str  # the model's `devices` parameter, e.g. "onnxruntime:cpu0"
    instances: int  # engine instances per device
    delay_us: int | None  # max_queue_delay_microseconds; None: no dynamic_batching block
    preferred: tuple[int, ...]  # preferred_batch_size

    def label(self) -> str:
        batching = ("no batching" if self.delay_us is None else
                    f"delay {self.delay_us} µs, preferred "
                    f"{','.join(map(str, self.preferred)) or 'none'}")
        return f"{self.devices} ×{self.instances}, {batching}"


def devices_of(config: model_config_pb2.ModelConfig) -> str:
    if "devices" in config.parameters and config.parameters["devices"].string_value:
        return config.parameters["devices"].string_value
    return DEFAULT_DEVICES


def _kinds(devices: str) -> set[str]:
    return {spec.kind for spec in parse_devices(devices)}


def shipped_candidate(config: model_config_pb2.ModelConfig, devices: str) -> Candidate:
    """The shipped config as a candidate; `devices` the list its daemon actually served."""
    kinds = _kinds(devices)
    groups = InstanceGroups.parse(config)
    instances = max((groups.count(kind) for kind in kinds), default=1)
    batching = config.HasField("dynamic_batching")
    return Candidate(devices, instances,
                     config.dynamic_batching.max_queue_delay_microseconds if batching else None,
                     tuple(sorted(config.dynamic_batching.preferred_batch_size)))


def render(config: model_config_pb2.ModelConfig, candidate: Candidate) -> str:
    """config.pbtxt text of the shipped config with the candidate's choices."""
    out = model_config_pb2.ModelConfig()
    out.CopyFrom(config)
    out.parameters["devices"].string_value = candidate.devices
    kinds = _kinds(candidate.devices)
    kind = {frozenset({"cpu"}): _Group.KIND_CPU,
            frozenset({"gpu"}): _Group.KIND_GPU}.get(frozenset(kinds), _Group.KIND_AUTO)
    del out.instance_group[:]
    out.instance_group.add(kind=kind, count=candidate.instances)
    if candidate.delay_us is None:
        out.ClearField("dynamic_batching")
    else:
        out.dynamic_batching.max_queue_delay_microseconds = candidate.delay_us
        del out.dynamic_batching.preferred_batch_size[:]
        out.dynamic_batching.preferred_batch_size.extend(candidate.preferred)
    return text_format.MessageToString(out)


# --- the stages: each varies one choice around the best candidate so far ------------------------

def device_stage(best: Candidate, devices: list[DeviceSpec]) -> list[Candidate]:
    """Each device alone, and all of them in the given order where they are distinct physical
    devices (two engines on one CPU only compete for its cores)."""
    out = [replace(best, devices=str(spec)) for spec in devices]
    if len(devices) > 1 and len({spec.device for spec in devices}) == len(devices):
        out.append(replace(best, devices=", ".join(map(str, devices))))
    return out


def instance_stage(best: Candidate) -> list[Candidate]:
    cpus = os.cpu_count() or 1
    counts = set()
    for kind in _kinds(best.devices) or {"cpu"}:
        counts |= {n for n in INSTANCES.get(kind, (1, 2))
                   if kind != "cpu" or n <= max(2, cpus)}
    return [replace(best, instances=n) for n in sorted(counts)]


def delay_stage(best: Candidate, p99_ms: float | None) -> list[Candidate]:
    limit_us = p99_ms * 1000 / 4 if p99_ms else float("inf")
    return [replace(best, delay_us=d) for d in QUEUE_DELAYS_US if d <= limit_us]


def preferred_stage(best: Candidate, max_batch_size: int) -> list[Candidate]:
    if max_batch_size <= 1:
        return []
    delay = 0 if best.delay_us is None else best.delay_us
    sets = dict.fromkeys(tuple(s for s in sizes if s <= max_batch_size)
                         for sizes in PREFERRED_SETS)
    return [replace(best, delay_us=delay, preferred=sizes) for sizes in sets]
