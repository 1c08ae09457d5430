"""Batching and queueing rules of one model, read from config.pbtxt's `dynamic_batching`, and the
per-request options (priority, timeout, gRPC deadline) resolved against them."""

from __future__ import annotations

from dataclasses import dataclass

from tritonclient.grpc import model_config_pb2

from service.errors import ConfigError

_REJECT = model_config_pb2.ModelQueuePolicy.REJECT
MAX_QUEUE_DELAY_US = 10_000_000
_WHEN_IDLE = "queue_delay_when_idle"


@dataclass(frozen=True)
class QueuePolicy:
    """Triton's ModelQueuePolicy for one priority level."""

    max_queue_size: int  # samples waiting at this level before RESOURCE_EXHAUSTED
    timeout_s: float  # 0: requests wait as long as their client lets them
    reject_on_timeout: bool  # REJECT (DEADLINE_EXCEEDED) or DELAY (behind every other request)
    allow_timeout_override: bool  # a request may ask for a shorter timeout, never a longer one

    @classmethod
    def from_config(cls, policy: model_config_pb2.ModelQueuePolicy,
                    default_max_queue_size: int) -> QueuePolicy:
        return cls(max_queue_size=policy.max_queue_size or default_max_queue_size,
                   timeout_s=policy.default_timeout_microseconds / 1e6,
                   reject_on_timeout=policy.timeout_action == _REJECT,
                   allow_timeout_override=policy.allow_timeout_override)


@dataclass(frozen=True)
class RequestOptions:
    """What a request asks for: tritonclient sends `priority` (1 is the highest, 0 the model's
    default) and `timeout` in µs as request parameters; `deadline` is the gRPC deadline as a
    `time.monotonic()` instant. `caller` is whose queue places it takes (a uid, the token's
    holders, a remote address; "" where none is known), `anonymous` true for an
    unauthenticated TCP caller."""

    priority: int = 0
    timeout_us: int = 0
    deadline: float | None = None
    caller: str = ""
    anonymous: bool = False


DEFAULT_OPTIONS = RequestOptions()


@dataclass(frozen=True)
class BatchPolicy:
    max_batch_size: int  # 0: the model has no batch axis, so every request runs alone
    batching: bool  # false without dynamic_batching: each request runs on its own
    max_queue_delay_s: float
    # The window also while every instance is idle (the `queue_delay_when_idle` parameter):
    # off by default, so that a request to an idle device runs at once.
    delay_when_idle: bool
    preferred_batch_sizes: tuple[int, ...]
    default_priority: int  # 1-based level
    levels: tuple[QueuePolicy, ...]  # index 0 is priority level 1, the highest
    default_queue: QueuePolicy

    @classmethod
    def from_config(cls, config: model_config_pb2.ModelConfig,
                    default_max_queue_size: int) -> BatchPolicy:
        dyn = config.dynamic_batching
        batching = config.HasField("dynamic_batching") and config.max_batch_size > 0
        if dyn.max_queue_delay_microseconds > MAX_QUEUE_DELAY_US:
            raise ConfigError(
                f"model {config.name!r}: dynamic_batching.max_queue_delay_microseconds "
                f"{dyn.max_queue_delay_microseconds} is above {MAX_QUEUE_DELAY_US} (10 s); a "
                "batching window is a few milliseconds at most")
        when_idle = config.parameters[_WHEN_IDLE].string_value \
            if _WHEN_IDLE in config.parameters else "false"
        if when_idle not in ("true", "false"):
            raise ConfigError(f"model {config.name!r}: parameters[{_WHEN_IDLE!r}] "
                              f"{when_idle!r}; expected 'true' or 'false'")
        count = max(dyn.priority_levels, 1)
        default = QueuePolicy.from_config(dyn.default_queue_policy, default_max_queue_size)
        levels = tuple(
            QueuePolicy.from_config(dyn.priority_queue_policy[level], default_max_queue_size)
            if level in dyn.priority_queue_policy else default for level in range(1, count + 1))
        default_priority = dyn.default_priority_level or (count + 1) // 2
        return cls(max_batch_size=config.max_batch_size, batching=batching,
                   max_queue_delay_s=dyn.max_queue_delay_microseconds / 1e6 if batching else 0.0,
                   delay_when_idle=when_idle == "true",
                   preferred_batch_sizes=tuple(dyn.preferred_batch_size) if batching else (),
                   default_priority=min(default_priority, count), levels=levels,
                   default_queue=default)

    @property
    def dispatch_size(self) -> int:
        """Samples at which a batch leaves without waiting for the window to close."""
        return max(self.preferred_batch_sizes, default=self.max_batch_size) or 1

    def level(self, priority: int) -> int:
        """0-based queue index. Like Triton, 0 or a level the model lacks means the default."""
        if not 1 <= priority <= len(self.levels):
            priority = self.default_priority
        return priority - 1

    def timeout_s(self, level: int, timeout_us: int) -> float:
        """The queue timeout of a request: the level's, or a shorter one it asked for."""
        queue = self.levels[level]
        if queue.allow_timeout_override and timeout_us > 0:
            asked = timeout_us / 1e6
            return min(asked, queue.timeout_s) if queue.timeout_s else asked
        return queue.timeout_s

    def effective(self, config: model_config_pb2.ModelConfig) -> None:
        """Writes the defaults this policy filled in back into `config` (for ModelConfig)."""
        if not config.HasField("dynamic_batching"):
            return
        dyn = config.dynamic_batching
        if dyn.priority_levels:
            dyn.default_priority_level = self.default_priority
        dyn.default_queue_policy.max_queue_size = self.default_queue.max_queue_size
        for level, policy in dyn.priority_queue_policy.items():
            if 1 <= level <= len(self.levels):
                policy.max_queue_size = self.levels[level - 1].max_queue_size
