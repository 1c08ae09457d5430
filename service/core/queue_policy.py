"""Batching and queueing rules of one model (config.pbtxt's `dynamic_batching`, as
service/core/model_settings.py reads it), and the per-request options (priority, timeout, gRPC
deadline) resolved against them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class QueuePolicy:
    """Triton's ModelQueuePolicy for one priority level."""

    max_queue_size: int  # samples waiting at this level before RESOURCE_EXHAUSTED
    timeout_s: float  # 0: requests wait as long as their client lets them
    reject_on_timeout: bool  # REJECT (DEADLINE_EXCEEDED) or DELAY (behind every other request)
    allow_timeout_override: bool  # a request may ask for a shorter timeout, never a longer one


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

# The part of a bound kept from any one caller (queue places, calls in progress), or from every
# unauthenticated TCP caller together for queue places: the others find room.
_RESERVE = 1 / 4


def callers_share(limit: int) -> int:
    """How much of `limit` one caller may hold (a bound of 3 keeps none from it)."""
    return limit - int(limit * _RESERVE)


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
