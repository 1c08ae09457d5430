"""One model version's settings, parsed and validated once from its config.pbtxt: what it takes
and returns (ModelSpec), its queue policy and batching, its batch buckets, where it runs
(devices, engine instances, routing), its engines' options and its warm-up (model_warmup,
through service/core/warmup.py). A load reads the config only here; the configuration the daemon
reports back is rendered from these settings.

hetserve's own choices sit under `parameters` (string values):

    devices            the engines and devices, in preference order (accelerators/engine_factory)
    policy             prefer | latency | efficiency (service/core/ranking.py)
    prefer_order       measured | strict
    latency_budget_ms  the batch latency a device must meet (default 100)
    batch_buckets      auto | on | off (service/core/buckets.py)
    opencl_shapes      request shapes whose plans the OpenCL engine keeps (variable dims)
    queue_delay_when_idle  true | false (docs/serving.md)

and the engines' options as Triton's onnxruntime backend reads them
(service/core/engine_settings.py)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tritonclient.grpc import model_config_pb2

from accelerators.engine_factory import DEFAULT_DEVICES, DeviceSpec, parse_devices
from accelerators.engine_options import EngineOptions, OptionError
from service import contract
from service.core.buckets import AUTO_KINDS, Buckets
from service.core.engine_settings import parse_engine_options
from service.core.model import ModelSpec
from service.core.queue_policy import BatchPolicy, QueuePolicy
from service.core.ranking import POLICIES, PREFER_ORDERS
from service.core.warmup import WarmupBatch, warmup_batches
from service.errors import ConfigError

_Group = model_config_pb2.ModelInstanceGroup
_GROUP_KINDS = {"cpu": _Group.KIND_CPU, "gpu": _Group.KIND_GPU}
_REJECT = model_config_pb2.ModelQueuePolicy.REJECT
MAX_QUEUE_DELAY_US = 10_000_000
BUCKET_MODES = ("auto", "on", "off")
DEFAULT_LATENCY_BUDGET_MS = 100


@dataclass(frozen=True)
class InstanceGroups:
    """instance_group as Triton reads it: engine instances per device kind."""

    groups: tuple[tuple[int, int], ...]  # (kind, count), in order

    @classmethod
    def parse(cls, config: model_config_pb2.ModelConfig) -> InstanceGroups:
        for group in config.instance_group:
            if group.count < 0:
                raise ConfigError(f"model {config.name!r}: instance_group count {group.count} "
                                  "is negative; expected 1 or more engine instances")
        return cls(tuple((group.kind, group.count) for group in config.instance_group))

    def count(self, kind: str) -> int:
        """Engine instances per device of `kind` ("cpu", "gpu", "fpga"; "" while unknown): the
        count of the first group of that kind (KIND_AUTO: any kind), else 1."""
        wanted = _GROUP_KINDS.get(kind)
        return next((max(1, count) for group_kind, count in self.groups
                     if group_kind in (_Group.KIND_AUTO, wanted)), 1)  # unset count: 1


@dataclass(frozen=True)
class Placement:
    """Where the model runs and how a batch picks its device."""

    devices: tuple[DeviceSpec, ...]  # configured order; `onnxruntime` as one device per GPU
    instances: InstanceGroups
    policy: str  # ranking policy (POLICIES)
    prefer_order: str  # PREFER_ORDERS
    latency_budget_s: float


@dataclass(frozen=True)
class ModelSettings:
    spec: ModelSpec  # inputs, outputs, max_batch_size, labels; per-request validation
    batching: BatchPolicy  # dynamic_batching and the queue policies
    buckets: Buckets | None  # None: the model has no batch axis
    bucket_mode: str  # BUCKET_MODES: which device kinds batch by buckets
    placement: Placement
    engine: EngineOptions
    opencl_shapes: int | None  # None: the OpenCL engine's default
    warmup: tuple[WarmupBatch, ...]

    @classmethod
    def parse(cls, config: model_config_pb2.ModelConfig, version: int, folder: Path, *,
              max_queue_size: int, node_gpus: int,
              labels: dict[str, tuple[str, ...]] | None = None) -> ModelSettings:
        """The settings of `config` (read from the model's `folder`, where its warm-up data
        lies) on a node with `node_gpus` GPUs; `max_queue_size` is the daemon's default queue
        bound. ConfigError names the field, the value and what was expected."""
        spec = ModelSpec.from_config(config, version, labels)
        name = spec.name
        params = {k: v.string_value.strip() for k, v in config.parameters.items()}
        policy = _choice(name, params, "policy", "prefer", POLICIES)
        prefer_order = _choice(name, params, "prefer_order", "measured", PREFER_ORDERS)
        budget_s = _budget_s(name, params)
        model_buckets = parse_buckets(config)
        bucket_mode = _choice(name, params, "batch_buckets", "auto", BUCKET_MODES)
        warmup = tuple(warmup_batches(spec, model_buckets, folder))
        try:
            engine = parse_engine_options(config)
        except OptionError as e:
            raise ConfigError(f"model {name!r}: {e}") from e
        placement = Placement(
            _devices(config, params.get("devices", DEFAULT_DEVICES), node_gpus),
            InstanceGroups.parse(config), policy, prefer_order, budget_s)
        return cls(spec, parse_batch_policy(config, max_queue_size), model_buckets, bucket_mode,
                   placement, engine, _opencl_shapes(name, params), warmup)

    def buckets_for(self, kind: str) -> Buckets | None:
        """The buckets a device of `kind` batches by, as `batch_buckets` says; None: any size."""
        mode = self.bucket_mode
        bucketed = self.buckets if mode == "on" or (mode == "auto" and kind in AUTO_KINDS) \
            else None
        if self.engine.cuda_graphs and bucketed is None and kind == "gpu":
            raise ConfigError(f"model {self.spec.name!r}: optimization.cuda.graphs needs fixed "
                              "batch shapes: batch_buckets 'auto' or 'on' and max_batch_size > 0")
        return bucketed

    def effective_config(self, devices: Iterable[str]) -> model_config_pb2.ModelConfig:
        """The configuration the daemon reports (ModelConfig): config.pbtxt with the defaults
        these settings filled in, served on `devices` (those that passed the warm-up)."""
        config = model_config_pb2.ModelConfig()
        config.CopyFrom(self.spec.config)
        _fill_batching(config, self.batching)
        place = self.placement
        for key, value in (("devices", ", ".join(devices)), ("policy", place.policy),
                           ("prefer_order", place.prefer_order),
                           ("latency_budget_ms", f"{place.latency_budget_s * 1e3:g}"),
                           ("batch_buckets", self.bucket_mode)):
            config.parameters[key].string_value = value
        return config


def parse_batch_policy(config: model_config_pb2.ModelConfig,
                       default_max_queue_size: int) -> BatchPolicy:
    """`dynamic_batching` and `queue_delay_when_idle`; `default_max_queue_size` bounds the
    queues whose policy sets no max_queue_size."""
    dyn = config.dynamic_batching
    batching = config.HasField("dynamic_batching") and config.max_batch_size > 0
    if dyn.max_queue_delay_microseconds > MAX_QUEUE_DELAY_US:
        raise ConfigError(
            f"model {config.name!r}: dynamic_batching.max_queue_delay_microseconds "
            f"{dyn.max_queue_delay_microseconds} is above {MAX_QUEUE_DELAY_US} (10 s); a "
            "batching window is a few milliseconds at most")
    key = "queue_delay_when_idle"
    when_idle = config.parameters[key].string_value if key in config.parameters else "false"
    if when_idle not in ("true", "false"):
        raise ConfigError(f"model {config.name!r}: parameters[{key!r}] "
                          f"{when_idle!r}; expected 'true' or 'false'")
    count = max(dyn.priority_levels, 1)
    default = _queue_policy(dyn.default_queue_policy, default_max_queue_size)
    levels = tuple(
        _queue_policy(dyn.priority_queue_policy[level], default_max_queue_size)
        if level in dyn.priority_queue_policy else default for level in range(1, count + 1))
    default_priority = dyn.default_priority_level or (count + 1) // 2
    return BatchPolicy(max_batch_size=config.max_batch_size, batching=batching,
                       max_queue_delay_s=dyn.max_queue_delay_microseconds / 1e6
                       if batching else 0.0,
                       delay_when_idle=when_idle == "true",
                       preferred_batch_sizes=tuple(dyn.preferred_batch_size) if batching else (),
                       default_priority=min(default_priority, count), levels=levels,
                       default_queue=default)


def _queue_policy(policy: model_config_pb2.ModelQueuePolicy,
                  default_max_queue_size: int) -> QueuePolicy:
    return QueuePolicy(max_queue_size=policy.max_queue_size or default_max_queue_size,
                       timeout_s=policy.default_timeout_microseconds / 1e6,
                       reject_on_timeout=policy.timeout_action == _REJECT,
                       allow_timeout_override=policy.allow_timeout_override)


def _fill_batching(config: model_config_pb2.ModelConfig, policy: BatchPolicy) -> None:
    """Writes the defaults `policy` filled in into `config`'s dynamic_batching, if it has one."""
    if not config.HasField("dynamic_batching"):
        return
    dyn = config.dynamic_batching
    if dyn.priority_levels:
        dyn.default_priority_level = policy.default_priority
    dyn.default_queue_policy.max_queue_size = policy.default_queue.max_queue_size
    for level, queue in dyn.priority_queue_policy.items():
        if 1 <= level <= len(policy.levels):
            queue.max_queue_size = policy.levels[level - 1].max_queue_size


