"""Inference requests in flight, bounded per caller in each daemon process: from the moment a
request is queued until its answer is done, over gRPC (a call, or each request of a stream) and
REST alike. Without it one local user could hold every call a listener takes (--max-rpcs-*) and
every place its share of the queues leaves, and the others would wait behind it. Callers are
those the queue counts (service/edge/door.py `Peers.queue_caller`); every caller over TCP without
a token shares one bound, as they share the queue."""

from __future__ import annotations

from collections import Counter

from service.errors import LimitError

ANONYMOUS = "callers over TCP without a token"


class CallerCounts:
    """How many of something each caller holds, at most `bound` each: the one bookkeeping of
    per-caller bounds on things held a while (requests in flight here, gRPC calls in progress in
    service/grpc/limits.py)."""

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self._held: Counter[str] = Counter()

    def held(self, caller: str) -> int:
        return self._held[caller]

    def take(self, caller: str) -> bool:
        """One more for `caller`; false, and nothing taken, at its bound."""
        if self._held[caller] >= self.bound:
            return False
        self._held[caller] += 1
        return True

    def give_back(self, caller: str) -> None:
        self._held[caller] -= 1
        if not self._held[caller]:
            del self._held[caller]


class InflightLimit:
    def __init__(self, per_caller: int) -> None:
        self._held = CallerCounts(per_caller)

    def enter(self, caller: str, anonymous: bool) -> str:
        """Counts one more request of `caller`; the key to `leave` with ("" for a call that
        came through no door, which is not counted). LimitError, naming the flag, beyond it."""
        key = ANONYMOUS if anonymous else caller
        if key and not self._held.take(key):
            raise LimitError(
                f"requests in flight from {key}: {self._held.held(key)}, the most "
                "--max-rpcs-per-caller allows at this daemon process; wait for replies "
                "before sending more")
        return key

    def leave(self, key: str) -> None:
        if key:
            self._held.give_back(key)
