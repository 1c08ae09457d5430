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


class InflightLimit:
    def __init__(self, per_caller: int) -> None:
        self.per_caller = per_caller
        self._held: Counter[str] = Counter()

    def enter(self, caller: str, anonymous: bool) -> str:
        """Counts one more request of `caller`; the key to `leave` with ("" for a call that
        came through no door, which is not counted). LimitError, naming the flag, beyond it."""
        key = ANONYMOUS if anonymous else caller
        if not key:
            return ""
        if self._held[key] >= self.per_caller:
            raise LimitError(
                f"requests in flight from {key}: {self._held[key]}, the most "
                "--max-rpcs-per-caller allows at this daemon process; wait for replies "
                "before sending more")
        self._held[key] += 1
        return key

    def leave(self, key: str) -> None:
        if not key:
            return
        self._held[key] -= 1
        if not self._held[key]:
            del self._held[key]