def parse_buckets(config: model_config_pb2.ModelConfig) -> Buckets | None:
    """The model's buckets; None for a model without a batch axis (max_batch_size 0)."""
    limit = config.max_batch_size
    if limit <= 0:
        return None
    preferred = sorted(set(config.dynamic_batching.preferred_batch_size))
    bad = [p for p in preferred if not 1 <= p <= limit]
    if bad:
        raise ConfigError(
            f"model {config.name!r}: dynamic_batching.preferred_batch_size {bad[0]} is "
            f"outside what max_batch_size {limit} allows; accepted values are 1 to {limit}")
    return Buckets(contract.batch_buckets(limit, preferred))


def _choice(model: str, params: dict[str, str], key: str, default: str,
            accepted: tuple[str, ...]) -> str:
    value = params.get(key, default)
    if value not in accepted:
        raise ConfigError(f"model {model!r}: parameters.{key}: {value!r} is unknown; "
                          f"expected one of {list(accepted)}")
    return value


def _budget_s(model: str, params: dict[str, str]) -> float:
    text = params.get("latency_budget_ms", str(DEFAULT_LATENCY_BUDGET_MS))
    try:
        budget = float(text)
    except ValueError:
        budget = -1.0
    if not budget > 0:
        raise ConfigError(f"model {model!r}: parameters.latency_budget_ms: {text!r} is not "
                          "a positive number of milliseconds")
    return budget / 1e3


def _opencl_shapes(model: str, params: dict[str, str]) -> int | None:
    text = params.get("opencl_shapes", "")
    if text and not (text.isdigit() and int(text) > 0):
        raise ConfigError(f"model {model!r}: parameters.opencl_shapes: {text!r} is not a "
                          "positive number of request shapes")
    return int(text) if text else None


def _devices(config: model_config_pb2.ModelConfig, text: str,
             node_gpus: int) -> tuple[DeviceSpec, ...]:
    """The `devices` parameter, where `onnxruntime` (its best device) becomes `onnxruntime:gpuN`
    for each GPU the model's instance_group allows (every GPU of the node by default)."""
    try:
        devices = parse_devices(text)
    except ValueError as e:
        raise ConfigError(f"model {config.name!r}: parameters.devices: {e}") from e
    gpus = _gpus(config, node_gpus)  # checks the indexes even where no GPU is used
    out: list[DeviceSpec] = []
    for device in devices:
        if device.engine == "onnxruntime" and not device.device and node_gpus:
            out += [DeviceSpec("onnxruntime", f"gpu{i}") for i in gpus]
        else:
            out.append(device)
    return tuple(out)


def _gpus(config: model_config_pb2.ModelConfig, node_gpus: int) -> list[int]:
    """The GPUs the model's instances run on, as Triton reads instance_group: the `gpus` of its
    KIND_GPU (or KIND_AUTO) groups, every GPU of the node where no group lists any."""
    listed = []
    for i, group in enumerate(config.instance_group):
        for gpu in group.gpus:
            if not 0 <= gpu < node_gpus:
                raise ConfigError(
                    f"model {config.name!r}: instance_group[{i}].gpus: GPU {gpu} is not on "
                    f"this node; accepted GPU indexes: {list(range(node_gpus))}")
            if group.kind in (_Group.KIND_GPU, _Group.KIND_AUTO) and gpu not in listed:
                listed.append(gpu)
    return listed or list(range(node_gpus))
